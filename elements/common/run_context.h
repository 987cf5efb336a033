/* RunContext: what a training run offers the elements that follow it (validators),
 * without GStreamer or torch types here.
 *
 * ddptrainsink's engine is one; the element publishes it to its pipeline through a
 * GstContext (run_context_gst.h), and ddpvalsink finds it there by the trainer's name.
 * Everything a validator needs from the run goes through this interface, so that no
 * element folder includes another's headers and nothing is process-wide: validators of
 * the same run share their state in the context's attachments. */
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace videotrain {

// One completed optimizer step (identical on every rank except data_wait/local_loss).
struct StepReport {
  uint64_t step = 0;           // number of optimizer steps done, this one included
  unsigned epoch = 0;
  double loss = 0.0;           // averaged over ranks (and the step's micro-batches)
  double lr = 0.0;
  double grad_norm = 0.0;      // before clipping; NaN when not computed (or non-finite)
  double samples_per_s = 0.0;  // all ranks together
  double data_wait = 0.0;      // fraction of wall time spent waiting for buffers (this rank)
  bool skipped = false;        // non-finite loss or gradients: optimizer step skipped
  bool model_built = false;    // not a step: the model was just built (or resumed), before its first step
  bool finished = false;       // not a step: the run's end of stream is done (every rank ended), or failed
  // With finished: a step failed (a peer gone, nan-policy=fail, bad input, an interruption), so the
  // run trains no more; there is no final state worth sampling or validating.
  bool failed = false;
  // Every rank had a step callback when this step's all-reduce ran (the same on every
  // rank): subscribers that join a fast run at different steps (validators) all see the
  // steps where this is set, so that they can start at the same one.
  bool every_rank_subscribed = true;
};

// Copy of the trained state at a step boundary (torch types: models/param_snapshot.h).
struct ParamSnapshot;

class RunContext {
 public:
  virtual ~RunContext() = default;

  // Where the run is: this process's rank among world_size, its training device ("cpu",
  // "cuda:0"), and the c10d store every rank reaches (rank 0 serves it), with the
  // timeout the run allows a missing peer.
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string device_name() const = 0;
  virtual std::string master_addr() const = 0;
  virtual int master_port() const = 0;
  virtual double timeout_s() const = 0;

  // The trainer's model property (a diffusers folder, a TorchScript file, builtin:NAME).
  virtual std::string model_spec() const { return ""; }

  // Built (at start, or at the first micro-batch for built-in models), and steps done.
  virtual bool has_model() const = 0;
  virtual uint64_t steps_done() const = 0;

  /* snapshot_state() may be called from any thread: it returns a copy (on the training
   * device, detached) of every parameter and buffer as they are between two optimizer
   * steps, never halfway through one; null before the model exists. Step callbacks run
   * on the training thread right after each optimizer step, once with model_built set
   * when the model exists, before its first micro-batch is trained, and once with
   * finished set at the end of the run's end of stream or, with failed too, when a step
   * fails (keep them short; they may call
   * snapshot_state()). A callback added before a step's all-reduce sees that step; which
   * steps every rank's callbacks see says StepReport::every_rank_subscribed. */
  virtual std::shared_ptr<const ParamSnapshot> snapshot_state() const = 0;
  // The trainer keeps an EMA of its trainable parameters (ddptrainsink ema-decay > 0), and the
  // same copy as snapshot_state() with those parameters holding the EMA (weights=ema of the
  // validators and samplers); null without an EMA or a model.
  virtual bool has_ema() const { return false; }
  virtual std::shared_ptr<const ParamSnapshot> snapshot_ema() const { return nullptr; }
  using StepCallback = std::function<void(const StepReport &)>;
  virtual int add_step_callback(StepCallback cb) = 0;
  virtual void remove_step_callback(int id) = 0;
  /* The snapshots the follower subscribed as callback `id` takes: at every `every`-th step (0:
   * none), at step 0 with at_start (and the final one, which every follower may take); of the EMA
   * with ema. A trainer whose ranks hold only slices of them (ddptrainsink sharding=full's
   * weights, a sharded run's EMA) gathers them on every rank at the end of the steps that some
   * rank's follower wants (a collective, agreed in the step's all-reduce) and keeps that copy
   * until its next step; snapshot_state() / snapshot_ema() are null at any other step there. A
   * callback without a schedule counts as wanting every step. */
  virtual void set_snapshot_schedule(int id, uint64_t every, bool at_start, bool ema) {
    (void)id, (void)every, (void)at_start, (void)ema;
  }
  /* The report with `finished` set (and `failed`, for a failed run) once the step callbacks
   * have been handed it (recorded before they are called); false before. A run whose end
   * cannot be told says false. */
  virtual bool ended(StepReport *report) const {
    (void)report;
    return false;
  }
  /* add_step_callback() and set_snapshot_schedule() for a follower (ddpvalsink, ddpsampler)
   * that may join after the run ended: its final report went out before `cb` was added, so `cb`
   * gets it now, on this thread. The end is looked at after subscribing (ended() is set before the callbacks are
   * taken), so a run that ends in between is not missed; `cb` sees the final report once. */
  int follow_steps(StepCallback cb, uint64_t every, bool at_start, bool ema) {
    auto told = std::make_shared<std::atomic<bool>>(false);
    StepCallback once = [cb = std::move(cb), told](const StepReport &r) {
      if (r.finished && told->exchange(true)) return;
      cb(r);
    };
    const int id = add_step_callback(once);
    set_snapshot_schedule(id, every, at_start, ema);
    StepReport end;
    if (ended(&end)) once(end);
    return id;
  }

  // The run log: rank 0 appends a record from another thread (validation) to the run's
  // metrics file (one JSON line) and TensorBoard events, so that each stays one file.
  // False when the metrics file cannot be written; nothing on other ranks.
  virtual bool append_log(const std::string &json_line, uint64_t step,
                          const std::vector<std::pair<std::string, float>> &scalars) = 0;
  // A PNG (RGB) in the run's TensorBoard events under `tag` (samplesink's sample frames), with
  // tensorboard-dir: rank 0's events file, other ranks' own in <tensorboard-dir>/samples-rank<R>
  // (created at their first image); false where there is no events file.
  virtual bool append_image(const std::string &tag, uint64_t step, const std::string &png, int width, int height) {
    (void)tag, (void)step, (void)png, (void)width, (void)height;
    return false;
  }

  /* State that the validators of this run share (ddpvalsink's hub): the one stored under
   * `key` while someone holds it, else a new one from make(). The context keeps only a
   * weak reference, so the state goes with its last holder and may itself hold the
   * context. */
  template <typename T>
  std::shared_ptr<T> shared_state(const std::string &key, const std::function<std::shared_ptr<T>()> &make) {
    std::lock_guard<std::mutex> lock(attach_mu_);
    auto &slot = attachments_[key];
    if (auto live = slot.lock()) return std::static_pointer_cast<T>(live);
    std::shared_ptr<T> made = make();
    slot = made;
    return made;
  }

 private:
  std::mutex attach_mu_;
  std::map<std::string, std::weak_ptr<void>> attachments_;
};

}  // namespace videotrain
