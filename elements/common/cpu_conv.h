/* 3D convolution that takes oneDNN on CPU float whatever the batch size (torch TUs).
 *
 * at::conv3d sends CPU float convolutions of a single sample with few channels to its
 * native vol2col + GEMM path (a heuristic meant for tiny 2D inputs), which allocates
 * column buffers on every call and runs 2-3x slower than oneDNN on our shapes: one
 * clip in the VAE encoder, micro-batches or validation batches of 1 in the built-in
 * models. Results equal at::conv3d's to float rounding; autograd works through it.
 * Under CPU autocast it defers to at::conv3d, which autocast casts. */
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace videotrain {

inline bool cpu_autocast_on() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return at::autocast::is_autocast_enabled(at::kCPU);
#else
  return at::autocast::is_cpu_enabled();
#endif
}

inline at::Tensor conv3d_fast(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b, at::IntArrayRef stride,
                              at::IntArrayRef padding) {
  if (x.is_cpu() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && at::hasMKLDNN() &&
      !cpu_autocast_on())
    return at::mkldnn_convolution(x.contiguous(), w, b, padding, stride, {1, 1, 1}, 1);
  return at::conv3d(x, w, b, stride, padding);
}

}  // namespace videotrain
