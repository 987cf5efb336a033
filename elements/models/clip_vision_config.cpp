/* CLIP vision encoder and image processor configs: see clip_vision_config.h. */
#include "clip_vision_config.h"

#include <nlohmann/json.hpp>

#include "config_fields.h"

namespace videotrain::models {

using json = nlohmann::json;

bool parse_clip_vision_config(const std::string &text, ClipVisionConfig *out, std::string *error) {
  const json j = json::parse(text, nullptr, false);
  auto fail = [&](const std::string &why) {
    *error = "config.json " + why;
    return false;
  };
  if (!j.is_object()) return fail("is not a JSON object");
  ClipVisionConfig c;
  if (j.contains("model_type") && j["model_type"] != "clip_vision_model")
    return fail("'model_type' is " + j["model_type"].dump() +
                ", not \"clip_vision_model\": give the vision encoder's folder (a Wan I2V pipeline's image_encoder/)");
  if (j.contains("architectures")) {
    const auto &a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || !a[0].is_string())
      return fail("'architectures' is " + a.dump() + ", expected [\"CLIPVisionModel\"] or [\"CLIPVisionModelWithProjection\"]");
    c.class_name = a[0].get<std::string>();
    if (c.class_name != "CLIPVisionModel" && c.class_name != "CLIPVisionModelWithProjection")
      return fail("'architectures' is " + a.dump() + ": only CLIPVisionModel and CLIPVisionModelWithProjection are supported");
  } else if (!j.contains("model_type")) {
    return fail("has neither 'architectures' nor 'model_type': not a transformers CLIP vision encoder");
  }
  c.with_projection = c.class_name == "CLIPVisionModelWithProjection";
  std::string e;
  if (!get_count(j, "hidden_size", 1, 65536, &c.hidden_size, &e) ||
      !get_count(j, "intermediate_size", 1, 1 << 20, &c.intermediate_size, &e) ||
      !get_count(j, "num_hidden_layers", 1, 1000, &c.num_hidden_layers, &e) ||
      !get_count(j, "num_attention_heads", 1, 1024, &c.num_attention_heads, &e) ||
      !get_count(j, "num_channels", 1, 16, &c.num_channels, &e) || !get_count(j, "image_size", 1, 8192, &c.image_size, &e) ||
      !get_count(j, "patch_size", 1, 8192, &c.patch_size, &e) ||
      !get_count(j, "projection_dim", 1, 65536, &c.projection_dim, &e) ||
      !get_real(j, "layer_norm_eps", 0, 1, &c.layer_norm_eps, &e))
    return fail(e);
  if (c.hidden_size % c.num_attention_heads)
    return fail("'hidden_size' " + std::to_string(c.hidden_size) + " is not a multiple of 'num_attention_heads' " +
                std::to_string(c.num_attention_heads));
  if (c.image_size % c.patch_size)
    return fail("'image_size' " + std::to_string(c.image_size) + " is not a multiple of 'patch_size' " +
                std::to_string(c.patch_size));
  if (j.contains("hidden_act")) {
    const auto &v = j["hidden_act"];
    c.hidden_act = v.is_string() ? v.get<std::string>() : v.dump();
    if (c.hidden_act != "quick_gelu" && c.hidden_act != "gelu" && c.hidden_act != "gelu_new" &&
        c.hidden_act != "gelu_pytorch_tanh")
      return fail("'hidden_act' is " + v.dump() +
                  ": only \"quick_gelu\" (OpenAI CLIP), \"gelu\" (open_clip ViT-H: Wan's) and the tanh GELU are supported");
  }
  *out = c;
  return true;
}

