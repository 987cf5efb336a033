/* Training Wan 2.1 I2V / FLF2V (image encoder states through the image path) and Wan 2.2 TI2V 5B
 * (expand_timesteps: the clean first latent frame at timestep 0, left out of the loss).
 * - One native training step of each against diffusers (tests/reference/wan_i2v_condition/
 *   training_{i2v,flf2v,ti2v}.safetensors, generate.py beside them): loss and every parameter gradient.
 * - The errors: image_embeds missing, unexpected or misshapen; TI2V given a last frame or a folder
 *   without expand_timesteps; LoRA on the image path's modules (add_k_proj, add_v_proj) trains them.
 * - 1 rank x batch 4 == 2 ranks x batch 2 (Gloo, the binary started once per rank) on the tiny I2V
 *   folder, and the run's export reproduces the trained model's forward. With VIDEOTRAIN_I2V_EXPORT_OUT
 *   the export and that forward's inputs and output are written there (tests/interop/
 *   diffusers_wan_i2v_condition.py loads the folder with diffusers and compares), and the LoRA test's file.
 * VIDEOTRAIN_I2V_CONDITION_REFERENCE names another folder of the reference files (the interop test's
 * live ones). */
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "../ddptrainsink/ddp_ranks.h"
#include "../models/ref_cases.h"
#include "ddptrainsink/trainer_engine.h"
#include "models/lora.h"
#include "models/native_model.h"
#include "models/train_model.h"
#include "models/weights_io.h"
#include "multirank.h"
#include "safetensors.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::models;
using modeltest::RefFile;
using modeltest::rel_l2;
namespace fs = std::filesystem;

using vttest::expect_error;

namespace {

std::string ref_folder() {
  const char *live = std::getenv("VIDEOTRAIN_I2V_CONDITION_REFERENCE");
  return live && *live ? std::string(live) : vttest::reference_dir() + "/wan_i2v_condition";
}
std::string i2v_dir() { return vttest::reference_dir() + "/dit/wan21_i2v_tiny"; }

ModelInputs inputs_of(const RefFile &r) {
  ModelInputs in;
  in.latents = r.get("x0");
  in.condition = r.get("condition");
  if (r.has("image_embeds")) in.image_embeds = r.get("image_embeds");
  in.text_embeds = r.get("text_embeds");
  in.text_mask = r.get("text_mask");
  const auto ids = r.get("sample_ids");
  for (int64_t i = 0; i < ids.numel(); i++) in.sample_ids.push_back(static_cast<uint64_t>(ids[i].item<int64_t>()));
  in.epoch = static_cast<unsigned>(std::stoul(r.meta("epoch")));
  return in;
}

// A pipeline folder for the tiny TI2V transformer: model_index.json with expand_timesteps, transformer/.
std::string ti2v_pipeline(const vttest::TempDir &tmp) {
  const fs::path dir = tmp.file("ti2v");
  fs::create_directories(dir / "transformer");
  for (const char *f : {"config.json", "diffusion_pytorch_model.safetensors"})
    fs::copy_file(vttest::reference_dir() + "/dit/wan22_ti2v_tiny/" + f, dir / "transformer" / f);
  vttest::write_file((dir / "model_index.json").string(), R"({"_class_name": "WanPipeline", "expand_timesteps": true})");
  return (dir / "transformer").string();
}

}  // namespace

