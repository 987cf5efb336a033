// libFuzzer target: the Wan VAE config.json parser and what the loader computes from a config it
// accepts (elements/models/vae/wan_config.cpp): channel list, compressions, the tensor table.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "models/vae/wan_config.h"

using namespace videotrain::vae;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  (void)config_class_name(text);
  WanConfig c;
  std::string error;
  if (!parse_wan_config(text, &c, &error)) {
    fuzzin::check(!error.empty());
    return 0;
  }
  for (int d : c.dims()) fuzzin::check(d >= 1 && d <= 65536);
  fuzzin::check(c.spatial_compression() >= 1 && c.temporal_compression() >= 1);
  const auto table = wan_encoder_tensor_table(c);
  fuzzin::check(!table.empty());
  for (const auto &t : table)
    for (int64_t s : t.second) fuzzin::check(s >= 1);
  return 0;
}
