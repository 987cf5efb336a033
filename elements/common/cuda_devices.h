/* How many CUDA devices this process's LibTorch can use: the count resolve_device() wants.
 * Include only from torch translation units. */
#pragma once

#include <torch/cuda.h>

namespace videotrain {

inline int visible_cuda_devices() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

}  // namespace videotrain
