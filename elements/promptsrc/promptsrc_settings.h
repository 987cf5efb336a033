/* promptsrc's properties in one struct, whose defaults the property specs read. No torch, no
 * GStreamer. */
#pragma once

#include <string>

#include "prompt_file.h"

namespace videotrain {

struct PromptSrcSettings {
  std::string location;     // the prompt file; "" = none (start fails naming location)
  PromptFileLimits limits;  // max-prompt-bytes (the other limits are fixed)
};

}  // namespace videotrain
