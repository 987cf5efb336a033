// libFuzzer target: the row facts ranks exchange through the store (elements/common/row_facts.cpp):
// any bytes parse or are refused without a crash, and what parses prints back to text that parses
// to the same facts.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "row_facts.h"

using namespace videotrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  std::vector<RowFact> facts;
  std::string why;
  if (!parse_row_facts(text, &facts, &why)) {
    fuzzin::check(!why.empty());
    return 0;
  }
  std::vector<RowFact> again;
  fuzzin::check(parse_row_facts(format_row_facts(facts), &again, &why));
  fuzzin::check(again == facts);
  normalise_row_facts(&again);
  for (size_t i = 1; i < again.size(); i++) fuzzin::check(again[i - 1] < again[i]);
  return 0;
}
