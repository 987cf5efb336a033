/* LoRA key naming: see lora_names.h. */
#include "lora_names.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "model_family.h"

namespace videotrain::models {

namespace {

// diffusers <- original Wan (wan/modules/model.py), the map ComfyUI-format LoRAs use.
const LoraNameTable kWan{
    "blocks.",
    {{"attn1.to_q", "self_attn.q"},
     {"attn1.to_k", "self_attn.k"},
     {"attn1.to_v", "self_attn.v"},
     {"attn1.to_out.0", "self_attn.o"},
     {"attn2.to_q", "cross_attn.q"},
     {"attn2.to_k", "cross_attn.k"},
     {"attn2.to_v", "cross_attn.v"},
     {"attn2.to_out.0", "cross_attn.o"},
     {"ffn.net.0.proj", "ffn.0"},
     {"ffn.net.2", "ffn.2"}},
    {{"condition_embedder.text_embedder.linear_1", "text_embedding.0"},
     {"condition_embedder.text_embedder.linear_2", "text_embedding.2"},
     {"condition_embedder.time_embedder.linear_1", "time_embedding.0"},
     {"condition_embedder.time_embedder.linear_2", "time_embedding.2"},
     {"condition_embedder.time_proj", "time_projection.1"},
     {"proj_out", "head.head"}},
    {"blocks.", "condition_embedder."},
    nullptr,
    "diffusers' musubi converter, which WanPipeline.load_lora_weights runs on lora_unet_ keys, fails on any other",
};

// CogVideoX LoRAs outside diffusers' file (ComfyUI's CogVideoX wrapper, kohya-style trainers) keep
// diffusers' module names: diffusion_model.<name>, or lora_unet_<name with underscores>. The modules
// a LoRA can name, so that the underscored form maps back.
const LoraNameTable kCogVideoX{
    "transformer_blocks.",
    {{"attn1.to_q", "attn1.to_q"},
     {"attn1.to_k", "attn1.to_k"},
     {"attn1.to_v", "attn1.to_v"},
     {"attn1.to_out.0", "attn1.to_out.0"},
     {"ff.net.0.proj", "ff.net.0.proj"},
     {"ff.net.2", "ff.net.2"},
     {"norm1.linear", "norm1.linear"},
     {"norm2.linear", "norm2.linear"}},
    {{"patch_embed.proj", "patch_embed.proj"},
     {"patch_embed.text_proj", "patch_embed.text_proj"},
     {"time_embedding.linear_1", "time_embedding.linear_1"},
     {"time_embedding.linear_2", "time_embedding.linear_2"},
     {"norm_out.linear", "norm_out.linear"},
     {"proj_out", "proj_out"}},
    {"transformer_blocks."},
    "diffusers' CogVideoXPipeline.load_lora_weights reads only diffusers keys "
    "(transformer.transformer_blocks.0.attn1.to_q.lora_A.weight), ComfyUI's own CogVideoX model names its "
    "layers otherwise (blocks.0.q) and ComfyUI's CogVideoX wrapper loads LoRAs through diffusers",
    nullptr,
};

// kohya/musubi spell an original module name with underscores: blocks.0.self_attn.q -> blocks_0_self_attn_q.
std::string kohya_name(std::string original) {
  std::replace(original.begin(), original.end(), '.', '_');
  return original;
}

bool ends_with(const std::string &s, const std::string &t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

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

}  // namespace

const LoraNameTable &wan_lora_names() { return kWan; }
const LoraNameTable &cogvideox_lora_names() { return kCogVideoX; }

std::string lora_diffusers_name(const LoraNameTable &t, const std::string &name, bool underscored) {
  auto spell = [&](const std::string &n) { return underscored ? kohya_name(n) : n; };
  for (const auto &[d, o] : t.top)
    if (name == spell(o)) return d;
  std::string i, rest;
  if (split_block(name, spell(t.block_prefix), underscored ? '_' : '.', &i, &rest))
    for (const auto &[d, o] : t.block)
      if (rest == spell(o)) return t.block_prefix + i + "." + d;
  return "";
}

std::string lora_original_name(const LoraNameTable &t, const std::string &name) {
  for (const auto &[d, o] : t.top)
    if (name == d) return o;
  std::string i, rest;
  if (split_block(name, t.block_prefix, '.', &i, &rest))
    for (const auto &[d, o] : t.block)
      if (rest == d) return t.block_prefix + i + "." + o;
  return "";
}

std::vector<std::string> lora_block_modules(const LoraNameTable &t) {
  std::vector<std::string> out;
  for (const auto &[d, o] : t.block) out.push_back(d);
  return out;
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
  // PEFT's keys without the prefix (a model's save_lora_adapter, get_peft_model_state_dict): a module of
  // some family's table or blocks, and not an original name that differs from diffusers' (those are
  // ComfyUI keys without diffusion_model.).
  auto bare_diffusers = [&](const std::string &m) {
    if (!well_formed(m)) return false;
    bool known = false;
    for (const auto &f : model_families()) {
      const LoraNameTable &t = *f.lora_names;
      const std::string d = lora_diffusers_name(t, m, false);
      if (!d.empty() && d != m) return false;
      known = known || !lora_original_name(t, m).empty();
      for (const char *p : t.diffusers_prefixes) known = known || m.rfind(p, 0) == 0;
    }
    return known;
  };
  // ComfyUI and kohya keys: the first family whose table names the module.
  auto from_table = [&](const std::string &name, bool underscored) {
    for (const auto &f : model_families()) {
      out->module = lora_diffusers_name(*f.lora_names, name, underscored);
      out->family = f.name;
      if (!out->module.empty()) return;
    }
  };
  if (stem.rfind("transformer.", 0) == 0) {
    out->naming = "diffusers";
    const std::string m = stem.substr(12);
    // Any Linear of the model may carry a diffusers LoRA; the model's own check names the ones it lacks.
    if (well_formed(m)) out->module = m;
  } else if (bare_diffusers(stem)) {
    out->naming = "diffusers";
    out->module = stem;
  } else if (stem.rfind("diffusion_model.", 0) == 0) {
    out->naming = "comfyui";
    from_table(stem.substr(16), false);
  } else if (stem.rfind("lora_unet_", 0) == 0) {
    out->naming = "kohya";
    from_table(stem.substr(10), true);
  }
  if (out->module.empty()) {
    *why = "names no Linear module of a " + family_titles(" or ") +
           " transformer: a LoRA for another model, or a naming other "
           "than diffusers (transformer.blocks.0.attn1.to_q), ComfyUI (diffusion_model.blocks.0.self_attn.q) or "
           "kohya (lora_unet_blocks_0_self_attn_q)";
    return false;
  }
  return true;
}

std::string lora_naming_problem(const std::vector<std::string> &modules, const std::string &naming,
                                const ModelFamily &family) {
  if (naming == "diffusers") return "";
  if (naming != "comfyui" && naming != "kohya") return "'" + naming + "' is not a LoRA naming (diffusers, comfyui or kohya)";
  const LoraNameTable &t = *family.lora_names;
  if (t.unloadable)
    return "no loader reads a " + std::string(family.title) + " LoRA in the " + naming + " naming: " + t.unloadable +
           "; write the diffusers naming (lora-format=diffusers)";
  for (const auto &m : modules) {
    const std::string o = lora_original_name(t, m);
    if (o.empty())
      return "module '" + m + "' has no name in the original " + family.title +
             " naming ComfyUI and kohya files use; write the diffusers naming (lora-format=diffusers)";
    if (naming == "kohya" && t.kohya_blocks_only && o.rfind(t.block_prefix, 0) != 0)
      return "a kohya/musubi file holds only the blocks' modules (" + std::string(t.kohya_blocks_only) +
             ") and this LoRA has '" + m + "' (" + o +
             "); write the comfyui naming (ComfyUI and diffusers load it) or diffusers";
  }
  return "";
}

std::string lora_key(const std::string &module, const std::string &naming, const ModelFamily &family, LoraPart part) {
  if (naming == "diffusers") {
    if (part == LoraPart::kAlpha) return "";  // diffusers keeps alpha in the metadata
    return "transformer." + module + (part == LoraPart::kDown ? ".lora_A.weight" : ".lora_B.weight");
  }
  const std::string o = lora_original_name(*family.lora_names, module);
  if (o.empty() || (naming != "comfyui" && naming != "kohya")) return "";
  const bool kohya = naming == "kohya";
  const std::string stem = kohya ? "lora_unet_" + kohya_name(o) : "diffusion_model." + o;
  if (part == LoraPart::kAlpha) return stem + ".alpha";
  if (part == LoraPart::kDown) return stem + (kohya ? ".lora_down.weight" : ".lora_A.weight");
  return stem + (kohya ? ".lora_up.weight" : ".lora_B.weight");
}

}  // namespace videotrain::models
