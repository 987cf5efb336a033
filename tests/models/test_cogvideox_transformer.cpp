/* The native CogVideoX transformer against diffusers' CogVideoXTransformer3DModel (tests/reference/dit:
 * cogvideox_2b_tiny, cogvideox_5b_tiny, cogvideox15_tiny and the image-to-video cogvideox_5b_i2v_tiny,
 * cogvideox15_i2v_tiny of tests/reference/cogvideox_i2v/generate.py): outputs, input gradients and every
 * parameter's gradient, with and without gradient checkpointing; the rotary tables against the
 * pipeline's; folders that must not load; CogVideoX's v-prediction objective against diffusers'
 * training script numbers and its DDPM schedule. */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/autocast_guard.h"
#include "models/cogvideox_transformer.h"
#include "models/layers.h"
#include "models/lora.h"
#include "models/native_model.h"
#include "models/schedules.h"
#include "ref_cases.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::models;
using modeltest::RefFile;
using modeltest::rel_l2;
namespace fs = std::filesystem;

namespace {

std::string dit_dir(const std::string &name) { return vttest::reference_dir() + "/dit/" + name; }

void check_family(const std::string &name, Checkpointing checkpointing) {
  auto m = open_dit(dit_dir(name), torch::kCPU);
  ASSERT_EQ(m->family(), "cogvideox");
  m->set_checkpointing(checkpointing);
  const std::string mode = checkpointing == Checkpointing::none ? "" : std::string(" (checkpointing ") + checkpointing_name(checkpointing) + ")";
  auto &net = dynamic_cast<CogVideoXTransformerImpl &>(m->module());
  RefFile cases("dit/" + name + "/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  const auto list = nlohmann::json::parse(cases.meta("cases"));
  ASSERT_EQ(list.size(), 2u);
  for (const auto &[c, info] : list.items()) {
    SCOPED_TRACE(name + "/" + c + mode);
    const bool params = info.value("parameter_gradients", false);
    for (auto &p : m->module().parameters()) p.mutable_grad() = at::Tensor();
    auto x = cases.get("input." + c + ".hidden_states").requires_grad_(true);
    const auto text = cases.get("input." + c + ".encoder_hidden_states");
    if (cases.has("input." + c + ".rotary_cos")) {  // the model computes the pipeline's tables itself
      const auto [cos, sin] = net.rotary_tables(x.size(1), x.size(3), x.size(4));
      EXPECT_LT(rel_l2(cos, cases.get("input." + c + ".rotary_cos")), 1e-7);
      EXPECT_LT(rel_l2(sin, cases.get("input." + c + ".rotary_sin")), 1e-7);
    }
    // ofs (1.5-I2V) as the reference passed it; the default (undefined) is the pipeline's 2.0.
    const auto ofs = cases.has("input." + c + ".ofs") ? cases.get("input." + c + ".ofs") : at::Tensor();
    auto out = ofs.defined() ? net.forward(x, cases.get("input." + c + ".timestep"), text, ofs)
                             : m->forward(x, cases.get("input." + c + ".timestep"), text);
    (out * cases.get("cotangent." + c)).sum().backward();
    const double eo = rel_l2(out.detach(), cases.get("output." + c));
    const double ex = rel_l2(x.grad(), cases.get("grad_input." + c + ".hidden_states"));
    EXPECT_LT(eo, 1e-5);
    EXPECT_LT(ex, 1e-5);
    double worst = 0;
    std::string worst_name;
    if (params) {
      int n = 0;
      for (const auto &p : m->module().named_parameters(true)) {
        const auto ref = cases.get("grad." + c + "." + p.key());
        n++;
        if (p.key().find("attn1.norm_k.bias") != std::string::npos && name == "cogvideox_2b_tiny") {
          // Mathematically zero without RoPE (a constant added to every key); float32 noise both sides.
          EXPECT_LT(p.value().grad().norm().item<double>(), 1e-5) << p.key();
          continue;
        }
        const double e = rel_l2(p.value().grad(), ref);
        if (e > worst) worst = e, worst_name = p.key();
      }
      EXPECT_EQ(n, 2 * 24 + 16 + (net.cfg.ofs_embed_dim ? 4 : 0));
      EXPECT_LT(worst, 1e-4) << worst_name;
    }
    std::printf("%s/%s%s: output %.2g, grad hidden_states %.2g%s\n", name.c_str(), c.c_str(), mode.c_str(), eo, ex,
                params ? (", worst parameter gradient " + std::to_string(worst) + " (" + worst_name + ")").c_str() : "");
  }
}

std::string tmp_dir(const std::string &tag) {
  auto d = fs::temp_directory_path() / ("vt-cogvideox-" + tag + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
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

TEST(CogVideoXTransformer, MatchesDiffusers2b) { check_family("cogvideox_2b_tiny", Checkpointing::none); }
TEST(CogVideoXTransformer, MatchesDiffusers5b) { check_family("cogvideox_5b_tiny", Checkpointing::none); }
TEST(CogVideoXTransformer, MatchesDiffusers15) { check_family("cogvideox15_tiny", Checkpointing::none); }
// Image-to-video: 5b-I2V (32 input channels at full size, learned positions: the stored table at the
// sample length, the sincos one at 5 frames), 1.5-I2V (ofs 2.0 as the pipeline passes it, and 0.5).
TEST(CogVideoXTransformer, MatchesDiffusers5bI2V) { check_family("cogvideox_5b_i2v_tiny", Checkpointing::none); }
TEST(CogVideoXTransformer, MatchesDiffusers15I2V) { check_family("cogvideox15_i2v_tiny", Checkpointing::none); }
TEST(CogVideoXTransformer, GradientCheckpointingGivesTheSameGradients) {
  for (const auto ck : {Checkpointing::full, Checkpointing::selective}) {
    check_family("cogvideox_2b_tiny", ck);
    check_family("cogvideox_5b_tiny", ck);
    check_family("cogvideox15_tiny", ck);
    check_family("cogvideox_5b_i2v_tiny", ck);
    check_family("cogvideox15_i2v_tiny", ck);
  }
}

// The I2V layouts: ofs defaults to the pipeline's 2.0, is refused by a model without it; learned
// positions refuse another latent size (diffusers does too); the written config reads back.
TEST(CogVideoXTransformer, ImageToVideoInputs) {
  auto m15 = open_dit(dit_dir("cogvideox15_i2v_tiny"), torch::kCPU);
  auto &net15 = dynamic_cast<CogVideoXTransformerImpl &>(m15->module());
  torch::NoGradGuard ng;
  const auto x = torch::randn({1, 2, 8, 8, 12}), text = torch::randn({1, 224, 32});
  const auto t = torch::tensor({300}, torch::kLong);
  EXPECT_TRUE(torch::equal(m15->forward(x, t, text), net15.forward(x, t, text, torch::tensor({2.0}))));
  EXPECT_FALSE(torch::allclose(m15->forward(x, t, text), net15.forward(x, t, text, torch::tensor({1.0}))));
  EXPECT_THROW(net15.forward(x, t, text, torch::ones({3})), std::invalid_argument);
  auto m5 = open_dit(dit_dir("cogvideox_5b_i2v_tiny"), torch::kCPU);
  auto &net5 = dynamic_cast<CogVideoXTransformerImpl &>(m5->module());
  try {
    net5.forward(torch::zeros({1, 3, 8, 4, 6}), t, torch::zeros({1, 226, 32}));
    ADD_FAILURE() << "another latent size than the learned table's was taken";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("8 x 12"), std::string::npos) << e.what();
  }
  EXPECT_THROW(net5.forward(torch::zeros({1, 3, 8, 8, 12}), t, torch::zeros({1, 226, 32}), torch::ones({1})),
               std::invalid_argument);
  EXPECT_THROW(net5.forward(torch::zeros({1, 3, 8, 8, 12}), t, torch::zeros({1, 20, 32})), std::invalid_argument);
  for (auto *m : {m15.get(), m5.get()}) {
    SCOPED_TRACE(m->config_json());
    CogVideoXConfig a, b;
    std::string e;
    const auto &cfg = dynamic_cast<CogVideoXTransformerImpl &>(m->module()).cfg;
    ASSERT_TRUE(parse_cogvideox_transformer_config(m->config_json(), &a, &e)) << e;
    EXPECT_EQ(a.in_channels, 8);
    EXPECT_EQ(a.ofs_embed_dim, cfg.ofs_embed_dim);
    EXPECT_EQ(a.use_learned_positional_embeddings, cfg.use_learned_positional_embeddings);
    (void)b;
  }
  EXPECT_EQ(net15.cfg.ofs_embed_dim, 32);
  EXPECT_TRUE(net5.cfg.use_learned_positional_embeddings);
}

// Each layout's cases in none, full and selective: selective == full bit for bit (the same ops, the
// gradients summed in the same order), both == none to float rounding, for the output, the input
// gradients and every parameter's gradient.
TEST(CogVideoXTransformer, SelectiveEqualsFullAndNoCheckpointing) {
  for (const std::string name : {"cogvideox_2b_tiny", "cogvideox_5b_tiny", "cogvideox15_tiny"}) {
    auto m = open_dit(dit_dir(name), torch::kCPU);
    RefFile cases("dit/" + name + "/cases.safetensors");
    ASSERT_TRUE(cases.ok());
    const auto list = nlohmann::json::parse(cases.meta("cases"));
    for (const auto &[c, info] : list.items()) {
      SCOPED_TRACE(name + "/" + c);
      auto run = [&](Checkpointing ck) {
        m->set_checkpointing(ck);
        for (auto &p : m->module().parameters()) p.mutable_grad() = at::Tensor();
        auto x = cases.get("input." + c + ".hidden_states").clone().requires_grad_(true);
        auto text = cases.get("input." + c + ".encoder_hidden_states").clone().requires_grad_(true);
        auto out = m->forward(x, cases.get("input." + c + ".timestep"), text);
        (out * cases.get("cotangent." + c)).sum().backward();
        std::vector<std::pair<std::string, at::Tensor>> g{
            {"output", out.detach()}, {"hidden_states", x.grad()}, {"encoder_hidden_states", text.grad()}};
        for (const auto &p : m->module().named_parameters(true)) g.emplace_back(p.key(), p.value().grad());
        return g;
      };
      const auto none = run(Checkpointing::none), full = run(Checkpointing::full), sel = run(Checkpointing::selective);
      double worst = 0;
      int exact = 0;
      for (size_t i = 0; i < none.size(); i++) {
        const auto &key = none[i].first;
        ASSERT_TRUE(sel[i].second.defined()) << key;
        exact += torch::equal(sel[i].second, full[i].second);
        EXPECT_TRUE(torch::equal(sel[i].second, full[i].second)) << key << ": " << rel_l2(sel[i].second, full[i].second);
        // Relative to the largest gradient of the tensor: attn1.norm_k.bias's is zero up to float
        // noise without rotary positions (2b), where a relative L2 measures noise against noise.
        const double scale = std::max(none[i].second.abs().max().item<double>(), 1e-30);
        const double e = (sel[i].second - none[i].second).abs().max().item<double>() / scale;
        EXPECT_LT(e, 1e-6) << key;
        EXPECT_LT((full[i].second - none[i].second).abs().max().item<double>() / scale, 1e-6) << key;
        worst = std::max(worst, e);
      }
      std::printf("%s/%s: selective == full bit for bit in %d of %zu tensors; against none at most %.2g\n",
                  name.c_str(), c.c_str(), exact, none.size(), worst);
    }
  }
}

// Shapes the layout cannot take are errors naming the input, not crashes.
TEST(CogVideoXTransformer, BadInputsNameTheInput) {
  auto m = open_dit(dit_dir("cogvideox_2b_tiny"), torch::kCPU);
  auto m15 = open_dit(dit_dir("cogvideox15_tiny"), torch::kCPU);
  auto error = [](DitModel &d, const at::Tensor &x, const at::Tensor &t, const at::Tensor &text) -> std::string {
    try {
      d.forward(x, t, text);
    } catch (const std::invalid_argument &e) {
      return e.what();
    }
    return "";
  };
  const auto t = torch::tensor({5}, torch::kLong);
  EXPECT_NE(error(*m, torch::zeros({1, 3, 4, 8, 12}), t, torch::zeros({1, 20, 32})).find("max_text_seq_length"),
            std::string::npos);
  EXPECT_NE(error(*m, torch::zeros({1, 4, 3, 8, 12}), t, torch::zeros({1, 226, 32})).find("frames before channels"),
            std::string::npos);
  EXPECT_NE(error(*m15, torch::zeros({1, 3, 4, 8, 12}), t, torch::zeros({1, 224, 32})).find("patch_size_t 2"),
            std::string::npos);
  // Rotary layouts take any text length.
  EXPECT_EQ(error(*m15, torch::zeros({1, 2, 4, 8, 12}), t, torch::zeros({1, 7, 32})), "");
}

TEST(CogVideoXTransformer, BadFoldersAreErrorsNamingTheKey) {
  const std::string base = tmp_dir("bad");
  auto fresh = [&](const std::string &tag, const std::function<void(nlohmann::json &)> &edit) {
    const std::string d = base + "/" + tag;
    fs::create_directories(d);
    fs::copy_file(dit_dir("cogvideox_5b_tiny") + "/diffusion_pytorch_model.safetensors",
                  d + "/diffusion_pytorch_model.safetensors");
    auto j = nlohmann::json::parse(std::ifstream(dit_dir("cogvideox_5b_tiny") + "/config.json"));
    edit(j);
    std::ofstream(d + "/config.json") << j.dump(2);
    return open_error(d);
  };
  std::string e = fresh("channels", [](nlohmann::json &j) { j["in_channels"] = 12; });
  EXPECT_NE(e.find("'in_channels'"), std::string::npos) << e;
  EXPECT_NE(e.find("image-to-video"), std::string::npos) << e;
  e = fresh("i2v", [](nlohmann::json &j) { j["in_channels"] = 8; });  // 5b-I2V's layout, T2V weights
  EXPECT_NE(e.find("patch_embed.proj.weight"), std::string::npos) << e;
  e = fresh("ofs", [](nlohmann::json &j) { j["ofs_embed_dim"] = 512; });  // not time_embed_dim
  EXPECT_NE(e.find("'ofs_embed_dim'"), std::string::npos) << e;
  e = fresh("ofs_weights", [](nlohmann::json &j) { j["ofs_embed_dim"] = 32; });  // no ofs_embedding tensors
  EXPECT_NE(e.find("ofs_embedding."), std::string::npos) << e;
  e = fresh("learned", [](nlohmann::json &j) {
    j["use_learned_positional_embeddings"] = true;
    j["use_rotary_positional_embeddings"] = false;
  });
  EXPECT_NE(e.find("'use_learned_positional_embeddings'"), std::string::npos) << e;
  e = fresh("learned_table", [](nlohmann::json &j) { j["use_learned_positional_embeddings"] = true; });
  EXPECT_NE(e.find("patch_embed.pos_embedding"), std::string::npos) << e;
  e = fresh("unknown", [](nlohmann::json &j) { j["sliding_window"] = 4; });
  EXPECT_NE(e.find("'sliding_window'"), std::string::npos) << e;
  e = fresh("act", [](nlohmann::json &j) { j["activation_fn"] = "relu"; });
  EXPECT_NE(e.find("'activation_fn'"), std::string::npos) << e;
  e = fresh("layers", [](nlohmann::json &j) { j["num_layers"] = 3; });
  EXPECT_NE(e.find("transformer_blocks.2."), std::string::npos) << e;
  e = fresh("sincos", [](nlohmann::json &j) { j["use_rotary_positional_embeddings"] = false; });
  EXPECT_EQ(e, "");  // 2b and 5b share their tensors: only the positions differ
  fs::remove_all(base);
}

// The written config reads back to the same model (every key diffusers writes, I2V keys null).
TEST(CogVideoXTransformer, ConfigRoundTrip) {
  for (const std::string name : {"cogvideox_2b_tiny", "cogvideox15_tiny"}) {
    std::ifstream f(dit_dir(name) + "/config.json");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    CogVideoXConfig a, b;
    std::string err;
    ASSERT_TRUE(parse_cogvideox_transformer_config(text, &a, &err)) << err;
    ASSERT_TRUE(parse_cogvideox_transformer_config(cogvideox_transformer_config_json(a), &b, &err)) << err;
    EXPECT_EQ(cogvideox_transformer_config_json(a), cogvideox_transformer_config_json(b));
    EXPECT_EQ(a.patch_size_t, name == "cogvideox15_tiny" ? 2 : 0);
    EXPECT_EQ(a.max_text_seq_length, name == "cogvideox15_tiny" ? 224 : 226);
  }
}

// CogVideoX's DDPM schedule (schedules.h; snr_shift_scale 3.0 for 2b, 1.0 for 5b) as the trainer uses it
// equals diffusers' alphas_cumprod; the x0 estimate is get_velocity on the shared inputs.
TEST(CogVideoXObjective, ScheduleMatchesDiffusers) {
  RefFile ref("schedulers/schedules.safetensors");
  for (const auto &[tag, s] : {std::pair<std::string, double>{"snr3", 3.0}, {"snr1", 1.0}}) {
    const auto a = torch::tensor(cogvideox_alphas_cumprod(s), torch::kDouble);
    ASSERT_EQ(a.scalar_type(), torch::kDouble);
    for (const std::string sched : {"cogvideox_ddim.", "cogvideox_dpm."}) {
      const auto ref_a = ref.get(sched + tag + ".alphas_cumprod");
      EXPECT_LT((a - ref_a).abs().max().item<double>(), 1e-15) << sched << tag;
    }
    EXPECT_EQ(a[999].item<double>(), 0.0);
    const auto v = vpred_x0(ref.get("cogvideox.get_velocity.noise"), ref.get("cogvideox.get_velocity.sample"),
                            ref.get("cogvideox.get_velocity.timesteps"), a);
    EXPECT_LT(rel_l2(v, ref.get("cogvideox_ddim." + tag + ".get_velocity")), 1e-6) << tag;
  }
}

// diffusers' examples/cogvideo/train_cogvideox_lora.py step (schedulers/training_objectives.safetensors):
// x_t, the model's velocity, the x0 estimate, the weights and the loss.
TEST(CogVideoXObjective, MatchesDiffusersTrainingScript) {
  RefFile ref("schedulers/training_objectives.safetensors");
  auto m = open_dit(dit_dir("cogvideox_2b_tiny"), torch::kCPU);
  torch::NoGradGuard ng;
  const auto a = torch::tensor(cogvideox_alphas_cumprod(3.0), torch::kDouble);
  const auto x0 = ref.get("cogvideox.model_input"), noise = ref.get("cogvideox.noise"),
             t = ref.get("cogvideox.timesteps");
  at::Tensor x_t, w;
  vpred_terms(x0, noise, t, a, &x_t, &w);
  EXPECT_LT(rel_l2(x_t, ref.get("cogvideox.noisy_model_input")), 1e-6);
  EXPECT_LT(rel_l2(w, ref.get("cogvideox.weights")), 1e-12);
  const auto v = m->forward(x_t, t, ref.get("cogvideox.encoder_hidden_states"));
  EXPECT_LT(rel_l2(v, ref.get("cogvideox.model_output")), 1e-5);
  const auto pred = vpred_x0(x_t, v, t, a);
  EXPECT_LT(rel_l2(pred, ref.get("cogvideox.model_pred")), 1e-5);
  const auto loss = vpred_loss(pred, x0, w).mean();
  EXPECT_LT(rel_l2(loss, ref.get("cogvideox.loss")), 1e-5);
  std::printf("cogvideox objective: loss %.9g vs %.9g\n", loss.item<double>(), ref.get("cogvideox.loss").item<double>());
}

// Latents [B, C, T, H, W] become [B, F, C, H, W]; 1.5 pads odd frame counts with the first frame in front.
TEST(CogVideoXObjective, LatentLayoutAndFramePadding) {
  const auto x = torch::arange(2 * 4 * 3 * 2 * 2, torch::kFloat).view({2, 4, 3, 2, 2});
  const auto a = cogvideox_latents(x, 1);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, 3, 4, 2, 2}));
  EXPECT_TRUE(torch::equal(a[1][2], x[1].select(1, 2)));
  const auto b = cogvideox_latents(x, 2);
  EXPECT_EQ(b.sizes(), (std::vector<int64_t>{2, 4, 4, 2, 2}));
  EXPECT_TRUE(torch::equal(b.narrow(1, 1, 3), a));
  EXPECT_TRUE(torch::equal(b.select(1, 0), a.select(1, 0)));
  EXPECT_EQ(cogvideox_latents(x.narrow(2, 0, 2), 2).size(1), 2);
}

