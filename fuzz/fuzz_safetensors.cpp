// libFuzzer target: the safetensors header reader (elements/common/safetensors.cpp).
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "safetensors.h"

using namespace videotrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzzin::MemFile file(data, size);
  std::string error;
  auto f = SafetensorsFile::open(file.path(), &error);
  if (!f) {
    fuzzin::check(!error.empty());
    return 0;
  }
  size_t total = 0;
  for (const auto &[name, e] : f->entries()) {
    // What the loader relies on: the bytes are in the file and match dtype x shape.
    // A zero anywhere in the shape makes it empty, whatever comes before it: look for one first,
    // then multiply (stopping once past the file's size, which the reader must have refused).
    bool empty = false;
    for (int64_t d : e.shape) {
      fuzzin::check(d >= 0);
      empty = empty || d == 0;
    }
    unsigned __int128 want = empty ? 0 : safetensors_dtype_size(e.dtype);
    for (int64_t d : e.shape) {
      if (empty) break;
      want *= uint64_t(d);
      if (want > size) break;
    }
    fuzzin::check(want == e.nbytes);
    fuzzin::check(e.nbytes <= size);
    total += e.nbytes;
    if (e.nbytes) {
      volatile uint8_t first = e.data[0], last = e.data[e.nbytes - 1];  // in the mapping
      (void)first;
      (void)last;
    }
  }
  (void)total;
  return 0;
}
