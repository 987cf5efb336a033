// libFuzzer target: LoRA key naming (elements/models/lora_names.cpp): a key is refused with a reason
// or names a module; a module of any family's name table has keys in every naming that parse back to
// it, and a key in its naming's own spelling is the one lora_key writes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "models/lora_names.h"
#include "models/model_family.h"

using namespace videotrain::models;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string key(reinterpret_cast<const char *>(data), size);
  LoraKey k;
  std::string why;
  if (!parse_lora_key(key, &k, &why)) {
    fuzzin::check(!why.empty());
    return 0;
  }
  fuzzin::check(!k.module.empty() && (k.naming == "diffusers" || k.naming == "comfyui" || k.naming == "kohya"));
  const ModelFamily *family = family_named(k.family);
  fuzzin::check(k.naming == "diffusers" ? k.family.empty() : family != nullptr);
  const bool canonical = k.naming == "kohya" ? k.part != ".lora_A.weight" && k.part != ".lora_B.weight"
                                             : k.part != ".lora_down.weight" && k.part != ".lora_up.weight";
  if (k.naming != "diffusers" && canonical) fuzzin::check(lora_key(k.module, k.naming, *family, k.kind) == key);
  // Each family the module belongs to: its keys in every naming parse back to it.
  for (const auto &f : model_families()) {
    if (lora_original_name(*f.lora_names, k.module).empty()) continue;
    for (const char *naming : {"diffusers", "comfyui", "kohya"})
      for (LoraPart part : {LoraPart::kDown, LoraPart::kUp, LoraPart::kAlpha}) {
        const std::string again = lora_key(k.module, naming, f, part);
        if (again.empty()) continue;
        LoraKey back;
        fuzzin::check(parse_lora_key(again, &back, &why) && back.module == k.module && back.naming == naming &&
                      back.kind == part);
      }
  }
  return 0;
}
