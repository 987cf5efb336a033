/* The copy of the trained state that RunContext::snapshot_state() returns (for
 * validators). Torch TUs only. */
#pragma once

#include <cstdint>
#include <string>

#include "train_model.h"

namespace videotrain {

struct ParamSnapshot {
  uint64_t step = 0;        // optimizer steps done when the copy was taken
  std::string model;        // the model property (TorchScript path or builtin:NAME)
  ModelDims dims;           // what the model was built for
  ModelOptions options;     // a native model's objective (val-sigmas), as the trainer built it
  NamedTensors parameters;  // detached copies on the training device
  NamedTensors buffers;
};

}  // namespace videotrain
