/* LoRA on the native Wan model against PEFT's formula around diffusers' model
 * (tests/reference/dit/wan_t2v_tiny_lora): the same outputs and LoRA gradients from the diffusers file
 * (alpha from its metadata), the original/ComfyUI file (alpha per module) and diffusers' own conversion
 * of it (alpha folded in); LoRA files that do not fit are errors naming the key. */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <cstring>
#include <limits>
#include <map>
#include <unistd.h>

#include "models/layers.h"
#include "models/lora.h"
#include "models/native_model.h"
#include "models/weights_io.h"
#include "ref_cases.h"
#include "safetensors.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::models;
using modeltest::RefFile;
using modeltest::rel_l2;

namespace {

std::string dit_ref(const std::string &rel) { return vttest::reference_dir() + "/dit/" + rel; }

struct Result {
  double output = 1, grad_x = 1, worst_grad = 1;
  size_t grads = 0;
  std::string naming;
};

Result run(const std::string &file) {
  auto m = open_dit(dit_ref("wan_t2v_tiny"), torch::kCPU);
  for (auto &p : m->module().parameters()) p.set_requires_grad(false);  // the base is frozen
  const auto lora = read_lora(dit_ref("wan_t2v_tiny_lora/" + file), m->module());
  apply_lora(m->module(), lora, true);
  RefFile cases("dit/wan_t2v_tiny_lora/cases.safetensors");
  const std::string c = "b2_t3_h8_w12";
  RefFile base("dit/wan_t2v_tiny/cases.safetensors");  // the LoRA cases share the base model's inputs
  auto x = base.get("input." + c + ".hidden_states").requires_grad_(true);
  auto out = m->forward(x, base.get("input." + c + ".timestep"), base.get("input." + c + ".encoder_hidden_states"));
  (out * cases.get("cotangent." + c)).sum().backward();
  Result r;
  r.naming = lora.naming;
  r.output = rel_l2(out.detach(), cases.get("output." + c));
  r.grad_x = rel_l2(x.grad(), cases.get("grad_input." + c + ".hidden_states"));
  r.worst_grad = 0;
  for (const auto &[name, t] : lora_parameters(m->module())) {
    r.worst_grad = std::max(r.worst_grad, rel_l2(t.grad(), cases.get("grad." + c + "." + name)));
    r.grads++;
  }
  // Frozen base: no gradient reached it.
  for (const auto &p : m->module().named_parameters(true))
    if (p.key().find("lora_") == std::string::npos) {
      EXPECT_FALSE(p.value().grad().defined()) << p.key();
    }
  return r;
}

}  // namespace

TEST(WanLora, DiffusersFileMatchesPeft) {
  const auto r = run("pytorch_lora_weights.safetensors");
  EXPECT_EQ(r.naming, "diffusers");
  EXPECT_LT(r.output, 1e-5);
  EXPECT_LT(r.grad_x, 1e-5);
  EXPECT_EQ(r.grads, 40u);
  EXPECT_LT(r.worst_grad, 1e-4);
  std::printf("diffusers naming: output %.2g, grad hidden_states %.2g, worst LoRA gradient %.2g (%zu tensors)\n",
              r.output, r.grad_x, r.worst_grad, r.grads);
}

TEST(WanLora, ComfyUiFileMatchesPeft) {
  const auto r = run("lora_original_wan_naming.safetensors");
  EXPECT_EQ(r.naming, "comfyui");
  EXPECT_LT(r.output, 1e-5);
  EXPECT_LT(r.worst_grad, 1e-4);
  std::printf("original/ComfyUI naming: output %.2g, worst LoRA gradient %.2g\n", r.output, r.worst_grad);
}

// diffusers' conversion folds alpha into A (no metadata: scale 1): same outputs.
TEST(WanLora, ConvertedFileGivesTheSameOutput) {
  const auto r = run("pytorch_lora_weights_converted_from_original.safetensors");
  EXPECT_LT(r.output, 1e-5);
}

