// libFuzzer target: Wan's prompt cleaning (elements/textencoder/prompt_clean.cpp) on any bytes:
// no ends or runs of ASCII whitespace survive, and cleaning a cleaned prompt changes nothing
// but a second unescape.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "textencoder/prompt_clean.h"

using namespace videotrain::text;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  const std::string once = whitespace_clean(text);
  fuzzin::check(whitespace_clean(once) == once);
  if (!once.empty()) fuzzin::check(once.front() != ' ' && once.back() != ' ');
  fuzzin::check(once.find("  ") == std::string::npos && once.find('\t') == std::string::npos &&
                once.find('\n') == std::string::npos);
  const std::string clean = prompt_clean(text);
  fuzzin::check(whitespace_clean(clean) == clean);
  fuzzin::check(html_unescape(std::string()).empty());
  return 0;
}
