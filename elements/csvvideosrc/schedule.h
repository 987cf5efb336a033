/* Which manifest row each clip of a rank's epoch takes.
 *
 * Epoch e uses a permutation of all N rows that depends only on (seed, e); rank r
 * takes positions r, r+W, r+2W, ... so the global order is independent of W, ranks
 * are disjoint, and every rank gets ceil(N/W) clips (positions past N wrap around to
 * the start of the permutation and are flagged as padding). */
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "seeded_hash.h"  // mix64, hash_combine: every seeded choice (permutations, clip starts)

namespace videotrain {

struct ScheduleSlot {
  uint64_t index = 0;    // manifest index
  bool padding = false;  // wrapped around to even out the ranks
};

class Schedule {
 public:
  Schedule(uint64_t rows, int rank, int world_size, bool shuffle, uint64_t seed);

  uint64_t rows() const { return rows_; }
  uint64_t clips_per_epoch() const { return clips_per_epoch_; }

  // Slot of clip `clip` (0-based, < clips_per_epoch) of `epoch` on this rank. Thread-safe.
  ScheduleSlot at(uint32_t epoch, uint64_t clip) const;

  // The k-th (k >= 1) replacement candidate for a failed clip: another sample of the
  // rank's shard in the same epoch, walking forward from the failed one; flagged as padding.
  ScheduleSlot replacement(uint32_t epoch, uint64_t clip, uint64_t k) const;

  // Global position -> row for an epoch (exposed for tests).
  uint64_t permuted(uint32_t epoch, uint64_t position) const;

 private:
  const std::vector<uint32_t> &permutation(uint32_t epoch) const;  // lock held

  uint64_t rows_;
  int rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  uint64_t clips_per_epoch_;
  mutable std::mutex lock_;
  // Permutations of the (at most two) epochs in use: prefetch may straddle an epoch end.
  mutable std::map<uint32_t, std::vector<uint32_t>> cache_;
};

}  // namespace videotrain
