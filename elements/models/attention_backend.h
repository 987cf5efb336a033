/* Which kernel runs the native transformers' attention (ddptrainsink, ddpvalsink, ddpsampler
 * `attention-backend`, videotrain-model --attention-backend). No torch: element configs hold one.
 *   automatic  LibTorch's own choice (scaled_dot_product_attention's dispatcher on 2.x: flash, then
 *              memory-efficient, for CUDA; the fused CPU kernel from 2.2), else the chunked kernel.
 *   flash      FlashAttention-2 (CUDA bf16/fp16; the CPU flash kernel from LibTorch 2.2).
 *   cudnn      cuDNN's fused attention (CUDA, LibTorch 2.5 or later).
 *   efficient  the memory-efficient (xFormers-style) kernel (CUDA).
 *   math       our own kernel on every version: whole float32 scores while they fit 256 MiB, else
 *              queries in chunks whose backward recomputes them (LibTorch's math backend would keep
 *              the whole [tokens x tokens] probabilities: 51 GB for Wan 1.3B at 480p). */
#pragma once

#include <string>

namespace videotrain {

enum class AttentionBackend { automatic = 0, flash = 1, cudnn = 2, efficient = 3, math = 4 };  // property values

// The GEnumValue entries of the elements' `attention-backend` property (VIDEOTRAIN_DEFINE_ENUM), in
// AttentionBackend's order; and the blurb the validator's and sampler's property share.
#define VIDEOTRAIN_ATTENTION_BACKEND_ENUM_VALUES                                                 \
  {0, "LibTorch's choice (2.x: its fused kernels), else the chunked kernel", "auto"},           \
      {1, "FlashAttention-2 (CUDA bf16/fp16; CPU from LibTorch 2.2)", "flash"},                 \
      {2, "cuDNN fused attention (CUDA, LibTorch 2.5+)", "cudnn"},                              \
      {3, "Memory-efficient kernel (CUDA)", "efficient"},                                       \
      {4, "Our kernel: whole scores while they fit 256 MiB, else query chunks", "math"}
#define VIDEOTRAIN_ATTENTION_BACKEND_FOLLOWER_BLURB                                                              \
  "Native models: the attention kernel on this element's device. auto leaves it to LibTorch (2.x: flash, then " \
  "memory-efficient on CUDA; its fused CPU kernel from 2.2), flash/cudnn/efficient force one (an error where "  \
  "this LibTorch or device has none), math is our own kernel (exact, memory-bounded; the only other choice on " \
  "LibTorch 1.13)"

inline const char *attention_backend_name(AttentionBackend b) {
  switch (b) {
    case AttentionBackend::flash: return "flash";
    case AttentionBackend::cudnn: return "cudnn";
    case AttentionBackend::efficient: return "efficient";
    case AttentionBackend::math: return "math";
    default: return "auto";
  }
}

// false for an unknown name.
inline bool parse_attention_backend(const std::string &s, AttentionBackend *out) {
  for (AttentionBackend b : {AttentionBackend::automatic, AttentionBackend::flash, AttentionBackend::cudnn,
                             AttentionBackend::efficient, AttentionBackend::math})
    if (s == attention_backend_name(b)) {
      *out = b;
      return true;
    }
  return false;
}

}  // namespace videotrain
