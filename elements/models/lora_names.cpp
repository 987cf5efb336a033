/* LoRA key naming: see lora_names.h. */
#include "lora_names.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace videotrain::models {

namespace {

// diffusers <- original Wan (wan/modules/model.py), the map ComfyUI-format LoRAs use.
const std::pair<const char *, const char *> kWanNames[] = {
    {"attn1.to_q", "self_attn.q"},      {"attn1.to_k", "self_attn.k"},
    {"attn1.to_v", "self_attn.v"},      {"attn1.to_out.0", "self_attn.o"},
    {"attn2.to_q", "cross_attn.q"},     {"attn2.to_k", "cross_attn.k"},
    {"attn2.to_v", "cross_attn.v"},     {"attn2.to_out.0", "cross_attn.o"},
    {"ffn.net.0.proj", "ffn.0"},        {"ffn.net.2", "ffn.2"},
};
const std::pair<const char *, const char *> kWanTop[] = {
    {"condition_embedder.text_embedder.linear_1", "text_embedding.0"},
    {"condition_embedder.text_embedder.linear_2", "text_embedding.2"},
    {"condition_embedder.time_embedder.linear_1", "time_embedding.0"},
    {"condition_embedder.time_embedder.linear_2", "time_embedding.2"},
    {"condition_embedder.time_proj", "time_projection.1"},
    {"proj_out", "head.head"},
};

// CogVideoX LoRAs outside diffusers' file (ComfyUI's CogVideoX wrapper, kohya-style trainers) keep
// diffusers' module names: diffusion_model.<name>, or lora_unet_<name with underscores>. The modules
// a LoRA can name, so that the underscored form maps back.
const char *const kCogVideoXBlock[] = {"attn1.to_q",     "attn1.to_k", "attn1.to_v",   "attn1.to_out.0",
                                       "ff.net.0.proj",  "ff.net.2",   "norm1.linear", "norm2.linear"};
const char *const kCogVideoXTop[] = {"patch_embed.proj",        "patch_embed.text_proj", "time_embedding.linear_1",
                                     "time_embedding.linear_2", "norm_out.linear",       "proj_out"};

// kohya/musubi spell an original module name with underscores: blocks.0.self_attn.q -> blocks_0_self_attn_q.
std::string kohya_name(std::string original) {
  std::replace(original.begin(), original.end(), '.', '_');
  return original;
}

bool ends_with(const std::string &s, const std::string &t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

}  // namespace

namespace {

// "<prefix><digits><sep><rest>" (rest not empty) split into the digits and the rest.
bool split_block(const std::string &name, const std::string &prefix, char sep, std::string *index, std::string *rest) {
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  size_t i = prefix.size();
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') i++;
  if (i == prefix.size() || i + 1 >= name.size() || name[i] != sep) return false;
  *index = name.substr(prefix.size(), i - prefix.size());
  *rest = name.substr(i + 1);
  return true;
}

std::string wan_diffusers_name(const std::string &original) {
  for (const auto &[d, o] : kWanTop)
    if (original == o) return d;
  std::string i, rest;
  if (split_block(original, "blocks.", '.', &i, &rest))
    for (const auto &[d, o] : kWanNames)
      if (rest == o) return "blocks." + i + "." + d;
  return "";
}

std::string wan_kohya_to_original(const std::string &k) {
  for (const auto &[d, o] : kWanTop)
    if (k == kohya_name(o)) return o;
  std::string i, rest;
  if (split_block(k, "blocks_", '_', &i, &rest))
    for (const auto &[d, o] : kWanNames)
      if (rest == kohya_name(o)) return "blocks." + i + "." + o;
  return "";
}

}  // namespace

std::string cogvideox_module(const std::string &name, bool underscored) {
  auto spell = [&](std::string n) {
    if (underscored) std::replace(n.begin(), n.end(), '.', '_');
    return n;
  };
  for (const char *t : kCogVideoXTop)
    if (name == spell(t)) return t;
  std::string i, rest;
  if (split_block(name, underscored ? "transformer_blocks_" : "transformer_blocks.", underscored ? '_' : '.', &i, &rest))
    for (const char *b : kCogVideoXBlock)
      if (rest == spell(b)) return "transformer_blocks." + i + "." + b;
  return "";
}

std::vector<std::string> wan_block_modules() {
  std::vector<std::string> out;
  for (const auto &[d, o] : kWanNames) out.push_back(d);
  return out;
}

std::string wan_original_name(const std::string &name) {
  for (const auto &[d, o] : kWanTop)
    if (name == d) return o;
  std::string i, rest;
  if (split_block(name, "blocks.", '.', &i, &rest))
    for (const auto &[d, o] : kWanNames)
      if (rest == d) return "blocks." + i + "." + o;
  return "";
}

bool parse_lora_key(const std::string &key, LoraKey *out, std::string *why) {
  std::string stem;
  static const std::pair<const char *, LoraPart> kParts[] = {{".lora_A.weight", LoraPart::kDown},
                                                            {".lora_B.weight", LoraPart::kUp},
                                                            {".lora_down.weight", LoraPart::kDown},
                                                            {".lora_up.weight", LoraPart::kUp},
                                                            {".alpha", LoraPart::kAlpha}};
  for (const auto &[suffix, kind] : kParts)
    if (ends_with(key, suffix)) {
      stem = key.substr(0, key.size() - std::strlen(suffix));
      out->part = suffix;
      out->kind = kind;
    }
  if (stem.empty()) {
    *why = "is not a LoRA tensor (lora_A/lora_B, lora_down/lora_up or alpha)";
    return false;
  }
  out->module.clear();
  out->naming.clear();
  out->family.clear();
  auto well_formed = [](const std::string &m) {
    return !m.empty() && m.find("..") == std::string::npos && m.front() != '.' && m.back() != '.';
  };
  if (stem.rfind("transformer.", 0) == 0) {
    out->naming = "diffusers";
    const std::string m = stem.substr(12);
    // Any Linear of the model may carry a diffusers LoRA; the model's own check names the ones it lacks.
    if (well_formed(m)) out->module = m;
  } else if (well_formed(stem) && wan_diffusers_name(stem).empty() &&
             (!wan_original_name(stem).empty() || !cogvideox_module(stem, false).empty() ||
              stem.rfind("blocks.", 0) == 0 || stem.rfind("transformer_blocks.", 0) == 0 ||
              stem.rfind("condition_embedder.", 0) == 0)) {
    // PEFT's keys without the prefix (a model's save_lora_adapter, get_peft_model_state_dict); original
    // Wan names without diffusion_model. are not taken for diffusers ones.
    out->naming = "diffusers";
    out->module = stem;
  } else if (stem.rfind("diffusion_model.", 0) == 0) {
    out->naming = "comfyui";
    out->module = wan_diffusers_name(stem.substr(16));
    out->family = "wan";
    if (out->module.empty()) {
      out->module = cogvideox_module(stem.substr(16), false);
      out->family = "cogvideox";
    }
  } else if (stem.rfind("lora_unet_", 0) == 0) {
    out->naming = "kohya";
    out->module = wan_diffusers_name(wan_kohya_to_original(stem.substr(10)));
    out->family = "wan";
    if (out->module.empty()) {
      out->module = cogvideox_module(stem.substr(10), true);
      out->family = "cogvideox";
    }
  }
  if (out->module.empty()) {
    *why = "names no Linear module of a Wan or CogVideoX transformer: a LoRA for another model, or a naming other "
           "than diffusers (transformer.blocks.0.attn1.to_q), ComfyUI (diffusion_model.blocks.0.self_attn.q) or "
           "kohya (lora_unet_blocks_0_self_attn_q)";
    return false;
  }
  return true;
}

std::string lora_naming_problem(const std::vector<std::string> &modules, const std::string &naming, bool cogvideox) {
  if (naming == "diffusers") return "";
  if (naming != "comfyui" && naming != "kohya") return "'" + naming + "' is not a LoRA naming (diffusers, comfyui or kohya)";
  if (cogvideox)
    return "no loader reads a CogVideoX LoRA in the " + naming +
           " naming: diffusers' CogVideoXPipeline.load_lora_weights reads only diffusers keys "
           "(transformer.transformer_blocks.0.attn1.to_q.lora_A.weight), ComfyUI's own CogVideoX model names its "
           "layers otherwise (blocks.0.q) and ComfyUI's CogVideoX wrapper loads LoRAs through diffusers; write the "
           "diffusers naming (lora-format=diffusers)";
  for (const auto &m : modules) {
    const std::string o = wan_original_name(m);
    if (o.empty())
      return "module '" + m + "' has no name in the original Wan naming ComfyUI and kohya files use; write the "
             "diffusers naming (lora-format=diffusers)";
    if (naming == "kohya" && o.rfind("blocks.", 0) != 0)
      return "a kohya/musubi file holds only the blocks' modules (diffusers' musubi converter, which "
             "WanPipeline.load_lora_weights runs on lora_unet_ keys, fails on any other) and this LoRA has '" +
             m + "' (" + o + "); write the comfyui naming (ComfyUI and diffusers load it) or diffusers";
  }
  return "";
}

std::string lora_key(const std::string &module, const std::string &naming, bool cogvideox, LoraPart part) {
  if (naming == "diffusers") {
    if (part == LoraPart::kAlpha) return "";  // diffusers keeps alpha in the metadata
    return "transformer." + module + (part == LoraPart::kDown ? ".lora_A.weight" : ".lora_B.weight");
  }
  const std::string o = cogvideox ? cogvideox_module(module, false) : wan_original_name(module);
  if (o.empty() || (naming != "comfyui" && naming != "kohya")) return "";
  const bool kohya = naming == "kohya";
  const std::string stem = kohya ? "lora_unet_" + kohya_name(o) : "diffusion_model." + o;
  if (part == LoraPart::kAlpha) return stem + ".alpha";
  if (part == LoraPart::kDown) return stem + (kohya ? ".lora_down.weight" : ".lora_A.weight");
  return stem + (kohya ? ".lora_up.weight" : ".lora_B.weight");
}

}  // namespace videotrain::models
