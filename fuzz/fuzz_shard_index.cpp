// libFuzzer target: the sharded-weights index parser (elements/models/diffusers_folder.cpp): every
// tensor it accepts maps to a plain file name beside the index (no folder, no way out of it).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "fuzz_input.h"
#include "models/diffusers_folder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  std::map<std::string, std::string> map;
  std::string error;
  if (!videotrain::models::parse_shard_index(text, &map, &error)) {
    fuzzin::check(!error.empty());
    return 0;
  }
  fuzzin::check(!map.empty());
  for (const auto &[name, file] : map)
    fuzzin::check(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..");
  return 0;
}