// kohya/musubi naming: the ComfyUI file's tensors under lora_unet_ keys with lora_down/lora_up.
TEST(WanLora, KohyaNamingMatchesToo) {
  std::string err;
  auto f = SafetensorsFile::open(dit_ref("wan_t2v_tiny_lora/lora_original_wan_naming.safetensors"), &err);
  ASSERT_TRUE(f) << err;
  std::vector<SafetensorsOutTensor> out;
  for (const auto &[key, e] : f->entries()) {
    std::string k = key.substr(std::string("diffusion_model.").size());
    std::string part;
    for (const char *s : {".lora_A.weight", ".lora_B.weight", ".alpha"})
      if (k.size() > std::strlen(s) && k.compare(k.size() - std::strlen(s), std::strlen(s), s) == 0) {
        part = s;
        k = k.substr(0, k.size() - part.size());
      }
    for (auto &c : k)
      if (c == '.') c = '_';
    part = part == ".lora_A.weight" ? ".lora_down.weight" : part == ".lora_B.weight" ? ".lora_up.weight" : part;
    SafetensorsOutTensor o{"lora_unet_" + k + part, e.dtype, e.shape, std::vector<uint8_t>(e.data, e.data + e.nbytes)};
    out.push_back(std::move(o));
  }
  const std::string path = std::filesystem::temp_directory_path() / ("vt-kohya-" + std::to_string(::getpid()) + ".safetensors");
  ASSERT_TRUE(write_safetensors(path, out, {}, &err)) << err;
  auto m = open_dit(dit_ref("wan_t2v_tiny"), torch::kCPU);
  const auto lora = read_lora(path, m->module());
  EXPECT_EQ(lora.naming, "kohya");
  apply_lora(m->module(), lora, false);
  RefFile cases("dit/wan_t2v_tiny_lora/cases.safetensors"), base("dit/wan_t2v_tiny/cases.safetensors");
  const std::string c = "b2_t3_h8_w12";
  torch::NoGradGuard ng;
  const auto y = m->forward(base.get("input." + c + ".hidden_states"), base.get("input." + c + ".timestep"),
                            base.get("input." + c + ".encoder_hidden_states"));
  EXPECT_LT(rel_l2(y, cases.get("output." + c)), 1e-5);
  std::filesystem::remove(path);
}

TEST(WanLora, FilesThatDoNotFitAreErrorsNamingTheKey) {
  auto m = open_dit(dit_ref("wan_t2v_tiny"), torch::kCPU);
  auto err_of = [&](const std::vector<SafetensorsOutTensor> &ts) {
    const std::string path = std::filesystem::temp_directory_path() / ("vt-badlora-" + std::to_string(::getpid()) + ".safetensors");
    std::string err;
    EXPECT_TRUE(write_safetensors(path, ts, {}, &err)) << err;
    try {
      read_lora(path, m->module());
    } catch (const std::exception &e) {
      std::filesystem::remove(path);
      return std::string(e.what());
    }
    std::filesystem::remove(path);
    return std::string();
  };
  auto t = [](const std::string &name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return SafetensorsOutTensor{name, "F32", shape, std::vector<uint8_t>(n * 4, 0)};
  };
  // Another model's module (CogVideoX's names), another width, an A without its B, mixed ranks.
  EXPECT_NE(err_of({t("transformer.transformer_blocks.0.attn1.to_q.lora_A.weight", {4, 32}),
                    t("transformer.transformer_blocks.0.attn1.to_q.lora_B.weight", {32, 4})})
                .find("'transformer_blocks.0.attn1.to_q', which this model does not have"),
            std::string::npos);
  EXPECT_NE(err_of({t("diffusion_model.transformer_blocks.0.attn1.q.lora_A.weight", {4, 32})}).find("names no Linear"),
            std::string::npos);
  EXPECT_NE(err_of({t("transformer.blocks.0.attn1.to_q.lora_A.weight", {4, 64}),
                    t("transformer.blocks.0.attn1.to_q.lora_B.weight", {32, 4})}).find("another model"),
            std::string::npos);
  EXPECT_NE(err_of({t("transformer.blocks.0.attn1.to_q.lora_A.weight", {4, 32})}).find("but not its lora_B"),
            std::string::npos);
  EXPECT_NE(err_of({t("transformer.blocks.0.attn1.to_q.lora_A.weight", {4, 32}),
                    t("transformer.blocks.0.attn1.to_q.lora_B.weight", {32, 4}),
                    t("transformer.blocks.0.attn1.to_k.lora_A.weight", {8, 32}),
                    t("transformer.blocks.0.attn1.to_k.lora_B.weight", {32, 8})}).find("one rank per file"),
            std::string::npos);
  EXPECT_NE(err_of({t("transformer.blocks.0.attn1.to_q.weight", {32, 32})}).find("not a LoRA tensor"), std::string::npos);
}

