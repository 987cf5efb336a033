#include "encoder_cache_entry.h"

#include <ATen/ATen.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <sstream>
#include <vector>

#include "models/vae/vae_encoder.h"
#include "tensor_buffer.h"

namespace videotrain::vae {

std::string encoder_cache_key(const EngineOptions &o, const VaeEncoder &enc, const std::string &dtype_name, bool cuda,
                              std::string *why) {
  // The model's content: every file of a VAE folder that describes or holds weights, by digest.
  std::string content;
  std::vector<std::string> files;
  struct stat st {};
  if (::stat(o.model.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    for (const auto &e : std::filesystem::directory_iterator(o.model)) {
      const std::string name = e.path().filename().string();
      if (name == "config.json" || (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0))
        files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(o.model);
  }
  for (const auto &f : files) {
    std::string digest;
    if (!sha256_file(f, &digest, why)) return "";
    content += std::filesystem::path(f).filename().string() + " " + digest + "\n";
  }
  std::ostringstream k;
  // Bump the version when the encoder's arithmetic changes what it computes.
  k << "vaeencoder encode-1\nfamily " << enc.cache_name() << "\n"
    << content << "dtype " << dtype_name << " device " << (cuda ? "cuda" : "cpu") << "\nchunk-frames "
    << (enc.native() && enc.uses_chunk_frames() ? o.chunk_frames : 0) << " per-frame " << o.per_frame << "\ntiles "
    << o.tile_height << "x" << o.tile_width << " overlap " << o.tile_overlap_height << " " << o.tile_overlap_width
    << "\nnorm-scope " << (o.norm_scope == NormScope::Clip ? "clip" : "chunk") << "\n";
  // Only with a condition, so that the entries written without one keep their keys.
  if (o.condition != Condition::None)
    k << "condition " << (o.condition == Condition::First ? "first-frame" : "first-last-frame") << " encode-2\n";
  return k.str();
}

TensorSpec moments_spec(const VaeEncoder &enc, int T, int W, int H) {
  TensorSpec s{"moments", "float32", {1, -1, -1, -1, -1}};
  if (!enc.native()) return s;
  const int tc = enc.temporal_compression(), sc = enc.spatial_compression();
  s.shape[1] = 2 * enc.latent_channels();
  if (T >= 1 && (T - 1) % tc == 0) s.shape[2] = (T - 1) / tc + 1;
  if (H > 0 && H % sc == 0) s.shape[3] = H / sc;
  if (W > 0 && W % sc == 0) s.shape[4] = W / sc;
  return s;
}

CacheEntry cache_entry_of(const CachedClip &clip) {
  CacheEntry e;
  e.tensors = {cached_tensor_of("moments", clip.moments.to(at::kCPU, at::kFloat))};
  if (clip.condition.defined()) e.tensors.push_back(cached_tensor_of("condition", clip.condition));
  if (clip.condition_frames.defined()) e.tensors.push_back(cached_tensor_of("condition_frames", clip.condition_frames));
  return e;
}

namespace {

// The entry's tensor `name`, or nullopt with *why ("the entry holds no ..." + `missing`).
std::optional<at::Tensor> entry_tensor(const CacheEntry &entry, const std::string &name, const std::string &missing,
                                       std::string *why) {
  const CachedTensor *c = entry.find(name);
  if (!c) {
    *why = "the entry holds no " + name + missing;
    return std::nullopt;
  }
  return tensor_of_cached(*c, why);
}

}  // namespace

bool cached_clip_of(const CacheEntry &entry, Condition condition, CachedClip *out, std::string *why) {
  std::optional<at::Tensor> raw = entry_tensor(entry, "moments", "", why);
  if (!raw) return false;
  if (raw->dim() != 5 || raw->size(0) != 1 || raw->scalar_type() != at::kFloat) {
    *why = "the entry's moments are not a float32 [1, C, t, h, w] tensor";
    return false;
  }
  out->moments = *raw;
  if (condition == Condition::None) return true;
  std::optional<at::Tensor> cond = entry_tensor(entry, "condition", " (condition=) beside its moments", why);
  if (!cond) return false;
  if (cond->dim() != 4 || cond->sizes().slice(1) != raw->sizes().slice(2) || cond->scalar_type() != at::kFloat) {
    *why = "the entry's condition is not a float32 [tc + C, t, h, w] tensor beside its moments";
    return false;
  }
  std::optional<at::Tensor> frames = entry_tensor(entry, "condition_frames", " (condition=) beside its moments", why);
  if (!frames) return false;
  const int64_t n = condition == Condition::FirstLast ? 2 : 1;
  if (frames->dim() != 4 || frames->size(0) != n || frames->size(3) != 3 || frames->scalar_type() != at::kByte) {
    *why = "the entry's condition_frames are not uint8 [" + std::to_string(n) + ", H, W, 3]";
    return false;
  }
  out->condition = *cond;
  out->condition_frames = *frames;
  return true;
}

}  // namespace videotrain::vae
