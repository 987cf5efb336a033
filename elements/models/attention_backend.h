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
