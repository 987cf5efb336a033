/* WanTransformer3DModel's config.json: see wan_transformer_config.h. */
#include "wan_transformer_config.h"

#include <nlohmann/json.hpp>
#include <tuple>

#include "config_fields.h"

namespace videotrain::models {

using json = nlohmann::json;

bool parse_wan_transformer_config(const std::string &text, WanConfig *out, std::string *error) {
  const json j = json::parse(text, nullptr, false);
  auto fail = [&](const std::string &why) {
    *error = why;
    return false;
  };
  if (!j.is_object()) return fail("config.json is not a JSON object");
  static const char *known[] = {"patch_size", "num_attention_heads", "attention_head_dim", "in_channels",
                                "out_channels", "text_dim", "freq_dim", "ffn_dim", "num_layers", "cross_attn_norm",
                                "qk_norm", "eps", "image_dim", "added_kv_proj_dim", "rope_max_seq_len",
                                "pos_embed_seq_len"};
  if (const std::string bad = check_diffusers_keys(j, "WanTransformer3DModel", known, "Wan"); !bad.empty())
    return fail(bad);
  WanConfig c;
  std::string e;
  if (!get_count(j, "num_attention_heads", 1, 1024, &c.num_attention_heads, &e) ||
      !get_count(j, "attention_head_dim", 6, 1024, &c.attention_head_dim, &e) ||
      !get_count(j, "in_channels", 1, 4096, &c.in_channels, &e) ||
      !get_count(j, "out_channels", 1, 4096, &c.out_channels, &e) || !get_count(j, "text_dim", 1, 65536, &c.text_dim, &e) ||
      !get_count(j, "freq_dim", 2, 65536, &c.freq_dim, &e) || !get_count(j, "ffn_dim", 1, 1 << 20, &c.ffn_dim, &e) ||
      !get_count(j, "num_layers", 1, 1000, &c.num_layers, &e) ||
      !get_count(j, "rope_max_seq_len", 1, 1 << 20, &c.rope_max_seq_len, &e))
    return fail("config.json " + e);
  if (c.attention_head_dim % 2 || c.freq_dim % 2)
    return fail("config.json: attention_head_dim and freq_dim must be even (rotary pairs, sin/cos halves)");
  if (c.dim() > 65536) return fail("config.json: num_attention_heads x attention_head_dim is over 65536");
  if (j.contains("patch_size")) {
    const auto &p = j["patch_size"];
    if (!p.is_array() || p.size() != 3) return fail("config.json 'patch_size' is " + p.dump() + ", expected [t, h, w]");
    for (size_t i = 0; i < 3; i++) {
      if (!p[i].is_number_integer() || p[i].get<int64_t>() < 1 || p[i].get<int64_t>() > 64)
        return fail("config.json 'patch_size' is " + p.dump() + ", expected three whole numbers in [1, 64]");
      c.patch_size[i] = p[i].get<int64_t>();
    }
  }
  if (j.contains("cross_attn_norm")) {
    if (!j["cross_attn_norm"].is_boolean()) return fail("config.json 'cross_attn_norm' is not true or false");
    c.cross_attn_norm = j["cross_attn_norm"].get<bool>();
  }
  if (j.contains("qk_norm") && j["qk_norm"] != "rms_norm_across_heads")
    return fail("config.json 'qk_norm' is " + j["qk_norm"].dump() + "; only \"rms_norm_across_heads\" (every published "
                "Wan checkpoint) is supported");
  if (j.contains("eps")) {
    if (!j["eps"].is_number() || !(j["eps"].get<double>() > 0 && j["eps"].get<double>() < 1))
      return fail("config.json 'eps' is " + j["eps"].dump() + ", expected a number in (0, 1)");
    c.eps = j["eps"].get<double>();
  }
  // The image path (Wan 2.1 I2V, FLF2V). in_channels may differ from out_channels (I2V's mask and
  // condition latents beside the noisy ones): the model takes whatever its patch embedding holds.
  for (const auto &[k, dst, hi] : {std::tuple<const char *, int64_t *, int64_t>{"image_dim", &c.image_dim, 65536},
                                   {"added_kv_proj_dim", &c.added_kv_proj_dim, 65536},
                                   {"pos_embed_seq_len", &c.pos_embed_seq_len, 1 << 20}})
    if (j.contains(k) && !j[k].is_null() && !get_count(j, k, 1, hi, dst, &e)) return fail("config.json " + e);
  if ((c.image_dim > 0) != (c.added_kv_proj_dim > 0))
    return fail("config.json sets " + std::string(c.image_dim ? "image_dim" : "added_kv_proj_dim") + " without " +
                (c.image_dim ? "added_kv_proj_dim" : "image_dim") + ": Wan's image path needs both (the image "
                "embedder and the cross-attention's image keys and values); every published I2V config has both");
  if (c.added_kv_proj_dim && c.added_kv_proj_dim != c.dim())
    return fail("config.json 'added_kv_proj_dim' is " + std::to_string(c.added_kv_proj_dim) + "; it must equal "
                "num_attention_heads x attention_head_dim (" + std::to_string(c.dim()) +
                "), the width of the image embedder's output it projects");
  if (c.pos_embed_seq_len && (!c.image_dim || c.pos_embed_seq_len % 2))
    return fail("config.json 'pos_embed_seq_len' is " + std::to_string(c.pos_embed_seq_len) +
                ": FLF2V's positions of two images' tokens, so an even count, and only with image_dim");
  *out = c;
  return true;
}

std::string wan_transformer_config_json(const WanConfig &c) {
  json j;
  j["_class_name"] = "WanTransformer3DModel";
  j["_diffusers_version"] = "0.35.0";
  auto or_null = [](int64_t v) { return v ? json(v) : json(nullptr); };
  j["added_kv_proj_dim"] = or_null(c.added_kv_proj_dim);
  j["attention_head_dim"] = c.attention_head_dim;
  j["cross_attn_norm"] = c.cross_attn_norm;
  j["eps"] = c.eps;
  j["ffn_dim"] = c.ffn_dim;
  j["freq_dim"] = c.freq_dim;
  j["image_dim"] = or_null(c.image_dim);
  j["in_channels"] = c.in_channels;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_layers"] = c.num_layers;
  j["out_channels"] = c.out_channels;
  j["patch_size"] = c.patch_size;
  j["pos_embed_seq_len"] = or_null(c.pos_embed_seq_len);
  j["qk_norm"] = "rms_norm_across_heads";
  j["rope_max_seq_len"] = c.rope_max_seq_len;
  j["text_dim"] = c.text_dim;
  return j.dump(2) + "\n";
}

}  // namespace videotrain::models