// The folder's scheduler config gives snr_shift_scale; without one, the layout's published value.
TEST(CogVideoXObjective, SnrShiftScaleFromTheFolder) {
  const std::string base = tmp_dir("snr");
  fs::create_directories(base + "/transformer");
  fs::create_directories(base + "/scheduler");
  EXPECT_EQ(cogvideox_snr_shift_scale(base + "/transformer", false), 3.0);
  EXPECT_EQ(cogvideox_snr_shift_scale(base + "/transformer", true), 1.0);
  std::ofstream(base + "/scheduler/scheduler_config.json") << R"({"snr_shift_scale": 2.5})";
  EXPECT_EQ(cogvideox_snr_shift_scale(base + "/transformer", false), 2.5);
  fs::remove_all(base);
}

// ddptrainsink's face of a CogVideoX folder: per-sample draws, fixed-timestep validation, 1.5's odd
// frame counts, wrong inputs named.
TEST(CogVideoXObjective, TrainModelFace) {
  ModelOptions o;
  o.val_sigmas = {0.3, 0.999};
  for (const std::string name : {"cogvideox_2b_tiny", "cogvideox15_tiny"}) {
    SCOPED_TRACE(name);
    auto m = make_model(dit_dir(name), ModelDims{}, torch::kCPU, o);
    ModelInputs in;
    torch::manual_seed(0);
    in.latents = torch::randn({2, 4, 3, 8, 12});  // 3 frames: 1.5 pads to 4
    in.text_embeds = torch::randn({2, name == "cogvideox15_tiny" ? 224 : 226, 32});
    in.text_mask = torch::ones({2, in.text_embeds.size(1)}, torch::kLong);
    in.sample_ids = {5, 9};
    torch::NoGradGuard ng;
    const auto v1 = m->validation_step(in, {11, 12});
    EXPECT_TRUE(torch::equal(v1, m->validation_step(in, {11, 12})));
    EXPECT_EQ(v1.sizes(), (std::vector<int64_t>{2}));
    EXPECT_FALSE(torch::equal(v1, m->validation_step(in, {13, 12})));
    const auto l1 = m->training_step(in);
    EXPECT_TRUE(std::isfinite(l1.item<float>()));
    EXPECT_EQ(l1.item<float>(), m->training_step(in).item<float>());
    in.epoch = 1;
    EXPECT_NE(m->training_step(in).item<float>(), l1.item<float>());
    // No mask applied: the padding rows are T5's own outputs and change the loss.
    auto masked = in;
    masked.text_mask = torch::zeros_like(in.text_mask);
    EXPECT_EQ(m->training_step(masked).item<float>(), m->training_step(in).item<float>());
  }
  // Timesteps stay integers in [lo, hi).
  o.timestep_lo = 990;
  at::Tensor t, noise;
  draw_ddpm(torch::zeros({8, 4, 2, 2, 2}), {1, 2, 3, 4, 5, 6, 7, 8}, 0, o, &t, &noise);
  EXPECT_EQ(t.scalar_type(), torch::kLong);
  EXPECT_TRUE((t >= 990).all().item<bool>() && (t <= 999).all().item<bool>());
}