TEST(WanI2VTraining, StepsMatchDiffusers) {
  vttest::TempDir tmp;
  const std::string ti2v = ti2v_pipeline(tmp);
  for (const auto &[name, dir] : {std::pair<std::string, std::string>{"i2v", i2v_dir()},
                                  {"flf2v", ref_folder() + "/transformer_flf2v"},
                                  {"ti2v", ti2v}}) {
    SCOPED_TRACE(name);
    const RefFile r(ref_folder() + "/training_" + name + ".safetensors", RefFile::kAbsolute);
    ASSERT_TRUE(r.ok());
    ModelOptions o;
    o.seed = std::stoull(r.meta("seed"));
    auto model = make_model(dir, ModelDims{}, torch::kCPU, o);
    const ModelInputs in = inputs_of(r);
    const auto loss = model->training_step(in);
    const double le = rel_l2(loss.reshape({1}), r.get("loss"));
    EXPECT_LT(le, 1e-5) << loss.item<double>() << " vs " << r.get("loss");
    loss.backward();
    double worst = 0, image_path = 0;
    std::string worst_name;
    size_t n = 0;
    double key_bias = 0;
    for (auto &[pname, p] : model->named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << pname;
      const double e = rel_l2(p.grad(), r.get("grad." + pname));
      // Cross-attention's text keys (to_k, norm_k): most of the 512 text rows are the same zero padding,
      // so their keys are equal and their gradients sums of cancelling terms (a shift common to every key
      // softmax cancels), where float32 rounding weighs more (up to 4e-4 on LibTorch 2.15): 1e-3.
      if (pname.find("attn2.to_k.") != std::string::npos || pname.find("attn2.norm_k.") != std::string::npos) {
        key_bias = std::max(key_bias, e);
        n++;
        continue;
      }
      if (e > worst) worst = e, worst_name = pname;
      if (pname.find("add_k_proj") != std::string::npos || pname.find("image_embedder") != std::string::npos)
        image_path += p.grad().norm().item<double>();
      n++;
    }
    EXPECT_GT(n, 30u);
    EXPECT_LT(worst, 1e-4) << worst_name;
    EXPECT_LT(key_bias, 1e-3);
    if (name != "ti2v") EXPECT_GT(image_path, 1e-4) << "the image path's gradients";
    std::printf("FIGURE %s training step vs diffusers: loss rel %.3g, worst parameter gradient %.3g (%s; attn2.to_k, "
                "norm_k %.3g), %zu parameters\n", name.c_str(), le, worst, worst_name.c_str(), key_bias, n);
    // What each layout takes reaches the loss; validation takes it too.
    ModelInputs other = in;
    if (name == "ti2v") {
      other.latents = in.latents.clone();
      other.latents.select(2, 0).mul_(-1);  // another first frame, the same frames after it
    } else {
      other.image_embeds = in.image_embeds.flip(0);
    }
    EXPECT_GT(std::abs(model->training_step(other).item<double>() - loss.item<double>()), 1e-6);
    const auto v = model->validation_step(in, {1, 2});
    EXPECT_EQ(v.sizes(), (std::vector<int64_t>{2}));
    EXPECT_GT((v - model->validation_step(other, {1, 2})).abs().max().item<double>(), 1e-7);
    if (name == "ti2v") {
      // Without a condition TI2V trains text-to-video: every frame noisy and in the loss.
      ModelInputs t2v = in;
      t2v.condition = at::Tensor();
      EXPECT_GT(std::abs(model->training_step(t2v).item<double>() - loss.item<double>()), 1e-6);
    }
  }
}

TEST(WanI2VTraining, ErrorsNameWhatToChange) {
  const RefFile r(ref_folder() + "/training_i2v.safetensors", RefFile::kAbsolute);
  ASSERT_TRUE(r.ok());
  const ModelInputs in = inputs_of(r);
  auto i2v = make_model(i2v_dir(), ModelDims{}, torch::kCPU, ModelOptions{});
  ModelInputs none = in;
  none.image_embeds = at::Tensor();
  expect_error([&] { i2v->training_step(none); }, "put an imageencoder");
  ModelInputs wide = in;
  wide.image_embeds = torch::zeros({2, 1, 5, 16});
  expect_error([&] { i2v->training_step(wide); }, "takes [2, 1, N, 24]");
  ModelInputs two = in;
  two.image_embeds = torch::cat({in.image_embeds, in.image_embeds}, 1);
  expect_error([&] { i2v->training_step(two); }, "one image per sample");
  auto flf2v = make_model(ref_folder() + "/transformer_flf2v", ModelDims{}, torch::kCPU, ModelOptions{});
  expect_error([&] { flf2v->training_step(in); }, "FLF2V: first and last frame per sample");
  expect_error([&] { flf2v->training_step(none); }, "Wan 2.1 FLF2V transformer");
  // Wan 2.2 I2V (condition channels, no image path) with image embeddings.
  auto wan22 = make_model(ref_folder() + "/transformer", ModelDims{}, torch::kCPU, ModelOptions{});
  expect_error([&] { wan22->training_step(in); }, "remove the imageencoder");
  // TI2V: a last frame given; the folder without its pipeline's expand_timesteps.
  const RefFile t(ref_folder() + "/training_ti2v.safetensors", RefFile::kAbsolute);
  vttest::TempDir tmp;
  auto ti2v = make_model(ti2v_pipeline(tmp), ModelDims{}, torch::kCPU, ModelOptions{});
  ModelInputs last = inputs_of(t);
  last.condition = last.condition.clone();
  last.condition.narrow(1, 0, 4).select(2, 2).fill_(1);
  expect_error([&] { ti2v->training_step(last); }, "set vaeencoder condition=first-frame");
  auto bare = make_model(vttest::reference_dir() + "/dit/wan22_ti2v_tiny", ModelDims{}, torch::kCPU, ModelOptions{});
  expect_error([&] { bare->training_step(inputs_of(t)); }, "\"expand_timesteps\": true");
  // expand_timesteps beside an I2V layout: refused at start.
  fs::create_directories(tmp.file("bad/transformer"));
  for (const char *f : {"config.json", "diffusion_pytorch_model.safetensors"})
    fs::copy_file(i2v_dir() + "/" + f, tmp.file(std::string("bad/transformer/") + f));
  vttest::write_file(tmp.file("bad/model_index.json"), R"({"expand_timesteps": true})");
  expect_error([&] { make_model(tmp.file("bad/transformer"), ModelDims{}, torch::kCPU, ModelOptions{}); },
               "is not that layout");
}

