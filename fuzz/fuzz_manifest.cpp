// libFuzzer target: the CSV manifest index and its rows (csvvideosrc's manifest.cpp).
#include <cstddef>
#include <cstdint>

#include "csvvideosrc/manifest.h"
#include "fuzz_input.h"

using namespace videotrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzzin::MemFile file(data, size);
  // Plain, then with a split filter and named columns: the filter has its own scanner.
  for (int pass = 0; pass < 2; pass++) {
    ManifestOptions o;
    o.location = file.path();
    if (pass == 1) {
      o.split = "train";
      o.caption_column = "text";
    }
    std::string error;
    auto m = Manifest::open(o, &error);
    if (!m) {
      fuzzin::check(!error.empty());
      continue;
    }
    fuzzin::check(m->size() <= size);  // a row takes at least one byte
    for (size_t i = 0; i < m->size() && i < 512; i++) {
      ManifestRow r = m->row(i);
      fuzzin::check(r.error.empty() ? !r.path.empty() : true);
    }
    fuzzin::check(!m->row(m->size()).error.empty());
  }
  std::string text(reinterpret_cast<const char *>(data), size);
  size_t end = 0;
  parse_csv_record(text, 0, &end);
  fuzzin::check(end <= size);
  return 0;
}
