/* ModelOptions: how a native model trains (no torch: ddptrainsink's config holds one). */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention_backend.h"

namespace videotrain {

// Gradient checkpointing of a native transformer's blocks. full: each block is recomputed in
// backward (only its input is kept). selective: each block keeps its self-attention (q, k, v, the
// output, and a fused kernel's logsumexp) and recomputes the rest (norms, modulation, projections,
// cross-attention, FFN), so backward never runs attention's forward again.
enum class Checkpointing { none = 0, full = 1, selective = 2 };  // ddptrainsink's property values
inline const char *checkpointing_name(Checkpointing c) {
  return c == Checkpointing::full ? "full" : c == Checkpointing::selective ? "selective" : "none";
}

// How a native model (a diffusers folder) trains: the objective's sampling and memory options.
// The TorchScript and built-in models ignore them.
struct ModelOptions {
  uint64_t seed = 0;                         // with (sample id, epoch): each sample's noise and sigma
  // Each sample's timestep (flow_timesteps.h): auto (Wan: logit-normal; CogVideoX: uniform) | uniform |
  // logit-normal | mode | shifted (logit-normal, shifted by the sample's resolution).
  std::string timestep_sampling = "auto";
  double logit_mean = 0.0, logit_std = 1.0;
  double mode_scale = 1.29;                  // timestep-sampling=mode (diffusers' scripts' default)
  double flow_shift = 3.0;                   // sigma' = s sigma / (1 + (s - 1) sigma)
  std::string loss_weighting = "none";       // none | sigma-sqrt | cosmap, per sample (flow models)
  double timestep_lo = 0.0, timestep_hi = 1000.0;  // sigma' rescaled into [lo, hi] / 1000
  std::vector<double> val_sigmas{0.25, 0.5, 0.75};  // CogVideoX: timesteps 1000 sigma (at most 999)
  // CogVideoX's DDPM schedule: 0 = the folder's ../scheduler/scheduler_config.json, else 3.0 for the
  // sincos layout (2b) and 1.0 for the rotary ones (5b, 1.5), as the published schedulers.
  double snr_shift_scale = 0;
  Checkpointing gradient_checkpointing = Checkpointing::none;
  AttentionBackend attention_backend = AttentionBackend::automatic;
  // LoRA (rank 0: off) over the frozen base, or a partial fine-tune (`trainable`, a regex on
  // parameter names); without either every parameter trains.
  int64_t lora_rank = 0;
  double lora_alpha = 0;                     // 0: = rank (scale 1)
  std::string lora_targets = "to_q,to_k,to_v,to_out.0";  // suffixes of module names, or a regex
  double lora_dropout = 0;
  std::string lora_init;                     // a LoRA file to continue from (any naming)
  std::string lora_format = "diffusers";     // what a finished run writes: diffusers | comfyui | kohya | all
  std::string trainable;                     // regex: partial fine-tune
  // A LoRA run's frozen Linear weights: bf16 (as loaded; bf16 under autocast) | fp8 (float8 e4m3 with
  // a float32 scale per output row, dequantised per use: layers.h LinearImpl::to_fp8; LibTorch >= 2.1).
  std::string base_dtype = "bf16";
  // Wan 2.2 A14B in one model (expert_pair.h): the low-noise expert's folder (transformer_2) beside
  // the high-noise one, and the boundary (a sample or step with timestep >= boundary_ratio * 1000
  // goes to the high-noise expert). "" = one model; boundary_ratio is resolved before make_model.
  std::string model_2;
  double boundary_ratio = 0;
  bool lora() const { return lora_rank > 0 || !lora_init.empty(); }
};

}  // namespace videotrain
