/* CogVideoXTransformer3DModel's config.json: see cogvideox_transformer_config.h. */
#include "cogvideox_transformer_config.h"

#include <nlohmann/json.hpp>

#include "config_fields.h"

namespace videotrain::models {

using json = nlohmann::json;

bool parse_cogvideox_transformer_config(const std::string &text, CogVideoXConfig *out, std::string *error) {
  const json j = json::parse(text, nullptr, false);
  auto fail = [&](const std::string &why) {
    *error = why;
    return false;
  };
  if (!j.is_object()) return fail("config.json is not a JSON object");
  static const char *known[] = {
      "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "flip_sin_to_cos", "freq_shift",
      "time_embed_dim", "ofs_embed_dim", "text_embed_dim", "num_layers", "dropout", "attention_bias", "sample_width",
      "sample_height", "sample_frames", "patch_size", "patch_size_t", "temporal_compression_ratio",
      "max_text_seq_length", "activation_fn", "timestep_activation_fn", "norm_elementwise_affine", "norm_eps",
      "spatial_interpolation_scale", "temporal_interpolation_scale", "use_rotary_positional_embeddings",
      "use_learned_positional_embeddings", "patch_bias"};
  if (const std::string bad = check_diffusers_keys(j, "CogVideoXTransformer3DModel", known, "CogVideoX"); !bad.empty())
    return fail(bad);
  CogVideoXConfig c;
  std::string e;
  if (!get_count(j, "num_attention_heads", 1, 1024, &c.num_attention_heads, &e) ||
      !get_count(j, "attention_head_dim", 8, 1024, &c.attention_head_dim, &e) ||
      !get_count(j, "in_channels", 1, 4096, &c.in_channels, &e) ||
      !get_count(j, "out_channels", 1, 4096, &c.out_channels, &e) ||
      !get_count(j, "freq_shift", 0, 1, &c.freq_shift, &e) ||
      !get_count(j, "time_embed_dim", 1, 65536, &c.time_embed_dim, &e) ||
      !get_count(j, "text_embed_dim", 1, 65536, &c.text_embed_dim, &e) ||
      !get_count(j, "num_layers", 1, 1000, &c.num_layers, &e) ||
      !get_count(j, "sample_width", 1, 1 << 16, &c.sample_width, &e) ||
      !get_count(j, "sample_height", 1, 1 << 16, &c.sample_height, &e) ||
      !get_count(j, "sample_frames", 1, 1 << 16, &c.sample_frames, &e) ||
      !get_count(j, "patch_size", 1, 64, &c.patch_size, &e) ||
      !get_count(j, "temporal_compression_ratio", 1, 64, &c.temporal_compression_ratio, &e) ||
      !get_count(j, "max_text_seq_length", 1, 1 << 16, &c.max_text_seq_length, &e) ||
      !get_bool(j, "flip_sin_to_cos", &c.flip_sin_to_cos, &e) || !get_bool(j, "attention_bias", &c.attention_bias, &e) ||
      !get_bool(j, "use_rotary_positional_embeddings", &c.use_rotary_positional_embeddings, &e) ||
      !get_bool(j, "patch_bias", &c.patch_bias, &e) || !get_real(j, "norm_eps", 0, 1, &c.norm_eps, &e) ||
      !get_real(j, "spatial_interpolation_scale", 0, 1e6, &c.spatial_interpolation_scale, &e) ||
      !get_real(j, "temporal_interpolation_scale", 0, 1e6, &c.temporal_interpolation_scale, &e))
    return fail("config.json " + e);
  if (j.contains("patch_size_t") && !j["patch_size_t"].is_null()) {
    if (!get_count(j, "patch_size_t", 1, 64, &c.patch_size_t, &e)) return fail("config.json " + e);
  }
  if (j.contains("dropout") && !(j["dropout"].is_number() && j["dropout"].get<double>() == 0.0))
    return fail("config.json 'dropout' is " + j["dropout"].dump() + "; only 0 (every published checkpoint) is supported");
  if (j.contains("activation_fn") && j["activation_fn"] != "gelu-approximate")
    return fail("config.json 'activation_fn' is " + j["activation_fn"].dump() + "; only \"gelu-approximate\" is supported");
  if (j.contains("timestep_activation_fn") && j["timestep_activation_fn"] != "silu")
    return fail("config.json 'timestep_activation_fn' is " + j["timestep_activation_fn"].dump() +
                "; only \"silu\" is supported");
  if (j.contains("norm_elementwise_affine") && j["norm_elementwise_affine"] != true)
    return fail("config.json 'norm_elementwise_affine' is " + j["norm_elementwise_affine"].dump() +
                "; only true is supported");
  if (j.contains("ofs_embed_dim") && !j["ofs_embed_dim"].is_null()) {
    if (!get_count(j, "ofs_embed_dim", 1, 65536, &c.ofs_embed_dim, &e)) return fail("config.json " + e);
    if (c.ofs_embed_dim != c.time_embed_dim)  // diffusers adds the two embeddings
      return fail("config.json key 'ofs_embed_dim' is " + std::to_string(c.ofs_embed_dim) + " and time_embed_dim " +
                  std::to_string(c.time_embed_dim) + "; diffusers adds the two embeddings, so they must be equal");
  }
  if (j.contains("use_learned_positional_embeddings") &&
      !get_bool(j, "use_learned_positional_embeddings", &c.use_learned_positional_embeddings, &e))
    return fail("config.json " + e);
  if (c.use_learned_positional_embeddings && (!c.use_rotary_positional_embeddings || c.patch_size_t))
    return fail("config.json key 'use_learned_positional_embeddings' is true with " +
                std::string(c.patch_size_t ? "'patch_size_t'" : "'use_rotary_positional_embeddings' false") +
                "; only CogVideoX-5b-I2V's layout (rotary, no temporal patches) has learned positions");
  if (c.in_channels != c.out_channels && c.in_channels != 2 * c.out_channels)
    return fail("config.json key 'in_channels' is " + std::to_string(c.in_channels) + " and out_channels " +
                std::to_string(c.out_channels) + "; CogVideoX takes out_channels (text-to-video) or twice as many "
                "(image-to-video: the image latents after the noisy ones)");
  if (c.dim() > 65536) return fail("config.json: num_attention_heads x attention_head_dim is over 65536");
  if (c.use_rotary_positional_embeddings ? c.attention_head_dim % 8 : c.dim() % 4)
    return fail(c.use_rotary_positional_embeddings
                    ? "config.json 'attention_head_dim' must be a multiple of 8 (3D rotary axes t, h, w)"
                    : "config.json: num_attention_heads x attention_head_dim must be a multiple of 4 (sincos positions)");
  if (c.patch_size_t && !c.use_rotary_positional_embeddings)
    return fail("config.json 'patch_size_t' is set without 'use_rotary_positional_embeddings'; no CogVideoX has that");
  *out = c;
  return true;
}

std::string cogvideox_transformer_config_json(const CogVideoXConfig &c) {
  json j;
  j["_class_name"] = "CogVideoXTransformer3DModel";
  j["_diffusers_version"] = "0.32.0";
  j["activation_fn"] = "gelu-approximate";
  j["attention_bias"] = c.attention_bias;
  j["attention_head_dim"] = c.attention_head_dim;
  j["dropout"] = 0.0;
  j["flip_sin_to_cos"] = c.flip_sin_to_cos;
  j["freq_shift"] = c.freq_shift;
  j["in_channels"] = c.in_channels;
  j["max_text_seq_length"] = c.max_text_seq_length;
  j["norm_elementwise_affine"] = true;
  j["norm_eps"] = c.norm_eps;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_layers"] = c.num_layers;
  j["ofs_embed_dim"] = c.ofs_embed_dim ? json(c.ofs_embed_dim) : json(nullptr);
  j["out_channels"] = c.out_channels;
  j["patch_bias"] = c.patch_bias;
  j["patch_size"] = c.patch_size;
  j["patch_size_t"] = c.patch_size_t ? json(c.patch_size_t) : json(nullptr);
  j["sample_frames"] = c.sample_frames;
  j["sample_height"] = c.sample_height;
  j["sample_width"] = c.sample_width;
  j["spatial_interpolation_scale"] = c.spatial_interpolation_scale;
  j["temporal_compression_ratio"] = c.temporal_compression_ratio;
  j["temporal_interpolation_scale"] = c.temporal_interpolation_scale;
  j["text_embed_dim"] = c.text_embed_dim;
  j["time_embed_dim"] = c.time_embed_dim;
  j["timestep_activation_fn"] = "silu";
  j["use_learned_positional_embeddings"] = c.use_learned_positional_embeddings;
  j["use_rotary_positional_embeddings"] = c.use_rotary_positional_embeddings;
  return j.dump(2) + "\n";
}

}  // namespace videotrain::models