TEST(WanI2VTraining, LoraOnTheImagePathTrains) {
  const RefFile r(ref_folder() + "/training_i2v.safetensors", RefFile::kAbsolute);
  ASSERT_TRUE(r.ok());
  ModelOptions o;
  o.lora_rank = 2;
  o.lora_targets = "add_k_proj,add_v_proj,to_q";
  auto model = make_model(i2v_dir(), ModelDims{}, torch::kCPU, o);
  {  // lora_B starts at zero: one plain step first makes lora_A's gradients nonzero too
    torch::NoGradGuard ng;
    for (auto &[n, p] : model->named_parameters())
      if (n.find("lora_B") != std::string::npos) p.normal_(0, 0.1);
  }
  model->training_step(inputs_of(r)).backward();
  size_t image_path = 0;
  for (auto &[n, p] : model->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << n;
    EXPECT_GT(p.grad().norm().item<double>(), 0.0) << n;
    image_path += n.find("add_k_proj") != std::string::npos || n.find("add_v_proj") != std::string::npos;
  }
  EXPECT_EQ(image_path, 8u);  // 2 blocks x 2 modules x (A, B)
  vttest::TempDir tmp;
  ASSERT_TRUE(model->export_folder(tmp.file("lora"), "bf16"));
  std::string err;
  auto f = SafetensorsFile::open(tmp.file("lora/pytorch_lora_weights.safetensors"), &err);
  ASSERT_TRUE(f) << err;
  EXPECT_TRUE(f->find("transformer.blocks.1.attn2.add_k_proj.lora_A.weight")) << "the LoRA file names the image path";
  if (const char *o = std::getenv("VIDEOTRAIN_I2V_EXPORT_OUT"); o && *o)  // for diffusers' load_lora_adapter
    fs::copy_file(tmp.file("lora/pytorch_lora_weights.safetensors"), fs::path(o) / "lora_i2v.safetensors");
}

namespace {

constexpr int kSteps = 3;

TrainerConfig i2v_config() {
  TrainerConfig c = ddptest::config();
  c.model = i2v_dir();
  c.lr = 1e-3;
  c.bucket_cap_mb = 25;
  return c;
}

// Sample k of `step`: latents [4, 2, 4, 4], its condition, one image's 5 states, 6 tokens of text in 512 rows.
ModelInputs sample_of(int step, int k) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(100 * step + k);
  ModelInputs in;
  in.latents = at::randn({1, 4, 2, 4, 4}, g);
  in.condition = at::randn({1, 8, 2, 4, 4}, g);
  in.image_embeds = at::randn({1, 1, 5, 24}, g);
  in.text_embeds = at::randn({1, 512, 32}, g);  // 6 tokens and the pipeline's padding to 512 rows
  in.text_mask = at::cat({at::ones({1, 6}, at::kLong), at::zeros({1, 506}, at::kLong)}, 1);
  in.sample_ids = {static_cast<uint64_t>(100 * step + k)};
  return in;
}

// Samples [first, first + m) of `step` in one micro-batch.
ProcessResult feed_i2v(TrainerEngine &e, int step, int first, int m) {
  std::vector<ModelInputs> parts;
  for (int k = first; k < first + m; k++) parts.push_back(sample_of(step, k));
  ModelInputs in;
  std::vector<at::Tensor> x, c, im, te, tm;
  for (auto &p : parts) {
    x.push_back(p.latents), c.push_back(p.condition), im.push_back(p.image_embeds);
    te.push_back(p.text_embeds), tm.push_back(p.text_mask);
    in.sample_ids.push_back(p.sample_ids[0]);
  }
  in.latents = at::cat(x), in.condition = at::cat(c), in.image_embeds = at::cat(im);
  in.text_embeds = at::cat(te), in.text_mask = at::cat(tm);
  BatchInfo info = ddptest::micro_info(step, 0, 1, static_cast<unsigned>(m));
  info.sample_ids = in.sample_ids;
  return e.process_inputs(in, info);
}

}  // namespace

