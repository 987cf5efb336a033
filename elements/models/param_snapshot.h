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

// Copies a snapshot's tensors into a model built from the same spec and dims (make_model with
// snap.model, snap.dims, snap.options) and sets it to evaluation. Throws naming the first
// tensor that does not match.
void load_snapshot(TrainModel &model, const ParamSnapshot &snap);

}  // namespace videotrain
