/* Loading a module's parameters from a diffusers/transformers folder by name and shape, strictly,
 * and writing them back as such a folder (sharded safetensors with an index). Torch TUs only. */
#pragma once

#include <torch/torch.h>

#include <string>

#include "diffusers_folder.h"

namespace videotrain::models {

// Copies every parameter and persistent buffer of `m` from `folder` (stored F32, F16 or BF16,
// converted to the parameter's dtype). Strict: a tensor the module has and the folder lacks, one the
// folder has and the module lacks, or a shape that differs is an error naming the tensor and the
// folder (names of tensors the folder may lack for the module to still load, such as transformers'
// tied embeddings, go in `optional`). Throws std::runtime_error.
void load_strict(torch::nn::Module &m, const DiffusersFolder &folder, const std::vector<std::string> &optional = {});

// Writes config.json and the module's parameters as `<stem>.safetensors` in `dtype` (kFloat,
// kBFloat16, kHalf), or, when they exceed max_shard_bytes, as `<stem>-0000N-of-0000M.safetensors`
// shards with `<stem>.safetensors.index.json`, each shard converted and written on its own (memory:
// one shard). Returns the weights file name (the single file or the index). Throws.
std::string save_folder(torch::nn::Module &m, const std::string &dir, const std::string &config_json,
                        const std::string &stem, at::ScalarType dtype, uint64_t max_shard_bytes);

// A copy of a safetensors entry as a tensor (F32, F16, BF16, F64, I64, I32; the bytes copied into an
// aligned tensor, as a payload may start at any byte). Throws naming the entry for other dtypes.
at::Tensor tensor_of(const SafetensorsEntry &e);
// A tensor as a safetensors tensor to write, converted to `dtype` (kFloat, kBFloat16, kHalf) on the CPU.
SafetensorsOutTensor out_tensor(const std::string &name, const at::Tensor &t, at::ScalarType dtype = at::kFloat);

// "bf16" / "fp16" / "fp32" (also bfloat16, float16, float32); false for anything else.
bool parse_save_dtype(const std::string &name, at::ScalarType *out);

}  // namespace videotrain::models
