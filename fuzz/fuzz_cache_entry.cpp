// libFuzzer target: the latent cache's entry reader (elements/common/latent_store.cpp), in memory
// and through a file as lookups and `videotrain-cache verify` read it. An entry it accepts holds
// tensors whose bytes match their shapes and re-encodes to an entry that reads back the same.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "latent_store.h"

using namespace videotrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string bytes(reinterpret_cast<const char *>(data), size);
  CacheEntry e;
  std::string why;
  const std::vector<TensorSpec> expect = {{"moments", "float32", {1, -1, -1, -1, -1}}};
  (void)decode_cache_entry(bytes, &e, &why, "0123456789abcdef", &expect);
  fuzzin::MemFile f(data, size);
  (void)LatentStore::verify_file(f.path());
  if (!decode_cache_entry(bytes, &e, &why)) {
    fuzzin::check(!why.empty());
    return 0;
  }
  for (const auto &t : e.tensors) {
    uint64_t n = t.dtype == "float32" ? 4 : t.dtype == "int64" || t.dtype == "float64" ? 8 : 2;
    for (int64_t d : t.shape) {
      fuzzin::check(d >= 0);
      n *= static_cast<uint64_t>(d);
    }
    fuzzin::check(n == t.bytes.size());
  }
  CacheEntry back;
  fuzzin::check(decode_cache_entry(encode_cache_entry(e, e.key), &back, &why, e.key));
  fuzzin::check(back.tensors.size() == e.tensors.size());
  for (size_t i = 0; i < e.tensors.size(); i++)
    fuzzin::check(back.tensors[i].bytes == e.tensors[i].bytes && back.tensors[i].shape == e.tensors[i].shape);
  return 0;
}
