/* Before a transformer is built from config.json: the sizes the config declares against the weight
 * files' headers, so that a config of another width or depth than its weights (a 14B config over a
 * small model's weights) is refused in a moment, naming the tensor, instead of allocating the
 * declared model first (tens of GB) and failing there. No torch. */
#pragma once

#include <string>

#include "diffusers_folder.h"

namespace videotrain::models {

// "" when the folder's headers hold what its config declares (where they hold the tensors checked:
// a tensor that is missing is left to the strict load, which names it), else why not.
std::string precheck_dit_folder(const DiffusersFolder &folder);

}  // namespace videotrain::models
