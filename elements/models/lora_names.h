/* LoRA key naming (no torch; the fuzz target builds it alone): the three namings users meet and the
 * one name table per family between them.
 *   diffusers/PEFT  transformer.blocks.0.attn1.to_q.lora_A.weight      (.lora_B.weight; without the
 *                   transformer. prefix as a model's save_lora_adapter writes it)
 *   ComfyUI         diffusion_model.blocks.0.self_attn.q.lora_A.weight (or lora_down/lora_up; .alpha)
 *   kohya/musubi    lora_unet_blocks_0_self_attn_q.lora_down.weight    (.lora_up.weight, .alpha)
 * Wan's ComfyUI and kohya keys use the original Wan module names (wan/modules/model.py); CogVideoX's
 * keep diffusers' module names in every naming. */
#pragma once

#include <string>
#include <vector>

namespace videotrain::models {

enum class LoraPart { kDown, kUp, kAlpha };

struct LoraKey {
  std::string module;  // the diffusers module name: blocks.0.attn1.to_q, transformer_blocks.3.ff.net.2
  std::string naming;  // diffusers | comfyui | kohya
  std::string part;    // the suffix as found: .lora_A.weight, .lora_B.weight, .lora_down.weight, .lora_up.weight, .alpha
  LoraPart kind = LoraPart::kDown;
  std::string family;  // comfyui/kohya: the name table that matched (wan | cogvideox); "" for diffusers
};

// Parses a LoRA file's key. False with *why (starting with a verb: "is not a LoRA tensor ...",
// "names no Linear module ...") for anything else.
bool parse_lora_key(const std::string &key, LoraKey *out, std::string *why);
// The key of `module`'s part in `naming` ("" when the module has no name there). cogvideox: the
// module names are CogVideoX's (kept as diffusers' in every naming).
std::string lora_key(const std::string &module, const std::string &naming, bool cogvideox, LoraPart part);

// Why a LoRA on `modules` (diffusers names; cogvideox: CogVideoX's) cannot be written in `naming` so
// that the loaders of that naming load it, naming the naming to use instead; "" when it can. Wan's
// kohya files hold only blocks (diffusers' musubi converter, WanPipeline.load_lora_weights, reads
// nothing else); no loader reads CogVideoX LoRAs in the ComfyUI or kohya naming.
std::string lora_naming_problem(const std::vector<std::string> &modules, const std::string &naming, bool cogvideox);

// A Wan block's LoRA-targetable modules in diffusers' names (attn1.to_q ... ffn.net.2): what diffusers'
// musubi converter requires in every block.
std::vector<std::string> wan_block_modules();

// The original Wan name of a diffusers module name ("blocks.0.attn1.to_q" -> "blocks.0.self_attn.q"),
// or "" when the module has none.
std::string wan_original_name(const std::string &diffusers_name);
// The CogVideoX module `name` names in diffusers' dotted form (underscored: kohya's form,
// transformer_blocks_0_attn1_to_q), or "" when no CogVideoX Linear has that name.
std::string cogvideox_module(const std::string &name, bool underscored);

}  // namespace videotrain::models
