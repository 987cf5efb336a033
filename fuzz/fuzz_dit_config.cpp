// libFuzzer target: the WanTransformer3DModel config.json parser (elements/models/
// wan_transformer_config.cpp): a config it accepts has sizes a model can be built from, and what
// it writes back parses to the same config.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "models/wan_transformer_config.h"

using namespace videotrain::models;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  WanConfig c;
  std::string error;
  if (!parse_wan_transformer_config(text, &c, &error)) {
    fuzzin::check(!error.empty());
    return 0;
  }
  fuzzin::check(c.dim() >= 1 && c.dim() <= 65536 && c.attention_head_dim % 2 == 0);
  for (int64_t p : c.patch_size) fuzzin::check(p >= 1 && p <= 64);
  WanConfig again;
  fuzzin::check(parse_wan_transformer_config(wan_transformer_config_json(c), &again, &error));
  fuzzin::check(again.dim() == c.dim() && again.num_layers == c.num_layers && again.ffn_dim == c.ffn_dim);
  return 0;
}