namespace {

// size / crop_size: an int N, {"shortest_edge": N}, or {"height": H, "width": W}.
bool get_size(const json &j, const char *key, int64_t *shortest, int64_t *h, int64_t *w, std::string *error) {
  if (!j.contains(key)) return true;
  const auto &v = j[key];
  auto positive = [](const json &x) { return x.is_number_integer() && x.get<int64_t>() > 0 && x.get<int64_t>() <= 65536; };
  if (positive(v)) {
    *shortest = v.get<int64_t>();
    *h = *w = 0;
    return true;
  }
  if (v.is_object() && v.size() == 1 && v.contains("shortest_edge") && positive(v["shortest_edge"])) {
    *shortest = v["shortest_edge"].get<int64_t>();
    *h = *w = 0;
    return true;
  }
  if (v.is_object() && v.size() == 2 && v.contains("height") && v.contains("width") && positive(v["height"]) &&
      positive(v["width"])) {
    *shortest = 0;
    *h = v["height"].get<int64_t>();
    *w = v["width"].get<int64_t>();
    return true;
  }
  *error = std::string("'") + key + "' is " + v.dump() +
           ", expected a positive whole number, {\"shortest_edge\": N} or {\"height\": H, \"width\": W}";
  return false;
}

bool get_triple(const json &j, const char *key, bool positive, std::array<double, 3> *out, std::string *error) {
  if (!j.contains(key)) return true;
  const auto &v = j[key];
  bool ok = v.is_array() && v.size() == 3;
  for (size_t i = 0; ok && i < 3; i++) ok = v[i].is_number() && (!positive || v[i].get<double>() > 0);
  if (!ok) {
    *error = std::string("'") + key + "' is " + v.dump() + ", expected three " + (positive ? "positive " : "") +
             "numbers (R, G, B)";
    return false;
  }
  for (size_t i = 0; i < 3; i++) (*out)[i] = v[i].get<double>();
  return true;
}

}  // namespace

bool parse_clip_processor_config(const std::string &text, ClipProcessorConfig *out, std::string *error) {
  const json j = json::parse(text, nullptr, false);
  auto fail = [&](const std::string &why) {
    *error = "preprocessor_config.json " + why;
    return false;
  };
  if (!j.is_object()) return fail("is not a JSON object");
  for (const char *key : {"image_processor_type", "feature_extractor_type"})
    if (j.contains(key) && j[key] != "CLIPImageProcessor" && j[key] != "CLIPImageProcessorFast" &&
        j[key] != "CLIPImageProcessorPil" && j[key] != "CLIPFeatureExtractor")
      return fail(std::string("'") + key + "' is " + j[key].dump() + ": only CLIP's image processor is supported");
  ClipProcessorConfig c;
  std::string e;
  int64_t crop_short = 0;
  if (!get_bool(j, "do_resize", &c.do_resize, &e) || !get_bool(j, "do_center_crop", &c.do_center_crop, &e) ||
      !get_bool(j, "do_rescale", &c.do_rescale, &e) || !get_bool(j, "do_normalize", &c.do_normalize, &e) ||
      !get_size(j, "size", &c.shortest_edge, &c.resize_height, &c.resize_width, &e) ||
      !get_size(j, "crop_size", &crop_short, &c.crop_height, &c.crop_width, &e) ||
      !get_real(j, "rescale_factor", 0, 1e6, &c.rescale_factor, &e) ||
      !get_triple(j, "image_mean", false, &c.image_mean, &e) || !get_triple(j, "image_std", true, &c.image_std, &e))
    return fail(e);
  if (j.contains("crop_size") && crop_short) c.crop_height = c.crop_width = crop_short;  // an int: a square
  if (j.contains("crop_size") && j["crop_size"].is_object() && j["crop_size"].contains("shortest_edge"))
    return fail("'crop_size' is " + j["crop_size"].dump() + ", expected {\"height\": H, \"width\": W}");
  if (j.contains("resample")) {
    const auto &v = j["resample"];
    if (!v.is_number_integer() || (v.get<int64_t>() != 2 && v.get<int64_t>() != 3))
      return fail("'resample' is " + v.dump() + ": only PIL's bilinear (2) and bicubic (3, CLIP's) filters are supported");
    c.resample = static_cast<int>(v.get<int64_t>());
  }
  *out = c;
  return true;
}

}  // namespace videotrain::models
