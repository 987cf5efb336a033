/* LoRA on the native Wan model against PEFT's formula around diffusers' model
 * (tests/reference/dit/wan_t2v_tiny_lora): the same outputs and LoRA gradients from the diffusers file
 * (alpha from its metadata), the original/ComfyUI file (alpha per module) and diffusers' own conversion
 * of it (alpha folded in); LoRA files that do not fit are errors naming the key. */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <cstring>
#include <map>
#include <unistd.h>

#include "models/layers.h"
#include "models/lora.h"
#include "models/native_model.h"
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
