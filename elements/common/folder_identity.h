/* A model folder's identity for cache keys without reading gigabytes of weights. No torch. */
#pragma once

#include <string>

namespace videotrain {

// SHA-256 (hex) over config.json's content and each weights file's name, size and modification
// time (*.safetensors, model.safetensors.index.json): a changed file is a new key, never a stale
// hit. False with *error naming the file or folder.
bool folder_identity(const std::string &dir, std::string *out, std::string *error);

}  // namespace videotrain