// A LoRA on CogVideoX's attention (the default targets) written in the diffusers naming reads back to
// the same modules, alpha and tensors, and gives the same output once applied; the ComfyUI and kohya
// namings, which no loader reads for CogVideoX, are refused naming diffusers.
TEST(CogVideoXLora, ThreeNamingsRoundTrip) {
  auto m = open_dit(dit_dir("cogvideox_5b_tiny"), torch::kCPU);
  torch::manual_seed(4);
  int n = 0;
  for (auto &[name, l] : linear_modules(m->module()))
    if (name.find(".attn1.to_") != std::string::npos) {
      l->add_lora(4, 2.0);
      torch::NoGradGuard ng;
      l->lora_b.normal_();
      n++;
    }
  ASSERT_EQ(n, 8);
  RefFile cases("dit/cogvideox_5b_tiny/cases.safetensors");
  const std::string c = "b2_t3_h8_w12";
  torch::NoGradGuard ng;
  const auto x = cases.get("input." + c + ".hidden_states"), t = cases.get("input." + c + ".timestep"),
             text = cases.get("input." + c + ".encoder_hidden_states");
  const auto with_lora = m->forward(x, t, text);
  EXPECT_GT(rel_l2(with_lora, cases.get("output." + c)), 1e-3);  // the LoRA changes the output
  const auto lora = lora_of(m->module());
  const std::string base = tmp_dir("lora");
  for (const std::string naming : {"comfyui", "kohya"}) {
    std::string err;
    try {
      write_lora_file(base + "/" + naming + ".safetensors", lora, naming);
    } catch (const std::exception &e) {
      err = e.what();
    }
    EXPECT_NE(err.find("lora-format=diffusers"), std::string::npos) << naming << ": " << err;
  }
  for (const std::string naming : {"diffusers"}) {
    SCOPED_TRACE(naming);
    const std::string path = base + "/" + naming + ".safetensors";
    write_lora_file(path, lora, naming);
    std::string err;
    auto f = SafetensorsFile::open(path, &err);
    ASSERT_TRUE(f);
    const std::string key = naming == "diffusers" ? "transformer.transformer_blocks.1.attn1.to_out.0.lora_A.weight"
                            : naming == "comfyui" ? "diffusion_model.transformer_blocks.1.attn1.to_out.0.lora_A.weight"
                                                  : "lora_unet_transformer_blocks_1_attn1_to_out_0.lora_down.weight";
    EXPECT_TRUE(f->find(key)) << key;
    const auto back = read_lora(path, m->module());
    ASSERT_EQ(back.modules.size(), 8u);
    for (const auto &[name, lm] : lora.modules) {
      ASSERT_TRUE(back.modules.count(name)) << name;
      EXPECT_TRUE(torch::equal(back.modules.at(name).a, lm.a)) << name;
      EXPECT_TRUE(torch::equal(back.modules.at(name).b, lm.b)) << name;
      EXPECT_EQ(back.alpha_of(back.modules.at(name)), 8.0) << name;
    }
    auto fresh = open_dit(dit_dir("cogvideox_5b_tiny"), torch::kCPU);
    apply_lora(fresh->module(), back, false);
    EXPECT_TRUE(torch::equal(fresh->forward(x, t, text), with_lora));
  }
  fs::remove_all(base);
}

