/* LoRA key naming (no torch; the fuzz target builds it alone): the three namings users meet and the
 * one name table per family between them.
 *   diffusers/PEFT  transformer.blocks.0.attn1.to_q.lora_A.weight      (.lora_B.weight; without the
 *                   transformer. prefix as a model's save_lora_adapter writes it)
 *   ComfyUI         diffusion_model.blocks.0.self_attn.q.lora_A.weight (or lora_down/lora_up; .alpha)
 *   kohya/musubi    lora_unet_blocks_0_self_attn_q.lora_down.weight    (.lora_up.weight, .alpha)
 * Each family's name table (model_family.h) maps diffusers' module names to those of the other
 * namings: Wan's ComfyUI and kohya keys use the original Wan module names (wan/modules/model.py);
 * CogVideoX's keep diffusers' module names in every naming. */
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace videotrain::models {

struct ModelFamily;  // model_family.h

enum class LoraPart { kDown, kUp, kAlpha };

struct LoraKey {
  std::string module;  // the diffusers module name: blocks.0.attn1.to_q, transformer_blocks.3.ff.net.2
  std::string naming;  // diffusers | comfyui | kohya
  std::string part;    // the suffix as found: .lora_A.weight, .lora_B.weight, .lora_down.weight, .lora_up.weight, .alpha
  LoraPart kind = LoraPart::kDown;
  std::string family;  // comfyui/kohya: the family whose name table matched (its name); "" for diffusers
};

// One family's LoRA-targetable Linears and their names in the ComfyUI/kohya namings (model_family.h's
// lora_names): each pair is (diffusers name, the name there); a family that keeps diffusers' names
// in every naming lists them twice.
struct LoraNameTable {
  const char *block_prefix;                                  // "blocks." (the blocks' ModuleList)
  std::vector<std::pair<const char *, const char *>> block;  // the modules of every block
  std::vector<std::pair<const char *, const char *>> top;    // the modules outside the blocks
  // PEFT keys without "transformer." that start so are diffusers module names.
  std::vector<const char *> diffusers_prefixes;
  // Why no loader reads the family's LoRAs in the ComfyUI or kohya naming; null: they do.
  const char *unloadable;
  // Non-null: kohya files hold only the blocks' modules, because of this loader.
  const char *kohya_blocks_only;
};
const LoraNameTable &wan_lora_names();
const LoraNameTable &cogvideox_lora_names();

// The diffusers module a ComfyUI name (or kohya's underscored one) of the table names, "" for none.
std::string lora_diffusers_name(const LoraNameTable &t, const std::string &name, bool underscored);
// The ComfyUI/kohya name of a diffusers module ("blocks.0.attn1.to_q" -> "blocks.0.self_attn.q"), or
// "" when the table has no such module.
std::string lora_original_name(const LoraNameTable &t, const std::string &diffusers_name);
// The modules of a block in diffusers' names (what diffusers' musubi converter requires in every block).
std::vector<std::string> lora_block_modules(const LoraNameTable &t);

// Parses a LoRA file's key. False with *why (starting with a verb: "is not a LoRA tensor ...",
// "names no Linear module ...") for anything else; a ComfyUI or kohya key gets the first family whose
// table names its module.
bool parse_lora_key(const std::string &key, LoraKey *out, std::string *why);
// The key of `module`'s part in `naming` ("" when the module has no name there).
std::string lora_key(const std::string &module, const std::string &naming, const ModelFamily &family, LoraPart part);

// Why a LoRA on `modules` (diffusers names) of `family` cannot be written in `naming` so that the
// loaders of that naming load it, naming the naming to use instead; "" when it can (the table's
// unloadable and kohya_blocks_only rules).
std::string lora_naming_problem(const std::vector<std::string> &modules, const std::string &naming,
                                const ModelFamily &family);

}  // namespace videotrain::models