// One rank of the two-rank run (started by the test below, never on its own): rank r trains samples
// [2r, 2r + 2) of each step.
TEST(WanI2VWorker, Rank) {
  const std::string out = vttest::env_or("VT_DDP_OUT", "");
  ASSERT_FALSE(out.empty()) << "run by WanI2VRanks only";
  auto c = i2v_config();
  c.timeout_s = 60;
  TrainerEngine e(c);
  ASSERT_TRUE(e.start()) << e.error();
  ASSERT_EQ(e.world_size(), 2);
  for (int s = 0; s < kSteps; s++) ASSERT_EQ(feed_i2v(e, s, 2 * e.rank(), 2), ProcessResult::kOk) << e.error();
  ddptest::write_params(out, e.parameters_cpu());
  e.stop();
}

TEST(WanI2VRanks, OneRankBatch4EqualsTwoRanksBatch2AndTheExportRunsTheSame) {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids{ddptest::spawn_worker("WanI2VWorker.Rank", "i2v", 0, port, dir.file("r0")),
                          ddptest::spawn_worker("WanI2VWorker.Rank", "i2v", 1, port, dir.file("r1"))};
  auto c = i2v_config();
  c.rank = 0;
  c.world_size = 1;
  c.checkpoint_dir = dir.file("ckpt");
  c.save_dtype = "fp32";
  TrainerEngine single(c);
  ASSERT_TRUE(single.start()) << single.error();
  for (int s = 0; s < kSteps; s++) ASSERT_EQ(feed_i2v(single, s, 0, 4), ProcessResult::kOk) << single.error();
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 120)) << "a rank hung";
  for (int w : st) ASSERT_TRUE(WIFEXITED(w) && WEXITSTATUS(w) == 0) << "rank failed: " << w;
  const auto want = single.parameters_cpu();
  for (const char *f : {"r0", "r1"}) ddptest::expect_params_near(ddptest::read_params(dir.file(f)), want, f);
  ASSERT_TRUE(single.finish()) << single.error();
  single.stop();
  // The export (fp32) is the trained model: our forward of it equals the weights' own.
  const std::string exported = dir.file("ckpt/transformer");
  auto dit = open_dit(exported, torch::kCPU);
  const ModelInputs s = sample_of(9, 0);
  const auto t = torch::tensor({600.0f});
  const auto img = s.image_embeds.reshape({-1, 5, 24});
  const auto y = dit->forward_image(torch::cat({s.latents, s.condition}, 1), t, s.text_embeds, img);
  auto first = open_dit(i2v_dir(), torch::kCPU);
  const double moved = rel_l2(first->forward_image(torch::cat({s.latents, s.condition}, 1), t, s.text_embeds, img), y);
  EXPECT_GT(moved, 1e-4) << "training moved the weights";
  {
    torch::NoGradGuard ng;
    for (auto &p : first->module().named_parameters(true)) {
      const auto &v = want.at(p.key());
      p.value().copy_(torch::from_blob(const_cast<float *>(v.data()), p.value().sizes(), torch::kFloat));
    }
  }
  EXPECT_LT(rel_l2(first->forward_image(torch::cat({s.latents, s.condition}, 1), t, s.text_embeds, img), y), 1e-6);
  if (const char *o = std::getenv("VIDEOTRAIN_I2V_EXPORT_OUT"); o && *o) {
    fs::copy(exported, fs::path(o) / "transformer", fs::copy_options::recursive);
    std::vector<SafetensorsOutTensor> out;
    for (const auto &[n, v] : {std::pair<std::string, at::Tensor>{"hidden_states", torch::cat({s.latents, s.condition}, 1)},
                               {"timestep", t}, {"encoder_hidden_states", s.text_embeds},
                               {"encoder_hidden_states_image", img}, {"output", y.detach()}})
      out.push_back(models::out_tensor(n, v.contiguous()));
    std::string err;
    ASSERT_TRUE(write_safetensors((fs::path(o) / "forward.safetensors").string(), out, {}, &err)) << err;
  }
}