// bf16 autocast (ddptrainsink's precision on CUDA, and on CPU with precision=bf16): the mixed-dtype
// path (bf16 projections, float32 residual stream, norms and rotary) runs forward and backward with
// checkpointing for each layout; outputs near the float32 reference, finite gradients in float32.
void check_bf16(const std::string &name, const c10::Device &device) {
  auto m = open_dit(dit_dir(name), device);
  m->set_gradient_checkpointing(true);
  RefFile cases("dit/" + name + "/cases.safetensors");
  const std::string c = name == "cogvideox15_tiny" ? "b2_t4_h8_w12" : "b2_t3_h8_w12";
  auto x = cases.get("input." + c + ".hidden_states").to(device).requires_grad_(true);
  at::Tensor out;
  {
    AutocastGuard cast(true, device.is_cuda());
    out = m->forward(x, cases.get("input." + c + ".timestep").to(device),
                     cases.get("input." + c + ".encoder_hidden_states").to(device));
  }
  (out.to(torch::kFloat) * cases.get("cotangent." + c).to(device)).sum().backward();
  const double e = rel_l2(out.detach().cpu(), cases.get("output." + c));
  const double g = rel_l2(x.grad().cpu(), cases.get("grad_input." + c + ".hidden_states"));
  std::printf("%s bf16 autocast on %s: output %.2g, grad hidden_states %.2g\n", name.c_str(), device.str().c_str(), e, g);
  EXPECT_LT(e, 2e-2) << name;
  EXPECT_LT(g, 2e-2) << name;
  for (const auto &p : m->module().named_parameters(true)) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(p.value().grad().scalar_type(), torch::kFloat) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
}

TEST(CogVideoXTransformer, Bf16AutocastRunsEachLayout) {
  for (const std::string name : {"cogvideox_2b_tiny", "cogvideox_5b_tiny", "cogvideox15_tiny"}) check_bf16(name, torch::kCPU);
}