// Non-finite LoRA math (issue 38 item 10): NaN in A, Inf in B, alpha Inf, NaN, negative or 1e308 (metadata),
// finite factors whose product overflows, rank 0, one module's A given twice: each refused at read,
// naming the file's key or module, where they used to write NaN weights with exit 0.
TEST(WanLora, NonFiniteOrOverflowingFilesAreRefusedNamingTheKey) {
  auto m = open_dit(dit_ref("wan_t2v_tiny"), torch::kCPU);
  auto err_of = [&](const std::vector<SafetensorsOutTensor> &ts, const std::map<std::string, std::string> &meta = {}) {
    const std::string path = std::filesystem::temp_directory_path() / ("vt-nanlora-" + std::to_string(::getpid()) + ".safetensors");
    std::string err;
    EXPECT_TRUE(write_safetensors(path, ts, meta, &err)) << err;
    std::string what;
    try {
      read_lora(path, m->module());
    } catch (const std::exception &e) {
      what = e.what();
    }
    std::filesystem::remove(path);
    return what;
  };
  auto t = [](const std::string &name, std::vector<int64_t> shape, float v, int64_t at = -1, float special = 0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> f(size_t(n), v);
    if (at >= 0) f[size_t(at)] = special;
    std::vector<uint8_t> bytes(f.size() * 4);
    std::memcpy(bytes.data(), f.data(), bytes.size());
    return SafetensorsOutTensor{name, "F32", shape, bytes};
  };
  const std::string a = "transformer.blocks.0.attn1.to_q.lora_A.weight", b = "transformer.blocks.0.attn1.to_q.lora_B.weight";
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto has = [](const std::string &e, const std::string &what) {
    EXPECT_NE(e.find(what), std::string::npos) << "error: '" << e << "', want '" << what << "'";
  };
  has(err_of({t(a, {4, 32}, 0.1f, 5, nan), t(b, {32, 4}, 0.1f)}), a + "' holds NaN or Inf");
  has(err_of({t(a, {4, 32}, 0.1f), t(b, {32, 4}, 0.1f, 7, inf)}), b + "' holds NaN or Inf");
  const std::string ka = "lora_unet_blocks_0_self_attn_q.lora_down.weight", kb = "lora_unet_blocks_0_self_attn_q.lora_up.weight",
                    kal = "lora_unet_blocks_0_self_attn_q.alpha";
  has(err_of({t(ka, {4, 32}, 0.1f), t(kb, {32, 4}, 0.1f), t(kal, {}, inf)}), kal + "' holds NaN or Inf");
  has(err_of({t(ka, {4, 32}, 0.1f), t(kb, {32, 4}, 0.1f), t(kal, {}, nan)}), kal + "' holds NaN or Inf");
  has(err_of({t(ka, {4, 32}, 0.1f), t(kb, {32, 4}, 0.1f), t(kal, {}, -4.0f)}), "a LoRA's alpha is positive");
  has(err_of({t(a, {4, 32}, 0.1f), t(b, {32, 4}, 0.1f)},
             {{"lora_adapter_metadata", "{\"transformer.lora_alpha\": 1e308, \"transformer.r\": 4}"}}),
      "lora_alpha 1e+308");
  has(err_of({t(a, {4, 32}, 3e38f), t(b, {32, 4}, 3e38f)}), "overflows float32");
  has(err_of({t(a, {0, 32}, 0.f), t(b, {32, 0}, 0.f)}), "rank 0");
  has(err_of({t(a, {4, 32}, 0.1f), t(b, {32, 4}, 0.1f), t("transformer.blocks.0.attn1.to_q.lora_down.weight", {4, 32}, 0.1f)}),
      "A twice");
}

// Attached with B = 0 (a fresh LoRA, PEFT's init) the model's output is the base model's.
TEST(WanLora, FreshLoraLeavesTheOutputUnchanged) {
  auto m = open_dit(dit_ref("wan_t2v_tiny"), torch::kCPU);
  RefFile base("dit/wan_t2v_tiny/cases.safetensors");
  const std::string c = "b2_t3_h8_w12";
  torch::NoGradGuard ng;
  const auto x = base.get("input." + c + ".hidden_states"), t = base.get("input." + c + ".timestep"),
             e = base.get("input." + c + ".encoder_hidden_states");
  const auto before = m->forward(x, t, e);
  for (auto &[name, l] : linear_modules(m->module())) l->add_lora(4, 2.0);
  EXPECT_TRUE(torch::equal(m->forward(x, t, e), before));
  EXPECT_GT(lora_parameters(m->module()).size(), 40u);
}

