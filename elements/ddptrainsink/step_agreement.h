/* The end-of-stream step agreement of a multi-rank run (TrainerEngine::finish()).
 *
 * Ranks reach end of stream after different numbers of steps (Ctrl-C, queues of
 * different depth). Each rank announces in the run's store the step it starts before
 * any collective of it (begin), and the steps it had done when its data ended (end);
 * a rank whose data ended takes part in the steps its peers start, with no samples,
 * until every rank has ended at the same step, so that no rank is left alone in a
 * collective. No torch: the store's marks come through PeerMarks (DistGroup). */
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace videotrain {

// The store keys of the agreement (dist_group.h implements them on the c10d store).
class PeerMarks {
 public:
  virtual ~PeerMarks() = default;
  virtual void mark_begin(uint64_t step) = 0;
  virtual void mark_end(uint64_t steps_done) = 0;
  virtual uint64_t max_peer_begin() = 0;               // highest step a peer has started (0: none)
  virtual bool all_ended_at(uint64_t steps_done) = 0;  // every rank's data ended with this many steps
  virtual int peer_gone_before(uint64_t steps_done) = 0;  // a peer that left without ending there, or -1
  virtual std::string describe_peers() = 0;
};

class StepAgreement {
 public:
  // `cancelled` is polled while waiting for peers (an interrupted wait throws).
  StepAgreement(PeerMarks &marks, double timeout_s, std::function<bool()> cancelled = {})
      : marks_(marks), timeout_s_(timeout_s), cancelled_(std::move(cancelled)) {}

  // Before any collective of step `step` (peers that ended join it).
  void begin(uint64_t step) { marks_.mark_begin(step); }

  /* This rank's data ended after `steps_done` steps; `mid_step`: it was in the middle of
   * the next one, which peers may be in. `join` takes part in step steps_done + 1 with no
   * samples and returns the steps done after it. Returns when every rank has ended at
   * the same step (that step count); throws std::runtime_error when a peer left, the
   * wait for peers outlasts the timeout, or `cancelled` says so. */
  uint64_t join_until_all_end(uint64_t steps_done, bool mid_step, const std::function<uint64_t()> &join);

 private:
  PeerMarks &marks_;
  double timeout_s_;
  std::function<bool()> cancelled_;
};

}  // namespace videotrain
