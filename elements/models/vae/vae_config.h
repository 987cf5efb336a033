/* The CogVideoX VAE configuration (diffusers config.json) and the encoder tensor
 * table it implies. No torch: the loader, the make-vae tool and the layout test share it. */
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace videotrain::vae {

struct VaeConfig {
  std::string class_name = "AutoencoderKLCogVideoX";
  int in_channels = 3;
  std::vector<std::string> down_block_types;
  std::vector<int> block_out_channels;
  int latent_channels = 16;
  int layers_per_block = 3;
  std::string act_fn = "silu";
  double norm_eps = 1e-6;
  int norm_num_groups = 32;
  int temporal_compression_ratio = 4;
  double scaling_factor = 1.15258426;
  // CogVideoX1.5's VAE: the I2V pipeline scales the image latents by 1 / scaling_factor (image_condition.h).
  bool invert_scale_latents = false;
  bool use_quant_conv = false;
  bool use_post_quant_conv = false;

  // Derived.
  int num_blocks() const { return static_cast<int>(block_out_channels.size()); }
  int spatial_compression() const { return 1 << (num_blocks() - 1); }
  int temporal_levels() const;  // log2(temporal_compression_ratio)
};

// Limits of check_supported(): generous for real VAEs, and keeping what a config implies
// (tensor count, 1 << blocks) bounded.
constexpr size_t kMaxBlocks = 16;
constexpr int kMaxChannels = 65536;
constexpr int kMaxLayersPerBlock = 64;

// Parses config.json text. False with a reason for malformed JSON or missing keys.
bool parse_vae_config(const std::string &json_text, VaeConfig *out, std::string *error);
bool load_vae_config(const std::string &path, VaeConfig *out, std::string *error);
std::string vae_config_to_json(const VaeConfig &cfg);  // diffusers-style config.json

// "" when the native encoder can run this config, else what is unsupported.
std::string check_supported(const VaeConfig &cfg);

// Every encoder tensor (diffusers names, "encoder." prefix; "quant_conv.*" when used)
// with its shape, in the order the encoder uses them.
std::vector<std::pair<std::string, std::vector<int64_t>>> encoder_tensor_table(const VaeConfig &cfg);
// Every decoder tensor ("decoder." prefix; "post_quant_conv.*" when used) with its shape.
std::vector<std::pair<std::string, std::vector<int64_t>>> decoder_tensor_table(const VaeConfig &cfg);

// The tiny and full-size CogVideoX-2b configurations, for the make-vae tool and tests.
VaeConfig tiny_config();
VaeConfig cogvideox_2b_config();
// Between the two, for benches: {64, 128, 128, 256} channels, 2 resnets per block, 32 groups.
VaeConfig mid_config();

// Writes config.json + diffusion_pytorch_model.safetensors into `dir` (created if
// needed) with seeded random encoder and decoder weights (conv weights uniform in +-1/sqrt(fan_in),
// like PyTorch's default init; norms near identity). dtype: "F32", "F16" or "BF16".
bool make_random_vae(const std::string &dir, const VaeConfig &cfg, uint64_t seed, const std::string &dtype,
                     std::string *error);
// The safetensors part of that, for any tensor table (the Wan VAE's too): seeded from `seed`
// in the table's order, the same init.
bool write_random_weights(const std::string &path, const std::vector<std::pair<std::string, std::vector<int64_t>>> &table,
                          uint64_t seed, const std::string &dtype, std::string *error);

std::string shape_str(const std::vector<int64_t> &shape);  // "[1, 2, 3]"

}  // namespace videotrain::vae
