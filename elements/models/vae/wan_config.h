/* The Wan 2.1 / 2.2 VAE configuration (diffusers AutoencoderKLWan config.json) and the encoder
 * tensor table it implies. No torch. */
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace videotrain::vae {

struct WanConfig {
  int base_dim = 96;
  int decoder_base_dim = 0;    // the decoder's, when it differs (Wan 2.2: 256 over 160); 0: base_dim
  int z_dim = 16;
  std::vector<int> dim_mult{1, 2, 4, 4};
  int num_res_blocks = 2;
  std::vector<bool> temperal_downsample{false, true, true};  // diffusers' spelling
  bool is_residual = false;    // Wan 2.2: residual down blocks with AvgDown3D shortcuts
  int in_channels = 3;         // 3 * patch_size^2 with pixel patches
  int patch_size = 1;          // Wan 2.2: 2 (pixel patches folded into channels)
  std::vector<double> latents_mean, latents_std;  // z_dim each

  std::vector<int> dims() const;  // base_dim * [1] + dim_mult
  int levels() const { return static_cast<int>(dim_mult.size()); }
  int spatial_compression() const;   // patch_size * 2^(levels - 1)
  int temporal_compression() const;  // 2^(temporal downsamples)
};

// Whether config.json text names AutoencoderKLWan (the class decides the family).
std::string config_class_name(const std::string &json_text);

// Parses config.json text. False with a reason naming the key for missing or unusable values.
bool parse_wan_config(const std::string &json_text, WanConfig *out, std::string *error);

// Every encoder tensor (diffusers names) with its shape, in the order the encoder uses them.
std::vector<std::pair<std::string, std::vector<int64_t>>> wan_encoder_tensor_table(const WanConfig &cfg);
// Every decoder tensor ("decoder.*", "post_quant_conv.*") with its shape.
std::vector<std::pair<std::string, std::vector<int64_t>>> wan_decoder_tensor_table(const WanConfig &cfg);

// diffusers' config.json of AutoencoderKLWan for `cfg` (latents_mean/std: 0 and 1 where unset).
std::string wan_config_to_json(const WanConfig &cfg);
// Wan 2.1's own layout (WanConfig's defaults) and a tiny one for demos and tests: base_dim 16,
// dim_mult [1, 2, 2, 2], one resnet per level, 4 latent channels (8x spatial, 4x temporal).
WanConfig wan21_config();
WanConfig tiny_wan21_config();
// Wan 2.2's (Wan2.2-TI2V-5B's VAE: base_dim 160, decoder 256, 48 latent channels, residual blocks,
// 2x2 pixel patches: 16x spatial) and a tiny one of that layout (base_dim 16, 8 latent channels).
WanConfig wan22_config();
WanConfig tiny_wan22_config();
// Writes config.json + diffusion_pytorch_model.safetensors into `dir` (created if needed) with
// seeded random encoder and decoder weights (as make_random_vae). dtype: "F32", "F16" or "BF16".
bool make_random_wan_vae(const std::string &dir, const WanConfig &cfg, uint64_t seed, const std::string &dtype,
                         std::string *error);

}  // namespace videotrain::vae
