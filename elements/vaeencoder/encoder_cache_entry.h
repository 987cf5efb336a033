/* The encoder's side of vaeencoder's latent cache (latent_cache.h holds the lookups and writes):
 * the encoder's part of every key, and a clip's tensors as a cache entry and back, checked.
 * Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "latent_store.h"
#include "vae_engine.h"

namespace videotrain::vae {

class VaeEncoder;

// The encoder's part of every key: the model's content (digests of config.json and the weights, or
// of the TorchScript file), the encoder's cache name, dtype, device type, chunking, tiles, norm-scope
// and condition. Reads every file; "" with *why when one cannot be read.
std::string encoder_cache_key(const EngineOptions &o, const VaeEncoder &enc, const std::string &dtype_name, bool cuda,
                              std::string *why);

// The moments entry of a clip of T frames of W x H (0: size unknown): float32 [1, 2C, t, h, w],
// with -1 where the encoder cannot tell in advance (TorchScript models).
TensorSpec moments_spec(const VaeEncoder &enc, int T, int W, int H);

// What a finished clip leaves for the cache: its raw moments (any dtype and device), and with
// condition= its condition (float32, CPU) and the frames it was made from (uint8 [n, H, W, 3], CPU).
struct CachedClip {
  at::Tensor moments, condition, condition_frames;
};
CacheEntry cache_entry_of(const CachedClip &clip);
// The entry's tensors, checked against what the engine with `condition` makes: moments float32
// [1, C, t, h, w], condition float32 [tc + C, t, h, w], condition_frames uint8 [n, H, W, 3]. False
// with *why naming what does not fit.
bool cached_clip_of(const CacheEntry &entry, Condition condition, CachedClip *out, std::string *why);

}  // namespace videotrain::vae
