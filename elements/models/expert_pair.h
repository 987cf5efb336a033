/* Wan 2.2 A14B's two experts as one model: which expert a timestep belongs to, and the boundary from
 * the pipeline's model_index.json (diffusers' WanPipeline: `transformer` takes t >= boundary_ratio *
 * num_train_timesteps, `transformer_2` the rest). No torch; the TrainModel is expert_pair_model.cpp's. */
#pragma once

#include <string>

namespace videotrain::models {

// The expert 2's parameter names (and its checkpoint subfolder, its export folder's suffix).
constexpr const char *kExpert2Prefix = "transformer_2";

// True when a timestep (0..1000, as the model is called with it) goes to the high-noise expert.
inline bool high_noise_timestep(double timestep, double boundary_ratio) { return timestep >= boundary_ratio * 1000.0; }

// boundary_ratio of the pipeline folder that holds `transformer_dir` (its ../model_index.json), in
// (0, 1); 0 with *why set when there is no such file or key or the value is out of range.
double pipeline_boundary_ratio(const std::string &transformer_dir, std::string *why);

// The name expert 2's parameter `name` has in the pair: "transformer_2." + name, or a LoRA tensor's
// PEFT "transformer." prefix replaced by "transformer_2.".
std::string expert2_name(const std::string &name);

// An export folder's sibling for expert 2: DIR (trailing slashes dropped) + "_2" (transformer ->
// transformer_2, lora -> lora_2, transformer_ema -> transformer_ema_2).
std::string expert2_dir(std::string dir);

}  // namespace videotrain::models
