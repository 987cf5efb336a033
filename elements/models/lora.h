/* LoRA files in the three namings users meet, mapped onto the native models' Linear layers
 * (layers.h LinearImpl::add_lora): diffusers/PEFT (`transformer.blocks.0.attn1.to_q.lora_A.weight`,
 * alpha in the file's lora_adapter_metadata, else alpha = rank), the original Wan naming ComfyUI
 * loads (`diffusion_model.blocks.0.self_attn.q.lora_A.weight` or lora_down/lora_up, `.alpha`), and
 * kohya/musubi (`lora_unet_blocks_0_self_attn_q.lora_down.weight`, `.lora_up.weight`, `.alpha`).
 * The name map between diffusers' and the original names is the one table below, per family.
 * Torch TUs only. */
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "lora_names.h"

namespace videotrain::models {

struct LoraModule {
  at::Tensor a, b;     // [rank, in], [out, rank] as stored (float32)
  double alpha = -1;   // -1: the file's global alpha
};

struct LoraFile {
  std::string path, naming;                   // naming: diffusers | comfyui | kohya
  std::map<std::string, LoraModule> modules;  // by the model's (diffusers) module name
  double alpha = -1;                          // global (diffusers metadata); -1: alpha = rank
  int64_t rank = 0;
  // The model's Linears as (in, out) by name, blocks' as blocks.{i}.<name> (transformer_blocks.{i}.
  // for CogVideoX): from the model (lora_of, read_lora) or the file's videotrain.linear_shapes
  // metadata, which write_lora_file stores. Sizes the zero adapters a naming's loaders require.
  std::map<std::string, std::pair<int64_t, int64_t>> shapes;
  double alpha_of(const LoraModule &m) const;  // the module's, else the file's, else its rank
};

// Reads `path` into diffusers' module names (Wan's name table, CogVideoX's; no model needed); alpha
// from diffusers' lora_adapter_metadata (prefixed transformer. or not, alpha_pattern, use_rslora) or
// the .alpha keys. Adapters whose A and B are both zero (the padding write_lora_file adds) are dropped
// when the file has others. Throws std::runtime_error naming the key: a naming it does not recognise,
// a module no Wan model has, a rank that differs between modules, an A without its B, DoRA.
LoraFile read_lora_file(const std::string &path);
// The same, checked against `model`'s Linears: a module it lacks or shapes that do not fit (a LoRA
// for another model) are errors naming the module.
LoraFile read_lora(const std::string &path, torch::nn::Module &model);
// Writes `lora` in `naming` so that the loaders of that naming take it with the same deltas:
// diffusers (PEFT keys, raw A and B, r and lora_alpha in the metadata as diffusers' save_lora_weights
// writes them), comfyui (original Wan names; blocks' modules with .alpha, the others with alpha/rank
// folded into A, as diffusers' converter reads no alpha there; a zero adapter on blocks.0.self_attn.q
// when no block has one, which that converter needs) or kohya (lora_unet_ names, lora_down/lora_up,
// .alpha; every module of blocks 0..the last with one, zero where the LoRA has none, as diffusers'
// musubi converter requires). Throws where no file in `naming` loads (lora_naming_problem) or a zero
// adapter's size is unknown.
void write_lora_file(const std::string &path, const LoraFile &lora, const std::string &naming);
// Throws, naming the naming to use, when the model's attached LoRA cannot be written in `format`
// (diffusers | comfyui | kohya | all): the trainer's check at start, before any step.
void check_lora_format(torch::nn::Module &model, const std::string &format);
// The model's attached LoRA as a file's contents (tensors shared, alpha = scale * rank).
LoraFile lora_of(torch::nn::Module &model);

// Attaches the file's LoRA to the model's Linears (scale alpha / rank, as PEFT); the tensors
// become the modules' lora_A / lora_B weights. trainable: they take gradients.
void apply_lora(torch::nn::Module &model, const LoraFile &lora, bool trainable);

// The model's LoRA tensors under PEFT's names in diffusers' file (`transformer.` + module +
// `.lora_A.weight`), the tensors themselves (not copies).
std::vector<std::pair<std::string, at::Tensor>> lora_parameters(torch::nn::Module &model);

}  // namespace videotrain::models
