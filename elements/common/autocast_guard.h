/* AutocastGuard: bf16 autocast for a scope (the forward pass), on CUDA or on CPU, restoring
 * the previous autocast state when it ends. LibTorch 2.4 replaced the per-device setters
 * with ones that take the device type. Torch TUs only. */
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace videotrain {

class AutocastGuard {
 public:
  AutocastGuard(bool on, bool cuda) : on_(on), cuda_(cuda) {
    if (!on_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    const auto dev = cuda_ ? at::kCUDA : at::kCPU;
    prev_enabled_ = at::autocast::is_autocast_enabled(dev);
    prev_dtype_ = at::autocast::get_autocast_dtype(dev);
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::set_autocast_dtype(dev, at::kBFloat16);
#else
    if (cuda_) {
      prev_enabled_ = at::autocast::is_enabled();
      prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_enabled(true);
      at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    } else {
      prev_enabled_ = at::autocast::is_cpu_enabled();
      prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    }
#endif
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!on_) return;
    // The cast weights are cached per autocast region: dropped when the outermost ends.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    const auto dev = cuda_ ? at::kCUDA : at::kCPU;
    at::autocast::set_autocast_enabled(dev, prev_enabled_);
    at::autocast::set_autocast_dtype(dev, prev_dtype_);
#else
    if (cuda_) {
      at::autocast::set_enabled(prev_enabled_);
      at::autocast::set_autocast_gpu_dtype(prev_dtype_);
    } else {
      at::autocast::set_cpu_enabled(prev_enabled_);
      at::autocast::set_autocast_cpu_dtype(prev_dtype_);
    }
#endif
  }
  AutocastGuard(const AutocastGuard &) = delete;
  AutocastGuard &operator=(const AutocastGuard &) = delete;

 private:
  bool on_, cuda_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

}  // namespace videotrain
