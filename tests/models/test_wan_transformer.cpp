/* The native Wan transformer against diffusers' WanTransformer3DModel (tests/reference/dit:
 * wan_t2v_tiny, wan22_ti2v_tiny, wan21_i2v_tiny with its image path): outputs, input gradients and every parameter's gradient, with and
 * without gradient checkpointing and chunked attention; folders that must load (sharded, bf16) and
 * folders that must not; the flow-matching objective against finetrainers' numbers. */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <cmath>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/diffusers_folder.h"
#include "models/layers.h"
#include "models/native_model.h"
#include "models/wan_transformer.h"
#include "ref_cases.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::models;
using modeltest::RefFile;
using modeltest::rel_l2;
namespace fs = std::filesystem;

namespace {

std::string dit_dir(const std::string &name) { return vttest::reference_dir() + "/dit/" + name; }

struct CaseResult {
  double output = 1, grad_x = 1, grad_text = 0, grad_image = 0, worst_param = 0;
  std::string worst_name;
};

CaseResult run_case(DitModel &m, const RefFile &cases, const std::string &c, bool params) {
  for (auto &p : m.module().parameters()) p.mutable_grad() = at::Tensor();
  auto x = cases.get("input." + c + ".hidden_states").requires_grad_(true);
  auto text = cases.get("input." + c + ".encoder_hidden_states").requires_grad_(true);
  const std::string image_key = "input." + c + ".encoder_hidden_states_image";  // I2V cases only
  const auto image = cases.has(image_key) ? cases.get(image_key).requires_grad_(true) : at::Tensor();
  auto out = m.forward_image(x, cases.get("input." + c + ".timestep"), text, image);
  (out * cases.get("cotangent." + c)).sum().backward();
  CaseResult r;
  r.output = rel_l2(out.detach(), cases.get("output." + c));
  r.grad_x = rel_l2(x.grad(), cases.get("grad_input." + c + ".hidden_states"));
  if (params) {
    r.grad_text = rel_l2(text.grad(), cases.get("grad_input." + c + ".encoder_hidden_states"));
    if (cases.has("grad_input." + c + ".encoder_hidden_states_image"))
      r.grad_image = rel_l2(image.grad(), cases.get("grad_input." + c + ".encoder_hidden_states_image"));
    int n = 0;
    for (const auto &p : m.module().named_parameters(true)) {
      const double e = rel_l2(p.value().grad(), cases.get("grad." + c + "." + p.key()));
      if (e > r.worst_param) r.worst_param = e, r.worst_name = p.key();
      n++;
    }
    EXPECT_GT(n, 40);
  }
  return r;
}

void check_family(const std::string &name, Checkpointing checkpointing) {
  auto m = open_dit(dit_dir(name), torch::kCPU);
  m->set_checkpointing(checkpointing);
  RefFile cases("dit/" + name + "/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  const auto list = nlohmann::json::parse(cases.meta("cases"));
  ASSERT_EQ(list.size(), 3u);
  for (const auto &[c, info] : list.items()) {
    const bool params = info.value("parameter_gradients", false);
    const auto r = run_case(*m, cases, c, params);
    const std::string mode = checkpointing == Checkpointing::none ? "" : std::string(" (checkpointing ") + checkpointing_name(checkpointing) + ")";
    SCOPED_TRACE(name + "/" + c + mode);
    EXPECT_LT(r.output, 1e-5);
    EXPECT_LT(r.grad_x, 1e-5);
    if (params) {
      EXPECT_LT(r.grad_text, 1e-5);
      EXPECT_LT(r.worst_param, 1e-4) << r.worst_name;
    }
    std::printf("%s/%s%s: output %.2g, grad hidden_states %.2g%s\n", name.c_str(), c.c_str(), mode.c_str(), r.output, r.grad_x,
                params ? (", grad text " + std::to_string(r.grad_text) + ", worst parameter gradient " +
                          std::to_string(r.worst_param) + " (" + r.worst_name + ")").c_str()
                       : "");
  }
}

std::string tmp_dir(const std::string &tag) {
  auto d = fs::temp_directory_path() / ("vt-wan-" + tag + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

void copy_folder(const std::string &from, const std::string &to) {
  fs::create_directories(to);
  for (const char *f : {"config.json", "diffusion_pytorch_model.safetensors"}) fs::copy_file(from + "/" + f, to + "/" + f);
}

void edit_config(const std::string &dir, const std::function<void(nlohmann::json &)> &edit) {
  auto j = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  edit(j);
  std::ofstream(dir + "/config.json", std::ios::trunc) << j.dump(2);
}

std::string open_error(const std::string &dir) {
  try {
    open_dit(dir, torch::kCPU);
  } catch (const std::exception &e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(WanTransformer, MatchesDiffusersWan21) { check_family("wan_t2v_tiny", Checkpointing::none); }
TEST(WanTransformer, MatchesDiffusersWan22PerTokenTimesteps) { check_family("wan22_ti2v_tiny", Checkpointing::none); }
// Wan 2.1 I2V's layout: 12 input channels, the image embedder and attn2's image keys and values.
TEST(WanTransformer, MatchesDiffusersWan21I2V) { check_family("wan21_i2v_tiny", Checkpointing::none); }
// The same folder with the pipelines' 512 rows of text (tests/reference/wan_i2v/generate.py): only
// then does diffusers' processor split the image tokens off, so the image keys and values act.
TEST(WanTransformer, MatchesDiffusersWan21I2VImagePath) {
  auto m = open_dit(dit_dir("wan21_i2v_tiny"), torch::kCPU);
  RefFile cases("wan_i2v/text512_cases.safetensors");
  ASSERT_TRUE(cases.ok());
  for (const auto mode : {Checkpointing::none, Checkpointing::full, Checkpointing::selective}) {
    m->set_checkpointing(mode);
    const auto r = run_case(*m, cases, "b2_text512", true);
    SCOPED_TRACE(checkpointing_name(mode));
    EXPECT_LT(r.output, 1e-5);
    EXPECT_LT(r.grad_x, 1e-5);
    EXPECT_LT(r.grad_text, 1e-5);
    EXPECT_LT(r.grad_image, 1e-5);
    EXPECT_LT(r.worst_param, 1e-4) << r.worst_name;
    std::printf("wan21_i2v_tiny, 512 rows of text (%s): output %.2g, grad hidden_states %.2g, text %.2g, image %.2g, "
                "worst parameter gradient %.2g (%s)\n", checkpointing_name(mode), r.output, r.grad_x, r.grad_text,
                r.grad_image, r.worst_param, r.worst_name.c_str());
  }
  // The image path is live here: its keys' gradient is not zero.
  EXPECT_GT(m->module().named_parameters()["blocks.0.attn2.add_k_proj.weight"].grad().norm().item<double>(), 1.0);
}
TEST(WanTransformer, GradientCheckpointingGivesTheSameGradients) {
  check_family("wan_t2v_tiny", Checkpointing::full);
  check_family("wan22_ti2v_tiny", Checkpointing::full);
  check_family("wan21_i2v_tiny", Checkpointing::full);
}
TEST(WanTransformer, SelectiveCheckpointingGivesTheSameGradients) {
  check_family("wan_t2v_tiny", Checkpointing::selective);
  check_family("wan22_ti2v_tiny", Checkpointing::selective);
  check_family("wan21_i2v_tiny", Checkpointing::selective);
}

namespace {

// One forward and backward in `mode`: the output, then the inputs' and every parameter's gradients
// (by name) in a fixed order.
std::vector<std::pair<std::string, at::Tensor>> step_grads(DitModel &m, Checkpointing mode, const at::Tensor &x0,
                                                           const at::Tensor &t, const at::Tensor &text0,
                                                           const at::Tensor &cotangent) {
  m.set_checkpointing(mode);
  for (auto &p : m.module().parameters()) p.mutable_grad() = at::Tensor();
  auto x = x0.clone().requires_grad_(true), text = text0.clone().requires_grad_(true);
  auto out = m.forward(x, t, text);
  (out * cotangent).sum().backward();
  std::vector<std::pair<std::string, at::Tensor>> g{{"output", out.detach()}, {"hidden_states", x.grad()},
                                                    {"encoder_hidden_states", text.grad()}};
  for (const auto &p : m.module().named_parameters(true)) g.emplace_back(p.key(), p.value().grad());
  return g;
}

// selective == full bit for bit (the same ops; the gradients summed in the same order), and both
// equal no checkpointing to float rounding (relative L2 `tol`), for the output and every gradient.
void expect_modes_agree(DitModel &m, const at::Tensor &x, const at::Tensor &t, const at::Tensor &text, double tol) {
  torch::manual_seed(11);
  const auto cot = torch::randn(m.forward(x, t, text).sizes());
  const auto none = step_grads(m, Checkpointing::none, x, t, text, cot);
  const auto full = step_grads(m, Checkpointing::full, x, t, text, cot);
  const auto sel = step_grads(m, Checkpointing::selective, x, t, text, cot);
  ASSERT_EQ(none.size(), sel.size());
  double worst = 0;
  std::string worst_name;
  int exact = 0;
  for (size_t i = 0; i < none.size(); i++) {
    const auto &name = none[i].first;
    ASSERT_TRUE(sel[i].second.defined()) << name;
    exact += torch::equal(sel[i].second, full[i].second);
    EXPECT_TRUE(torch::equal(sel[i].second, full[i].second)) << name << ": selective differs from full by "
                                                              << rel_l2(sel[i].second, full[i].second);
    const double e = rel_l2(sel[i].second, none[i].second);
    EXPECT_LT(e, tol) << name;
    EXPECT_LT(rel_l2(full[i].second, none[i].second), tol) << name;
    if (e > worst) worst = e, worst_name = name;
  }
  std::printf("selective == full bit for bit in %d of %zu tensors; against no checkpointing at most %.2g (%s)\n",
              exact, none.size(), worst, worst_name.c_str());
}

// Wan's config at the 1.3B model's width (dim 1536, 12 heads, ffn 8960, text 4096), `layers` blocks.
std::string wan_real_width_config(int layers) {
  auto j = nlohmann::json::parse(std::ifstream(dit_dir("wan_t2v_tiny") + "/config.json"));
  j["attention_head_dim"] = 128;
  j["num_attention_heads"] = 12;
  j["ffn_dim"] = 8960;
  j["freq_dim"] = 256;
  j["text_dim"] = 4096;
  j["in_channels"] = 16;
  j["out_channels"] = 16;
  j["num_layers"] = layers;
  j["rope_max_seq_len"] = 1024;
  return j.dump();
}

}  // namespace

// Without reference data: each mode against the others on the tiny Wan 2.1 folder (batch 2, both
// timestep forms) and at the real width (one block, few tokens, so that it runs in seconds).
TEST(WanTransformer, SelectiveEqualsFullAndNoCheckpointing) {
  auto m = open_dit(dit_dir("wan_t2v_tiny"), torch::kCPU);
  torch::manual_seed(5);
  const auto x = torch::randn({2, 4, 3, 8, 12}), text = torch::randn({2, 7, 32});
  expect_modes_agree(*m, x, torch::tensor({300.0, 850.0}), text, 1e-6);
  auto m22 = open_dit(dit_dir("wan22_ti2v_tiny"), torch::kCPU);
  auto &net = dynamic_cast<WanTransformerImpl &>(m22->module());
  const auto x22 = torch::randn({2, net.cfg.in_channels, 2, 4, 6}), text22 = torch::randn({2, 5, net.cfg.text_dim});
  expect_modes_agree(*m22, x22, torch::rand({2, 12}) * 1000, text22, 1e-6);
  auto big = build_dit(wan_real_width_config(1), torch::kCPU);
  expect_modes_agree(*big, torch::randn({1, 16, 2, 8, 8}), torch::tensor({500.0}), torch::randn({1, 16, 4096}), 1e-6);
}

// The chunked attention (LibTorch 1.13's path, and the fallback) equals plain softmax attention in
// both passes, with chunks that do not divide the query count.
TEST(WanTransformer, ChunkedAttentionEqualsPlainAttention) {
  torch::manual_seed(3);
  auto q = torch::randn({2, 3, 37, 16}, torch::kDouble).requires_grad_(true);
  auto k = torch::randn({2, 3, 29, 16}, torch::kDouble).requires_grad_(true);
  auto v = torch::randn({2, 3, 29, 16}, torch::kDouble).requires_grad_(true);
  auto go = torch::randn({2, 3, 37, 16}, torch::kDouble);
  auto plain = torch::softmax(torch::matmul(q, k.transpose(-1, -2)) / 4.0, -1).matmul(v);
  auto gp = torch::autograd::grad({plain}, {q, k, v}, {go});
  auto chunked = chunked_attention(q, k, v, 5);
  auto gc = torch::autograd::grad({chunked}, {q, k, v}, {go});
  EXPECT_LT(rel_l2(chunked, plain), 1e-12);
  for (int i = 0; i < 3; i++) EXPECT_LT(rel_l2(gc[i], gp[i]), 1e-12) << i;
}

// attention-backend: math (our kernel) and auto give the same forward and gradients through the
// model; on LibTorch 2.2+ the CPU flash kernel too. Kernels this LibTorch or the CPU lacks are refused,
// saying what to use.
TEST(WanTransformer, AttentionBackendsAgreeAndUnavailableOnesAreNamed) {
  auto m = open_dit(dit_dir("wan_t2v_tiny"), torch::kCPU);
  torch::manual_seed(11);
  const auto x = torch::randn({2, 4, 3, 8, 12}), text = torch::randn({2, 7, 32}), t = torch::tensor({300.0, 850.0});
  auto run = [&](AttentionBackend b) {
    m->set_attention_backend(b);
    m->module().zero_grad();
    const auto out = m->forward(x, t, text);
    out.pow(2).mean().backward();
    std::vector<at::Tensor> r{out.detach().clone()};
    for (const auto &p : m->module().parameters()) r.push_back(p.grad().clone());
    return r;
  };
  const auto ref = run(AttentionBackend::math);
  std::vector<AttentionBackend> others{AttentionBackend::automatic};
  if (attention_backend_unavailable(AttentionBackend::flash, torch::kCPU, false).empty())
    others.push_back(AttentionBackend::flash);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  EXPECT_EQ(others.size(), 2u) << "LibTorch 2.2+ has a CPU flash kernel";
#endif
  for (AttentionBackend b : others) {
    const auto got = run(b);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LT(rel_l2(got[0], ref[0]), 1e-5) << attention_backend_name(b);
    for (size_t i = 1; i < got.size(); i++) EXPECT_LT(rel_l2(got[i], ref[i]), 1e-4) << attention_backend_name(b) << " grad " << i;
  }
  m->set_attention_backend(AttentionBackend::automatic);
  const std::string eff = attention_backend_unavailable(AttentionBackend::efficient, torch::kCPU, true);
  const std::string cud = attention_backend_unavailable(AttentionBackend::cudnn, torch::kCPU, true);
#if TORCH_VERSION_MAJOR >= 2
  EXPECT_NE(eff.find("attention-backend=efficient is a CUDA kernel"), std::string::npos) << eff;
  EXPECT_NE(attention_backend_unavailable(AttentionBackend::flash, c10::Device("cuda:0"), false).find("bf16"),
            std::string::npos);
#else
  EXPECT_NE(eff.find("needs LibTorch 2.x (this is 1."), std::string::npos) << eff;
  const std::string fl = attention_backend_unavailable(AttentionBackend::flash, torch::kCPU, false);
  EXPECT_NE(fl.find("use auto or math"), std::string::npos) << fl;
  EXPECT_THROW(attention(torch::randn({1, 1, 4, 8}), torch::randn({1, 1, 4, 8}), torch::randn({1, 1, 4, 8}), 0,
                         AttentionBackend::flash),
               std::runtime_error);
#endif
  EXPECT_FALSE(cud.empty());
  EXPECT_TRUE(attention_backend_unavailable(AttentionBackend::math, torch::kCPU, false).empty());
  AttentionBackend parsed;
  EXPECT_TRUE(parse_attention_backend("cudnn", &parsed));
  EXPECT_EQ(parsed, AttentionBackend::cudnn);
  EXPECT_FALSE(parse_attention_backend("xformers", &parsed));
}

// The exported folder (bf16, sharded with an index) reloads; its outputs equal the float32 model's
// to bf16 precision, and a float32 export reloads bit for bit.
TEST(WanTransformer, ShardedFolderRoundTrip) {
  auto m = open_dit(dit_dir("wan_t2v_tiny"), torch::kCPU);
  const std::string d32 = tmp_dir("f32"), d16 = tmp_dir("bf16");
  EXPECT_EQ(m->save(d32, torch::kFloat, 1 << 30), "diffusion_pytorch_model.safetensors");
  EXPECT_EQ(m->save(d16, torch::kBFloat16, 20000), "diffusion_pytorch_model.safetensors.index.json");
  int shards = 0;
  for (const auto &e : fs::directory_iterator(d16)) shards += e.path().filename().string().find("-of-") != std::string::npos;
  EXPECT_GE(shards, 3);
  RefFile cases("dit/wan_t2v_tiny/cases.safetensors");
  const std::string c = "b2_t3_h8_w12";
  torch::NoGradGuard ng;
  const auto x = cases.get("input." + c + ".hidden_states"), t = cases.get("input." + c + ".timestep"),
             text = cases.get("input." + c + ".encoder_hidden_states");
  const auto ref = m->forward(x, t, text);
  EXPECT_TRUE(torch::equal(open_dit(d32, torch::kCPU)->forward(x, t, text), ref));
  const double e16 = rel_l2(open_dit(d16, torch::kCPU)->forward(x, t, text), ref);
  EXPECT_LT(e16, 3e-2);
  EXPECT_GT(e16, 0.0);
  fs::remove_all(d32);
  fs::remove_all(d16);
}

TEST(WanTransformer, BadFoldersAreErrorsNamingWhatIsWrong) {
  const std::string base = tmp_dir("bad");
  auto fresh = [&](const std::string &tag) {
    const std::string d = base + "/" + tag;
    copy_folder(dit_dir("wan_t2v_tiny"), d);
    return d;
  };
  std::string d = fresh("class");
  edit_config(d, [](nlohmann::json &j) { j["_class_name"] = "CogVideoXTransformer3DModel"; });
  EXPECT_NE(open_error(d).find("CogVideoXTransformer3DModel"), std::string::npos) << open_error(d);
  d = fresh("key");
  edit_config(d, [](nlohmann::json &j) { j["sliding_window"] = 4; });
  EXPECT_NE(open_error(d).find("'sliding_window'"), std::string::npos) << open_error(d);
  // Image-to-video configs load (MatchesDiffusersWan21I2V); these ones do not fit their weights or
  // lack half of the image path.
  d = fresh("i2v");
  edit_config(d, [](nlohmann::json &j) { j["image_dim"] = 1280; });
  EXPECT_NE(open_error(d).find("without added_kv_proj_dim"), std::string::npos) << open_error(d);
  d = fresh("i2v-kv");
  edit_config(d, [](nlohmann::json &j) { j["image_dim"] = 24; j["added_kv_proj_dim"] = 48; });
  EXPECT_NE(open_error(d).find("'added_kv_proj_dim' is 48"), std::string::npos) << open_error(d);
  d = fresh("i2v-weights");  // a T2V folder's weights under an I2V config: the image path is missing
  edit_config(d, [](nlohmann::json &j) { j["image_dim"] = 24; j["added_kv_proj_dim"] = 32; });
  EXPECT_NE(open_error(d).find("lacks 'blocks.0.attn2.add_k_proj"), std::string::npos) << open_error(d);
  d = fresh("i2v22");  // Wan 2.2 I2V's 36 input channels, but the weights' patch embedding takes 4
  edit_config(d, [](nlohmann::json &j) { j["in_channels"] = 36; j["out_channels"] = 16; });
  EXPECT_NE(open_error(d).find("patch_embedding.weight"), std::string::npos) << open_error(d);
  d = fresh("flf2v");
  edit_config(d, [](nlohmann::json &j) { j["pos_embed_seq_len"] = 514; });
  EXPECT_NE(open_error(d).find("'pos_embed_seq_len'"), std::string::npos) << open_error(d);
  d = fresh("huge");
  edit_config(d, [](nlohmann::json &j) { j["ffn_dim"] = int64_t(1) << 62; });
  EXPECT_NE(open_error(d).find("'ffn_dim'"), std::string::npos) << open_error(d);
  d = fresh("shape");  // a config that does not match the weights
  edit_config(d, [](nlohmann::json &j) { j["ffn_dim"] = 48; });
  EXPECT_NE(open_error(d).find("blocks.0.ffn.net.0.proj"), std::string::npos) << open_error(d);
  d = fresh("layers");  // one layer fewer: the folder holds tensors the model lacks
  edit_config(d, [](nlohmann::json &j) { j["num_layers"] = 1; });
  EXPECT_NE(open_error(d).find("blocks.1."), std::string::npos) << open_error(d);
  d = fresh("missing");  // one layer more: blocks.2 is missing
  edit_config(d, [](nlohmann::json &j) { j["num_layers"] = 3; });
  EXPECT_NE(open_error(d).find("lacks 'blocks.2."), std::string::npos) << open_error(d);
  d = fresh("nan");  // a NaN in the first stored tensor: named at load, not found as a NaN loss later
  vttest::nan_into_safetensors(d + "/diffusion_pytorch_model.safetensors");
  EXPECT_NE(open_error(d).find("with 1 NaN/Inf of"), std::string::npos) << open_error(d);
  EXPECT_NE(open_error(d).find("holds '"), std::string::npos) << open_error(d);
  // Sharded folders: an index naming a missing shard, a truncated shard, a FIFO in place of a shard.
  auto m = open_dit(dit_dir("wan_t2v_tiny"), torch::kCPU);
  d = base + "/sharded";
  m->save(d, torch::kFloat, 20000);
  std::string second;
  for (const auto &e : fs::directory_iterator(d))
    if (e.path().filename().string().find("-00002-of-") != std::string::npos) second = e.path().string();
  ASSERT_FALSE(second.empty());
  fs::rename(second, second + ".away");
  EXPECT_NE(open_error(d).find("does not exist"), std::string::npos) << open_error(d);
  fs::copy_file(second + ".away", second);
  fs::resize_file(second, fs::file_size(second) - 100);
  EXPECT_NE(open_error(d).find(fs::path(second).filename().string()), std::string::npos) << open_error(d);
  fs::remove(second);
  ASSERT_EQ(::mkfifo(second.c_str(), 0600), 0);
  EXPECT_NE(open_error(d).find("not a regular file"), std::string::npos) << open_error(d);
  fs::remove_all(base);
}

// finetrainers' flow-matching step for Wan (schedulers/training_objectives.safetensors): x_t,
// target and the loss of the model's prediction, from its x0, noise, sigmas and (integer) timesteps.
TEST(WanTransformer, FlowObjectiveMatchesFinetrainers) {
  RefFile ref("schedulers/training_objectives.safetensors");
  auto m = open_dit(dit_dir("wan_t2v_tiny"), torch::kCPU);
  torch::NoGradGuard ng;
  const auto x0 = ref.get("flow.x0"), noise = ref.get("flow.noise"), text = ref.get("flow.encoder_hidden_states");
  for (const std::string scheme : {"none", "logit_normal"}) {
    const std::string k = "flow." + scheme + ".";
    at::Tensor x_t, t, target;
    flow_terms(x0, noise, ref.get(k + "sigmas").flatten(), &x_t, &t, &target);
    EXPECT_LT(rel_l2(x_t, ref.get(k + "x_t")), 1e-6) << scheme;
    EXPECT_LT(rel_l2(target, ref.get(k + "target")), 1e-6) << scheme;
    EXPECT_LT(rel_l2(t, ref.get(k + "sigmas").flatten() * 1000), 1e-6) << scheme;
    // finetrainers hands the model the truncated integer timesteps.
    const auto pred = m->forward(x_t, ref.get(k + "timesteps"), text);
    EXPECT_LT(rel_l2(pred, ref.get(k + "pred")), 1e-5) << scheme;
    const auto loss = (pred - target).pow(2).mean();
    EXPECT_LT(rel_l2(loss, ref.get(k + "loss")), 1e-5) << scheme;
  }
}

// Each sample's sigma and noise depend on (seed, sample id, epoch) alone: the same sample gives the
// same draw in any batch, another epoch another draw; shift and range apply as documented.
TEST(WanTransformer, FlowDrawsArePerSample) {
  ModelOptions o;
  o.seed = 7;
  const auto x0 = torch::zeros({3, 4, 2, 4, 6});
  at::Tensor s1, n1, s2, n2, s3, n3;
  draw_flow(x0, {10, 11, 12}, 0, o, &s1, &n1);
  draw_flow(x0.narrow(0, 0, 1), {11}, 0, o, &s2, &n2);
  EXPECT_TRUE(torch::equal(n1[1], n2[0]));
  EXPECT_EQ(s1[1].item<float>(), s2[0].item<float>());
  draw_flow(x0.narrow(0, 0, 1), {11}, 1, o, &s3, &n3);
  EXPECT_FALSE(torch::equal(n1[1], n3[0]));
  o.timestep_lo = 875;
  o.timestep_hi = 1000;
  draw_flow(x0, {10, 11, 12}, 0, o, &s2, &n2);
  EXPECT_TRUE((s2 >= 0.875).all().item<bool>());
  EXPECT_TRUE(torch::equal(n1, n2));
  EXPECT_NEAR(shift_sigma(0.5, 3.0), 0.75, 1e-12);
}

// The Wan pipelines zero the text positions past the caption; the mask says which.
TEST(WanTransformer, TextPaddingIsZeroedByTheMask) {
  const auto e = torch::ones({2, 4, 3});
  const auto mask = torch::tensor({1, 1, 0, 0, 1, 1, 1, 0}, torch::kLong).view({2, 4});
  const auto z = zero_text_padding(e, mask);
  EXPECT_EQ(z.sum().item<float>(), 15.0f);
  EXPECT_EQ(z[0][2].sum().item<float>(), 0.0f);
}

// ddptrainsink's face of the folder: validation at fixed sigmas is the same number on every pass
// (noise from the sample's seed); training draws per sample; wrong inputs name what to change.
TEST(WanTransformer, TrainModelFace) {
  ModelOptions o;
  o.val_sigmas = {0.3, 0.7};
  auto m = make_model(dit_dir("wan_t2v_tiny"), ModelDims{}, torch::kCPU, o);
  ASSERT_TRUE(m->takes_text());
  ModelInputs in;
  torch::manual_seed(0);
  in.latents = torch::randn({2, 4, 3, 8, 12});
  in.text_embeds = torch::randn({2, 7, 32});
  in.text_mask = torch::ones({2, 7}, torch::kLong);
  in.sample_ids = {5, 9};
  torch::NoGradGuard ng;
  const auto v1 = m->validation_step(in, {11, 12}), v2 = m->validation_step(in, {11, 12});
  EXPECT_TRUE(torch::equal(v1, v2));
  EXPECT_EQ(v1.sizes(), (std::vector<int64_t>{2}));
  EXPECT_FALSE(torch::equal(v1, m->validation_step(in, {13, 12})));
  const auto l1 = m->training_step(in), l2 = m->training_step(in);
  EXPECT_TRUE(std::isfinite(l1.item<float>()));
  EXPECT_EQ(l1.item<float>(), l2.item<float>());  // the same samples, the same draws
  in.epoch = 1;
  EXPECT_NE(m->training_step(in).item<float>(), l1.item<float>());
  auto bad = in;
  bad.latents = torch::randn({2, 16, 3, 8, 12});
  try {
    m->training_step(bad);
    ADD_FAILURE() << "16 channels trained";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("16 latent channels"), std::string::npos) << e.what();
  }
  bad = in;
  bad.text_embeds = torch::randn({2, 7, 48});
  try {
    m->training_step(bad);
    ADD_FAILURE() << "48-dimensional text trained";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("48 dimensions"), std::string::npos) << e.what();
  }
}

// The image input is checked against the folder's image path; FLF2V takes two images per sample; the
// config round-trips; training checks the micro-batch's image inputs and text length (issue 43).
TEST(WanTransformer, ImageInputsAreChecked) {
  torch::NoGradGuard ng;
  auto i2v = open_dit(dit_dir("wan21_i2v_tiny"), torch::kCPU);
  auto t2v = open_dit(dit_dir("wan_t2v_tiny"), torch::kCPU);
  EXPECT_EQ(i2v->image_dim(), 24);
  EXPECT_TRUE(i2v->image_to_video());
  EXPECT_FALSE(t2v->image_to_video());
  const auto x = torch::randn({1, 12, 2, 4, 4}), t = torch::tensor({500.0}), text = torch::randn({1, 7, 32});
  EXPECT_EQ(i2v->forward_image(x, t, text, torch::randn({1, 5, 24})).sizes(), (std::vector<int64_t>{1, 4, 2, 4, 4}));
  vttest::expect_error([&] { i2v->forward(x, t, text); }, "needs encoder_hidden_states_image");
  vttest::expect_error([&] { i2v->forward_image(x, t, text, torch::randn({1, 5, 16})); }, "encoder_hidden_states_image has shape");
  vttest::expect_error([&] { t2v->forward_image(x.narrow(1, 0, 4), t, text, torch::randn({1, 5, 24})); }, "no image path");
  // The config written back names the image path, and builds the same parameters.
  auto again = build_dit(i2v->config_json(), torch::kCPU);
  EXPECT_EQ(again->module().named_parameters().size(), i2v->module().named_parameters().size());
  // FLF2V: pos_embed over both images' tokens; the input holds each sample's two images.
  auto j = nlohmann::json::parse(i2v->config_json());
  j["pos_embed_seq_len"] = 10;
  auto flf = build_dit(j.dump(), torch::kCPU);
  const auto params = flf->module().named_parameters();
  ASSERT_TRUE(params.contains("condition_embedder.image_embedder.pos_embed"));
  EXPECT_EQ(params["condition_embedder.image_embedder.pos_embed"].sizes(), (std::vector<int64_t>{1, 10, 24}));
  const auto two = torch::randn({2, 5, 24});
  const auto y = flf->forward_image(x, t, text, two);
  params["condition_embedder.image_embedder.pos_embed"].add_(torch::randn({1, 10, 24}));  // they reach the output
  EXPECT_FALSE(torch::allclose(y, flf->forward_image(x, t, text, two)));
  vttest::expect_error([&] { flf->forward_image(x, t, text, torch::randn({1, 5, 24})); }, "first then last frame");
  // Training: a micro-batch without image_embeds names imageencoder; text shorter than diffusers' 512
  // rows (the image tokens would be read as text) names textencoder's max-length.
  auto model = make_model(dit_dir("wan21_i2v_tiny"), ModelDims{}, torch::kCPU, ModelOptions{});
  ModelInputs in;
  in.latents = torch::randn({1, 4, 2, 4, 4});
  in.condition = torch::randn({1, 8, 2, 4, 4});
  in.text_embeds = text;
  in.text_mask = torch::ones({1, 7}, torch::kLong);
  vttest::expect_error([&] { model->training_step(in); }, "put an imageencoder");
  in.image_embeds = torch::randn({1, 1, 5, 24});
  vttest::expect_error([&] { model->training_step(in); }, "max-length=512");
}
