// libFuzzer target: the CogVideoX VAE config.json parser and the checks and tensor table
// that follow it when the encoder loads (elements/models/vae/vae_config.cpp).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "models/vae/vae_config.h"

using namespace videotrain::vae;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  VaeConfig c;
  std::string error;
  if (!parse_vae_config(text, &c, &error)) {
    fuzzin::check(!error.empty());
    return 0;
  }
  if (!check_supported(c).empty()) return 0;
  // What the loader does next with a supported config.
  auto table = encoder_tensor_table(c);
  fuzzin::check(!table.empty());
  (void)c.spatial_compression();
  VaeConfig back;
  fuzzin::check(parse_vae_config(vae_config_to_json(c), &back, &error));
  fuzzin::check(encoder_tensor_table(back) == table);
  return 0;
}
