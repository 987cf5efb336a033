/* See step_agreement.h. */
#include "step_agreement.h"

#include <chrono>
#include <stdexcept>
#include <thread>

namespace videotrain {

uint64_t StepAgreement::join_until_all_end(uint64_t steps_done, bool mid_step,
                                           const std::function<uint64_t()> &join) {
  uint64_t joined = steps_done;
  if (mid_step) {
    joined = steps_done + 1;  // announced: peers may be in it
    steps_done = join();
  }
  marks_.mark_end(steps_done);
  const auto timeout = std::chrono::duration<double>(timeout_s_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!marks_.all_ended_at(steps_done)) {
    if (cancelled_ && cancelled_())
      throw std::runtime_error("end of stream after step " + std::to_string(steps_done) +
                               ": interrupted while waiting for the other ranks to end (the pipeline stopped)");
    const uint64_t peer = marks_.max_peer_begin();
    if (peer > joined) {
      joined = peer;
      steps_done = join();
      marks_.mark_end(steps_done);
      deadline = std::chrono::steady_clock::now() + timeout;  // a peer made progress
      continue;
    }
    if (int gone = marks_.peer_gone_before(steps_done); gone >= 0)
      throw std::runtime_error("end of stream after step " + std::to_string(steps_done) + ": rank " +
                               std::to_string(gone) + " stopped without reaching it (it failed or was stopped)");
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("end of stream after step " + std::to_string(steps_done) + ": waited " +
                               std::to_string(static_cast<int>(timeout_s_)) +
                               " s for the other ranks to end or start a step: " + marks_.describe_peers());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return steps_done;
}

}  // namespace videotrain
