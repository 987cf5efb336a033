/* What videotrain-model's commands share: option parsing, reading named inputs and writing named
 * outputs (safetensors), and the kind of model folder config.json says a folder is. */
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/diffusers_folder.h"
#include "safetensors.h"

namespace videotrain::model_tool {

int usage();
// Takes `name VALUE` out of args (def when absent); `name` alone for flag().
std::string opt(std::vector<std::string> &args, const std::string &name, const std::string &def);
bool flag(std::vector<std::string> &args, const std::string &name);
std::string human(double bytes);

// A folder's parameters, counted from its weight headers (tensor `skip` left out: a tied copy), and
// how many of them, in how many bytes, each stored dtype holds.
struct StoredParams {
  uint64_t total = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_dtype;  // dtype -> (parameters, bytes)
};
StoredParams stored_params(const models::DiffusersFolder &folder, const std::string &skip = "");
// "parameters: N (x B)" and a "  stored DTYPE: ..." line per dtype.
void print_stored_params(const StoredParams &p);

// What config.json says a folder holds: a diffusers transformer (`_class_name` *Transformer*), a
// diffusers VAE (`_class_name` AutoencoderKL*), a transformers T5 / umT5 encoder (`architectures`
// or `model_type`), a transformers CLIP vision encoder (CLIPVision* or model_type clip_vision_model).
// Throws naming the file and the kinds this tool takes for anything else.
enum class FolderKind { Dit, Vae, TextEncoder, ImageEncoder };
FolderKind folder_kind(const std::string &dir, std::string *class_name);

// IN's tensor `name` (any stored dtype, on the CPU); undefined when absent and not required. A
// required one that is absent is an error naming the file, the tensor and `what_to_give`.
at::Tensor input_tensor(const SafetensorsFile &f, const std::string &name, bool required,
                        const std::string &what_to_give);
// An output tensor in its own dtype (float32, float64, int64; others as float32).
SafetensorsOutTensor output_tensor(const std::string &name, const at::Tensor &t);
void write_outputs(const std::string &path, const std::vector<SafetensorsOutTensor> &out, const std::string &model);

// The commands of the other files.
int text_info(const std::string &dir);
int text_forward(std::vector<std::string> args);
int image_info(const std::string &dir);
int image_forward(std::vector<std::string> args);  // forward DIR IN OUT [--processor DIR] ...
int vae_info(const std::string &dir);
int vae_command(std::vector<std::string> args);        // vae encode|decode DIR IN OUT
int scheduler_command(std::vector<std::string> args);  // scheduler KIND OUT ...
int timesteps_command(std::vector<std::string> args);  // timesteps (--ids ... | --draws ...) [options]: JSON
int export_command(std::vector<std::string> args);     // export STEP_OR_CHECKPOINT_DIR OUT ...
int sample_command(std::vector<std::string> args);     // sample DIR IN OUT [--model-2 DIR2] ...: latents
int lora_info(const std::string &path);                 // info FILE.safetensors (a LoRA)
int config_info(const std::string &path);               // info CONFIG.json (a Wan transformer's)

// What info's memory formula needs of a transformer (model_tool_memory.cpp).
struct ParamCounts {
  uint64_t total = 0;             // every parameter
  uint64_t linear = 0, rows = 0;  // Linear weights (what base-dtype=fp8 stores) and their output rows
  uint64_t lora32 = 0;            // a rank-32 LoRA on ddptrainsink's default lora-targets
  uint64_t largest_block = 0;     // the most parameters one transformer block holds (sharding=full gathers one)
  void add_linear(const std::string &module, uint64_t in, uint64_t out);
};
// Per-GPU memory of weights, gradients and AdamW state for base dtype fp32 | bf16 | fp8 x (full
// fine-tune | LoRA rank 32), and for ddptrainsink's sharding=optimizer|full over 2 and 8 ranks, from
// the formulas it prints.
void print_memory_table(const ParamCounts &c);

}  // namespace videotrain::model_tool
