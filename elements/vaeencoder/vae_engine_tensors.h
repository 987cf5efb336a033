/* Tensor-level entry points of the VAE engine, for tests and benchmarks (they use torch). */
#pragma once

#include <ATen/core/Tensor.h>

#include "vae_engine.h"

namespace videotrain::vae {

// uint8 frames [T, H, W, 3] -> [1, 3, T, H, W] float32 in [-1, 1], exactly as the streaming path does it.
at::Tensor dequantize_frames(const at::Tensor &frames_u8);

// Encoder output for a whole clip [1, 3, T, H, W] (float, in [-1, 1]) with the engine's tiles,
// in temporal chunks of `chunk_frames` (-1: the engine's chunk-frames; >= T: one pass).
// For the native encoder this is the raw moments [1, 2C, t, h, w]; for TorchScript the
// encoder's output. float32 on CPU.
at::Tensor encode_raw(VaeEngine &engine, const at::Tensor &video, int chunk_frames = -1);

// The latent the engine emits for this clip ([C, t, h, w], float32 on CPU): the raw output
// through the engine's `latent` choice; noise drawn from the engine's seed and the sample id
// unless given.
at::Tensor latent_from_raw(VaeEngine &engine, const at::Tensor &raw, uint64_t sample_id,
                           const at::Tensor &noise = at::Tensor());

}  // namespace videotrain::vae
