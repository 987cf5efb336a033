/* torch::jit::load for our engines, with TorchScript's CPU fuser off (torch TUs).
 *
 * Where LibTorch has LLVM (Debian trixie's 2.6, some source builds), the profiling
 * executor fuses CPU graphs with NNC at the third call, and LLVM took minutes, or
 * forever, on the backward graph of a few Conv3d/GroupNorm blocks: training stalled
 * at step 3, in Python as much as here. Without LLVM (bookworm's 1.13)
 * nothing is fused on CPU anyway, so turning it off costs nothing there.
 * VIDEOTRAIN_JIT_CPU_FUSION=1 keeps it on. The setting is process-wide; CUDA fusion
 * is untouched. */
#pragma once

#include <torch/script.h>

#include <cstdlib>
#include <string>

namespace torch::jit {
// Exported by libtorch_cpu (Python's torch._C._jit_override_can_fuse_on_cpu and
// _jit_can_fuse_on_cpu); their header, codegen/fuser/interface.h, is not installed by
// every LibTorch package.
TORCH_API void overrideCanFuseOnCPU(bool value);
TORCH_API bool canFuseOnCPU();
}  // namespace torch::jit

namespace videotrain {

inline bool jit_cpu_fusion_wanted() {
  const char *v = std::getenv("VIDEOTRAIN_JIT_CPU_FUSION");
  return v && std::string(v) == "1";
}

inline torch::jit::Module jit_load(const std::string &path, const c10::Device &device) {
  torch::jit::overrideCanFuseOnCPU(jit_cpu_fusion_wanted());
  return torch::jit::load(path, device);
}

}  // namespace videotrain