// What diffusers' converters need (lora_conversion_utils.py): a kohya/musubi file with every module of
// every block up to the last one the LoRA has (zero where it has none), a ComfyUI file with a block
// module and alpha folded in outside the blocks. Read back, the zero adapters drop out and the output
// is the trained one; combinations no file satisfies are refused naming the naming that works.
TEST(WanLora, NamingsHoldWhatTheirLoadersNeed) {
  RefFile base("dit/wan_t2v_tiny/cases.safetensors");
  const std::string c = "b2_t3_h8_w12";
  const auto x = base.get("input." + c + ".hidden_states"), t = base.get("input." + c + ".timestep"),
             e = base.get("input." + c + ".encoder_hidden_states");
  const std::string dir = std::filesystem::temp_directory_path() / ("vt-namings-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto trained = [&](const std::vector<std::string> &targets) {
    auto m = open_dit(dit_ref("wan_t2v_tiny"), torch::kCPU);
    torch::manual_seed(9);
    for (auto &[name, l] : linear_modules(m->module()))
      for (const auto &s : targets)
        if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
          l->add_lora(4, 1.5);  // alpha 6, rank 4
          torch::NoGradGuard ng;
          l->lora_b.normal_();
        }
    return m;
  };
  auto output_of = [&](const std::string &path) {
    auto m = open_dit(dit_ref("wan_t2v_tiny"), torch::kCPU);
    const auto lora = read_lora(path, m->module());
    apply_lora(m->module(), lora, false);
    torch::NoGradGuard ng;
    return std::make_pair(m->forward(x, t, e), lora.modules.size());
  };
  auto keys_of = [](const std::string &path) {
    std::string err;
    auto f = SafetensorsFile::open(path, &err);
    std::map<std::string, at::Tensor> out;
    for (const auto &[k, en] : f->entries()) out[k] = tensor_of(en);
    return out;
  };
  torch::NoGradGuard ng;
  {  // default targets (attention) as kohya: every block's ffn_0/ffn_2 as zero adapters
    auto m = trained({"to_q", "to_k", "to_v", "to_out.0"});
    const auto want = m->forward(x, t, e);
    const auto lora = lora_of(m->module());
    write_lora_file(dir + "/kohya.safetensors", lora, "kohya");
    const auto k = keys_of(dir + "/kohya.safetensors");
    for (const char *key : {"lora_unet_blocks_0_ffn_0.lora_down.weight", "lora_unet_blocks_1_ffn_2.lora_up.weight"}) {
      ASSERT_TRUE(k.count(key)) << key;
      EXPECT_EQ(k.at(key).count_nonzero().item<int64_t>(), 0) << key;
    }
    EXPECT_EQ(k.size(), 2u * 10 * 3);
    const auto [y, n] = output_of(dir + "/kohya.safetensors");
    EXPECT_EQ(n, 16u);  // the zero adapters drop out
    EXPECT_LT(rel_l2(y, want), 1e-6);
    // lora convert without a model: the sizes come from the file's metadata.
    write_lora_file(dir + "/d.safetensors", lora, "diffusers");
    write_lora_file(dir + "/kohya2.safetensors", read_lora_file(dir + "/d.safetensors"), "kohya");
    EXPECT_LT(rel_l2(output_of(dir + "/kohya2.safetensors").first, want), 1e-6);
    EXPECT_NO_THROW(check_lora_format(m->module(), "all"));
  }
  {  // the head and the embeddings: ComfyUI folds alpha in there; kohya cannot hold them
    auto m = trained({"proj_out", "condition_embedder.time_proj", "text_embedder.linear_1"});
    const auto want = m->forward(x, t, e);
    const auto lora = lora_of(m->module());
    write_lora_file(dir + "/comfy.safetensors", lora, "comfyui");
    const auto k = keys_of(dir + "/comfy.safetensors");
    EXPECT_FALSE(k.count("diffusion_model.head.head.alpha"));
    EXPECT_TRUE(k.count("diffusion_model.blocks.0.self_attn.q.alpha"));  // the zero adapter the converter needs
    const auto [y, n] = output_of(dir + "/comfy.safetensors");
    EXPECT_EQ(n, 3u);
    EXPECT_LT(rel_l2(y, want), 1e-6);
    std::string err;
    try {
      write_lora_file(dir + "/kohya.safetensors", lora, "kohya");
    } catch (const std::exception &ex) {
      err = ex.what();
    }
    EXPECT_NE(err.find("holds only the blocks"), std::string::npos) << err;
    EXPECT_NE(err.find("comfyui"), std::string::npos) << err;
    EXPECT_NO_THROW(check_lora_format(m->module(), "comfyui"));
    EXPECT_THROW(check_lora_format(m->module(), "all"), std::runtime_error);
  }
  {  // PEFT's bare keys and config (a model's save_lora_adapter): alpha from the unprefixed metadata
    auto m = trained({"attn1.to_q"});
    const auto want = m->forward(x, t, e);
    std::vector<SafetensorsOutTensor> out;
    for (const auto &[name, l] : linear_modules(m->module()))
      if (l->has_lora()) {
        out.push_back(out_tensor(name + ".lora_A.weight", l->lora_a));
        out.push_back(out_tensor(name + ".lora_B.weight", l->lora_b));
      }
    std::string err;
    ASSERT_TRUE(write_safetensors(dir + "/bare.safetensors", out,
                                  {{"format", "pt"}, {"lora_adapter_metadata", R"({"r": 4, "lora_alpha": 6.0})"}}, &err))
        << err;
    const auto [y, n] = output_of(dir + "/bare.safetensors");
    EXPECT_EQ(n, 2u);
    EXPECT_LT(rel_l2(y, want), 1e-6);
  }
  std::filesystem::remove_all(dir);
}
