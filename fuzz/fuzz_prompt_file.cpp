// libFuzzer target: promptsrc's prompt file reader (elements/promptsrc/prompt_file.cpp): an accepted
// file has at least one prompt, indices in order, values in the documented ranges and texts within the
// cap; a refused one says why.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "promptsrc/prompt_file.h"

using namespace videotrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzzin::MemFile f(data, size);
  PromptFileLimits limits;
  limits.max_prompt_bytes = 64;
  limits.max_prompts = 1000;
  std::vector<Prompt> prompts;
  std::vector<std::string> warnings;
  std::string error;
  if (!read_prompt_file(f.path(), limits, &prompts, &warnings, &error)) {
    fuzzin::check(!error.empty());
    return 0;
  }
  fuzzin::check(!prompts.empty() && prompts.size() <= limits.max_prompts);
  for (size_t i = 0; i < prompts.size(); i++) {
    const Prompt &p = prompts[i];
    fuzzin::check(p.index == i && p.text.size() <= 64 && p.negative.size() <= 64);
    fuzzin::check(p.seed >= -1 && p.frames >= 0 && p.frames <= 100000);
    fuzzin::check((p.width == 0 || (p.width >= 8 && p.width <= 16384)) && (p.height == 0 || (p.height >= 8 && p.height <= 16384)));
  }
  return 0;
}
