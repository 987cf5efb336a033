/* One micro-batch's facts, from the buffer's batch meta (metas.h reads and writes it) to the
 * trainer (TrainerEngine::process_*) and the validator: plain values, no GStreamer, no torch. */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace videotrain {

/* The defaults describe a buffer without a batch meta: a whole optimizer step on its own. */
struct BatchInfo {
  uint64_t step = 0;
  uint32_t micro_index = 0;
  uint32_t micro_count = 1;
  uint32_t step_samples = 0;  // samples in the whole step; 0: this micro-batch's
  bool sync = true;           // the step's last micro-batch: all-reduce and update after it
  uint32_t epoch = 0;      // data position after the step: epoch ...
  uint64_t next_clip = 0;  // ... and next clip index of that epoch
  // One entry per sample of the micro-batch.
  std::vector<uint64_t> sample_ids;
  std::vector<std::string> captions;
  std::vector<bool> padding;
  std::vector<uint64_t> clip_indices;
  std::vector<uint32_t> epochs;
};

}  // namespace videotrain
