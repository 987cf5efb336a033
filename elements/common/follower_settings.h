/* What ddpvalsink and ddpsampler (the trainer's followers) take of their trainer's steps: the
 * settings behind their every, at-start, skip-if-busy and weights properties, with the defaults
 * the property specs read (trainer_follower.h installs them). No GStreamer, no torch. */
#pragma once

#include <cstdint>

namespace videotrain {

struct FollowerSettings {
  uint64_t every = 500;       // optimizer steps; 0: only at-start and the trainer's end
  bool at_start = false;      // also step 0's weights, once the trainer has its model
  bool skip_if_busy = false;  // a due snapshot while the previous one waits is skipped, not waited for
  bool ema = false;           // weights=ema: the trainer's EMA (RunContext::snapshot_ema), not its weights
};

}  // namespace videotrain
