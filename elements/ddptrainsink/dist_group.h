/* Rendezvous (c10d TCPStore) and the process group (Gloo or NCCL) of one training
 * run, with collectives that fail with an error naming the peer and the operation
 * instead of hanging. Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "step_agreement.h"

namespace videotrain {

struct DistOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string backend = "gloo";  // resolved: gloo | nccl
  std::chrono::milliseconds timeout{600000};
  std::string prefix = "ddptrainsink";  // store key prefix of this group
  // While the rendezvous waits for ranks: told every ~15 s who is missing and until when;
  // asked whether to give up (a stop). Either may be empty.
  std::function<void(const std::string &)> on_waiting;
  std::function<bool()> cancelled;
};

// A collective or the rendezvous failed; what() names the operation and the peer.
class DistError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// True when this LibTorch was built with NCCL and the headers were compiled in.
bool nccl_available();

class DistGroup : public PeerMarks {
 public:
  // Connects to (rank 0: serves) the store and builds the process group. Throws DistError.
  explicit DistGroup(const DistOptions &opts);
  ~DistGroup();
  DistGroup(const DistGroup &) = delete;
  DistGroup &operator=(const DistGroup &) = delete;

  int rank() const { return opts_.rank; }
  int world_size() const { return opts_.world_size; }
  const std::string &backend() const { return opts_.backend; }
  std::chrono::milliseconds timeout() const { return opts_.timeout; }
  c10::intrusive_ptr<c10d::Store> store() const;

  // In-place sum over ranks; async (wait with wait()).
  c10::intrusive_ptr<c10d::Work> allreduce_async(std::vector<at::Tensor> &tensors);
  c10::intrusive_ptr<c10d::Work> broadcast_async(std::vector<at::Tensor> &tensors, int root);
  // Every rank's `input` into outputs[r] (one tensor per rank, input's size), synchronously within
  // the timeout; throws DistError naming `what`.
  void allgather(std::vector<at::Tensor> &outputs, const at::Tensor &input, const std::string &what);
  // The same in two halves, so that compute runs while it travels: allgather_start issues it
  // (every rank in the same order as its other collectives), allgather_finish waits for it (as
  // wait()) and leaves the results in the outputs. The Gather holds the tensors until then.
  struct Gather {
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<std::vector<at::Tensor>> out;  // the backend's outputs
    std::vector<at::Tensor> in, outputs;
    std::string what;
  };
  Gather allgather_start(std::vector<at::Tensor> outputs, const at::Tensor &input, const std::string &what);
  void allgather_finish(Gather &g);
  // Every rank's `input` summed, and this rank's slice of the sum (rank order, output's size) in
  // `output`: half an all-reduce's traffic. NCCL only (Gloo's reduce_scatter is missing in
  // LibTorch 1.13): reduce_scatter_supported() says.
  bool reduce_scatter_supported() const { return opts_.backend == "nccl"; }
  void reduce_scatter(at::Tensor &output, at::Tensor &input, const std::string &what);
  // Waits within the timeout; throws DistError naming `what` and the suspect peer(s). With
  // Gloo the wait wakes every few milliseconds to honour cancel().
  void wait(const c10::intrusive_ptr<c10d::Work> &work, const std::string &what);
  void allreduce(std::vector<at::Tensor> &tensors, const std::string &what);

  // Progress marker in the store (which step this rank finished), so that a failure
  // can name the rank that fell behind or went away. Best effort.
  void mark_progress(uint64_t step);
  void mark_exit();
  // End-of-stream agreement (store keys, see TrainerEngine::finish): the step this rank
  // is starting, and the steps it had done when its data ended. Throw DistError when
  // the store is gone.
  void mark_begin(uint64_t step) override;
  void mark_end(uint64_t steps_done) override;
  uint64_t max_peer_begin() override;               // highest step a peer has started (0: none)
  bool all_ended_at(uint64_t steps_done) override;  // every rank's data ended with this many steps
  // A peer that stopped (mark_exit) without ending at `steps_done`: -1 if none.
  int peer_gone_before(uint64_t steps_done) override;
  // "rank 1 (last finished step 1) stopped responding" or the store's state.
  std::string describe_peers() override;

  // Every rank's `mine` for `name` (a store key each; every rank calls it once per name), in rank
  // order. Waits (polling, so that cancel() ends it) within the timeout; throws DistError naming
  // the ranks that never posted, or the store's loss. Safe beside the training thread's use.
  // Empty when `needless` says, while waiting, that the answer is no longer needed.
  std::vector<std::string> exchange(const std::string &name, const std::string &mine,
                                    const std::function<bool()> &needless = {});
  // This rank's value of `name`, and every other rank's as posted so far (never blocks; "" for a
  // rank that posted none). Throw DistError when the store is gone.
  void post(const std::string &name, const std::string &value);
  std::vector<std::string> peek_all(const std::string &name);

  /* Interruption (ddptrainsink's unlock): from any thread, cancel(true) makes a wait() in
   * progress, and every later one until cancel(false), throw DistError at once. A
   * collective left that way may still be running in Gloo's threads with the peers out of
   * step, so the group is broken from then on: every later collective throws, and the
   * destructor hands it to a thread of its own (Gloo joins its threads only once the
   * stalled collective ends or times out), so that it returns at once. With NCCL the host
   * does not wait in wait() (the GPU does): there, cancel() is seen between collectives. */
  void cancel(bool on) { cancel_.store(on); }
  bool cancelled() const { return cancel_.load(); }
  bool broken() const { return broken_.load(); }

 private:
  // The error for a store operation that failed at `when` ("end of stream on rank 1").
  DistError store_gone(const std::string &when, const std::exception &e);
  // Throws DistError when the group is broken or cancelled, naming `what`.
  void check_usable(const std::string &what);
  struct Impl;
  DistOptions opts_;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> cancel_{false}, broken_{false};
};

}  // namespace videotrain
