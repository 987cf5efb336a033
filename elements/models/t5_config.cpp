/* T5 / umT5 encoder config.json: see t5_config.h. */
#include "t5_config.h"

#include <nlohmann/json.hpp>

#include "config_fields.h"

namespace videotrain::models {

using json = nlohmann::json;

bool parse_t5_config(const std::string &text, T5Config *out, std::string *error) {
  const json j = json::parse(text, nullptr, false);
  auto fail = [&](const std::string &why) {
    *error = "config.json " + why;
    return false;
  };
  if (!j.is_object()) return fail("is not a JSON object");
  T5Config c;
  std::string model_type;
  if (j.contains("model_type")) {
    if (!j["model_type"].is_string()) return fail("'model_type' is " + j["model_type"].dump() + ", not a string");
    model_type = j["model_type"].get<std::string>();
    if (model_type != "t5" && model_type != "umt5")
      return fail("'model_type' is \"" + model_type + "\": not a T5 (\"t5\") or umT5 (\"umt5\") text encoder");
  }
  if (j.contains("architectures")) {
    const auto &a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || !a[0].is_string())
      return fail("'architectures' is " + a.dump() + ", expected [\"T5EncoderModel\"] or [\"UMT5EncoderModel\"]");
    c.class_name = a[0].get<std::string>();
    if (c.class_name != "T5EncoderModel" && c.class_name != "UMT5EncoderModel")
      return fail("'architectures' is " + a.dump() + ": only the encoders T5EncoderModel and UMT5EncoderModel are "
                  "supported (the text_encoder/ folder of a CogVideoX or Wan model)");
    c.umt5 = c.class_name == "UMT5EncoderModel";
    if (!model_type.empty() && (model_type == "umt5") != c.umt5)
      return fail("'model_type' \"" + model_type + "\" does not match 'architectures' " + a.dump());
  } else if (model_type.empty()) {
    return fail("has neither 'architectures' nor 'model_type': not a transformers T5 / umT5 encoder");
  } else {
    c.umt5 = model_type == "umt5";
    c.class_name = c.umt5 ? "UMT5EncoderModel" : "T5EncoderModel";
  }
  std::string e;
  if (!get_count(j, "vocab_size", 1, 1 << 22, &c.vocab_size, &e) || !get_count(j, "d_model", 1, 65536, &c.d_model, &e) ||
      !get_count(j, "d_kv", 1, 4096, &c.d_kv, &e) || !get_count(j, "d_ff", 1, 1 << 20, &c.d_ff, &e) ||
      !get_count(j, "num_layers", 1, 1000, &c.num_layers, &e) || !get_count(j, "num_heads", 1, 1024, &c.num_heads, &e) ||
      !get_count(j, "relative_attention_num_buckets", 2, 65536, &c.relative_attention_num_buckets, &e) ||
      !get_count(j, "relative_attention_max_distance", 1, 1 << 20, &c.relative_attention_max_distance, &e))
    return fail(e);
  if (c.relative_attention_num_buckets % 4)
    return fail("'relative_attention_num_buckets' is " + std::to_string(c.relative_attention_num_buckets) +
                ": bidirectional buckets need a multiple of 4 (half per direction, half of those exact)");
  if (c.relative_attention_max_distance <= c.relative_attention_num_buckets / 4)
    return fail("'relative_attention_max_distance' must exceed relative_attention_num_buckets / 4");
  if (c.inner_dim() > 65536) return fail("num_heads x d_kv is over 65536");
  if (j.contains("layer_norm_epsilon")) {
    const auto &v = j["layer_norm_epsilon"];
    if (!v.is_number() || !(v.get<double>() > 0 && v.get<double>() < 1))
      return fail("'layer_norm_epsilon' is " + v.dump() + ", expected a number in (0, 1)");
    c.layer_norm_epsilon = v.get<double>();
  }
  // transformers' default is "relu" (the original T5); every published v1.1 / umT5 encoder is gated-gelu.
  const std::string ffp = j.contains("feed_forward_proj") && j["feed_forward_proj"].is_string()
                              ? j["feed_forward_proj"].get<std::string>()
                              : (j.contains("feed_forward_proj") ? j["feed_forward_proj"].dump() : "relu");
  if (ffp != "gated-gelu")
    return fail("'feed_forward_proj' is \"" + ffp + "\"" + (j.contains("feed_forward_proj") ? "" : " (absent)") +
                ": only \"gated-gelu\" (T5 v1.1, umT5: the CogVideoX and Wan text encoders) is supported");
  if (j.contains("dense_act_fn") && j["dense_act_fn"] != "gelu_new" && j["dense_act_fn"] != "gelu_pytorch_tanh")
    return fail("'dense_act_fn' is " + j["dense_act_fn"].dump() + ": only the tanh GELU (\"gelu_new\") is supported");
  if (j.contains("is_gated_act") && j["is_gated_act"] != true)
    return fail("'is_gated_act' is " + j["is_gated_act"].dump() + ": only the gated FFN is supported");
  if (j.contains("is_decoder") && j["is_decoder"] != false)
    return fail("'is_decoder' is " + j["is_decoder"].dump() + ": this is the encoder only (bidirectional attention)");
  *out = c;
  return true;
}

}  // namespace videotrain::models
