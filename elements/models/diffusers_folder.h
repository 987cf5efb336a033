/* A model folder as diffusers and transformers write it: config.json and the weights, either one
 * `<stem>.safetensors` or shards `<stem>-0000N-of-0000M.safetensors` named by
 * `<stem>.safetensors.index.json` ({"metadata": {...}, "weight_map": {tensor: shard}}). The shards
 * are mapped, not read: a tensor's bytes are touched only when it is copied into the model, one
 * shard's pages at a time. No torch here (the fuzz targets build it alone). */
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "safetensors.h"

namespace videotrain::models {

struct DiffusersFolder {
  std::string dir;
  std::string config_text;  // config.json as read
  std::string class_name;   // its "_class_name" (diffusers) or architectures[0] (transformers), or ""
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsEntry *> tensors;  // every tensor of every shard, by name
  std::string weights_description() const;  // "diffusion_pytorch_model.safetensors" or "N shards of ..."
};

// Opens `dir` (stem "diffusion_pytorch_model" for diffusers, "model" for transformers). Errors name
// the file: a missing config or weights file, a shard the index names that is missing or does not
// hold the tensor the index says, a tensor in two files, a file that is not a regular file, a
// config or index over 16 MiB or not JSON.
bool open_diffusers_folder(const std::string &dir, const std::string &stem, DiffusersFolder *out, std::string *error);

// The shard index JSON text for tensors laid out in files; total_size is the bytes of all tensors.
std::string shard_index_json(const std::map<std::string, std::string> &weight_map, uint64_t total_size);
// Parses an index: weight_map into *out; false with a reason (for the fuzz target and the loader).
bool parse_shard_index(const std::string &text, std::map<std::string, std::string> *out, std::string *error);

}  // namespace videotrain::models
