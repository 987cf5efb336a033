/* TrainerEngine::Impl, shared by the engine's torch TUs: trainer_engine.cpp (the steps),
 * trainer_setup.cpp (start: rank, device, rendezvous, model)
 * and trainer_checkpoints.cpp (writing, rescuing and resuming checkpoints). Private to
 * ddptrainsink. */
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bucket_reducer.h"
#include "checkpoint_store.h"
#include "dist_group.h"
#include "ema_weights.h"
#include "lr_schedule.h"
#include "models/train_model.h"
#include "optimizers/train_optimizer.h"
#include "param_shards.h"
#include "run_log.h"
#include "step_agreement.h"
#include "trainer_engine.h"

namespace videotrain {

double now_s();  // the steady clock, in seconds

struct TrainerEngine::Impl {
  TrainerConfig cfg;
  std::string error;
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  c10::Device device{c10::kCPU};
  bool bf16 = false;
  std::string backend = "gloo";
  std::unique_ptr<DistGroup> group;
  std::mutex group_use;  // other threads' use of group (agree_row_facts) against stop()'s reset
  // This rank's (and a resumed checkpoint's) row facts; the checkpoint's writer reads them while
  // csvvideosrc's workers add to them (never under group_use, which an agreement holds long).
  std::mutex facts_mu;
  std::atomic<bool> wants_no_data{false};  // max-steps reached or end of stream: data is not trained on
  // A peer joined a step with no samples: its data ended (it was asked to stop: SIGTERM, Ctrl-C), so
  // this rank stops at this step boundary too instead of training on alone until the timeout.
  bool peer_ended = false;
  std::string row_facts, row_facts_lost;  // row_facts_lost: why posting them failed (informative)
  // For a checkpoint (training thread: the group stays): every rank's with `peers`, else this rank's.
  std::string all_row_facts(bool peers);
  std::unique_ptr<StepAgreement> agreement;  // with group
  std::unique_ptr<TrainModel> model;
  ModelDims dims;  // what the model was built for
  ModelOptions model_opts;  // native models' objective (from the properties)
  uint64_t exported_step = 0;  // the step export_model() last wrote (0: none)
  // The stream's conditioning from its caps (set_stream_text), checked against the model
  // when both are known: -1 unknown, 0 captions, 1 text embeddings.
  int stream_text = -1;
  std::vector<at::Tensor> params;
  OptimizerSettings optim;  // cfg's optimizer settings, resolved by resolve()
  std::unique_ptr<TrainOptimizer> opt;
  std::unique_ptr<EmaWeights> ema;  // with ema-decay (under state_mu, like the weights)
  EmaSchedule ema_schedule() const { return {cfg.ema_decay, cfg.ema_start_step, cfg.ema_every}; }
  // RunContext's snapshots: the weights, or with_ema the trainable ones' EMA (null without one).
  std::shared_ptr<const ParamSnapshot> snapshot(bool with_ema) const;
  std::unique_ptr<BucketReducer> reducer;
  // sharding=optimizer|full: the shards the optimizer steps (params and param_names are theirs then;
  // the model's own parameters are in shards->param_names()).
  std::unique_ptr<ParamShards> shards;
  void shard_model();  // build_model(), after the broadcast: the shards, and the optimizer over them

  uint64_t steps_done = 0;
  // The step in progress.
  bool in_step = false;
  bool joining = false;  // taking part in a step with no samples (data ended here)
  at::Tensor step_loss;  // sum of weighted micro-batch losses (device)
  unsigned step_samples = 0;
  unsigned epoch = 0;
  uint64_t next_clip = 0;
  // This rank's data position before the step in progress: what the position goes back to when the
  // step's micro-batches are dropped (end of stream or a restart in the middle of it).
  std::pair<unsigned, uint64_t> step_start{0, 0};
  std::vector<std::pair<unsigned, uint64_t>> positions;  // every rank's data position after the last step
  double last_loss = std::numeric_limits<double>::quiet_NaN();

  bool resumed = false;
  ResumePoint rp;
  FoundCheckpoint resume_from;
  std::string resume_error;  // why this rank cannot resume (reported after the ranks agree)
  std::unique_ptr<CheckpointStore> store;  // with checkpoint-dir
  uint64_t last_ckpt_step = std::numeric_limits<uint64_t>::max();
  // The step the newest checkpoint of this run holds; 0 when none was written.
  uint64_t saved_step() const { return last_ckpt_step == std::numeric_limits<uint64_t>::max() ? 0 : last_ckpt_step; }
  double last_ckpt_time = 0;  // clock() at the last checkpoint or the start
  bool finished = false;      // finish() succeeded
  // Set while the optimizer updates the weights, cleared once the step is counted: still
  // set after an exception means the weights may be half-updated (no rescue checkpoint).
  bool updating = false;
  bool rescue_tried = false;
  bool step_failed = false;  // an exception left process_*() or finish() (a collective may be pending)
  bool interrupted = false;  // the last failure was interrupt(): no error to report
  std::string rescue_why;  // why no rescue checkpoint was written ("" when none was needed)

  // Non-finite steps: in a row (nan-policy=skip's bound) and over the run.
  uint64_t skipped_in_row = 0, steps_run = 0, steps_applied = 0;

  // Throughput window (since the last log).
  double window_start = 0, window_wait = 0;
  uint64_t window_samples = 0;

  std::vector<Message> messages;
  std::function<void()> message_hook;     // see set_message_hook()
  std::atomic<bool> start_cancelled{false};  // interrupt(): the rendezvous gives up
  RunLog run_log;  // metrics file and events: the training thread and validation write
  bool metrics_warned = false;

  mutable std::mutex state_mu;  // parameters change under it (optimizer step, loads)
  std::mutex cb_mu;
  std::map<int, StepCallback> callbacks;
  struct SnapshotSchedule {
    uint64_t every = 0;
    bool at_start = false, ema = false;
  };
  std::map<int, SnapshotSchedule> schedules;  // by callback id (under cb_mu); none: every step
  // Where the ranks hold only slices of what a snapshot copies (sharding=full's weights, a sharded
  // run's EMA): whether this rank's followers want the weights' ({raw, ema}) snapshot of `step`
  // (final: the run's end, which every follower takes), and the copies gathered for them, of
  // gathered_step (under state_mu). gather_snapshots() is a collective: every rank calls it at the
  // same point with the same (all-reduced) flags.
  bool sliced_weights() const;
  bool sliced_ema() const { return shards && ema; }
  std::pair<bool, bool> snapshots_wanted(uint64_t step, bool final);
  // The wants of every rank (an all-reduce; outside a step's, whose stats carry them).
  std::pair<bool, bool> agree_snapshots_wanted(uint64_t step, bool final);
  void gather_snapshots(bool raw, bool with_ema);
  std::shared_ptr<const ParamSnapshot> gathered[2];  // [with_ema]
  // A sharded run's EMA whole on every rank, by parameter name (collective).
  NamedTensors gathered_ema() {
    std::vector<at::Tensor> slices;
    for (const auto &[n, t] : ema->tensors()) slices.push_back(t);
    return shards->gather_whole(slices);
  }
  std::unique_ptr<EmaWeights> whole_ema;  // export_model(): a sharded run's EMA, gathered
  // The snapshot with `trainable` (by name) in place of the model's trainable parameters.
  // fresh: they are this copy's own already.
  std::shared_ptr<ParamSnapshot> copy_state(const std::map<std::string, at::Tensor> &trainable, bool fresh) const;
  int next_cb = 1;
  bool ended = false;  // the final report (ended_report) has gone to the callbacks: RunContext::ended()
  StepReport ended_report;

  bool fail(const std::string &msg) {
    error = msg;
    return false;
  }
  double clock() const;  // cfg.clock, or the steady clock
  void warn(const std::string &text) {
    messages.push_back(Message::warning(text));
  }

  bool resolve();
  std::vector<std::string> param_names;  // of params
  // The model and optimizer on this rank (no collective); build_model() then broadcasts
  // rank 0's weights and sets up the reducer.
  void construct_model(const ModelDims &d);
  // model_opts from the properties: "" or what is wrong, naming the property.
  std::string resolve_model_options();
  // A finished run of a native model: rank 0 writes its diffusers folder (export-dir).
  void export_model();
  void build_model(const ModelDims &d);
  // "" when the model takes what the stream carries (or either is not known yet).
  std::string inputs_mismatch() const {
    return model && stream_text >= 0 ? check_model_inputs(*model, stream_text == 1) : "";
  }
  LrScheduleParams lr_params;  // from cfg, parsed by resolve()
  double lr_at(uint64_t done) const { return videotrain::lr_at(lr_params, done); }
  double grad_norm() const;
  // Reduces, steps the optimizer, reports; false when no rank had samples (no step).
  bool end_step();
  // After this rank's end of stream, with peers (step_agreement.h): step steps_done + 1
  // with no samples.
  void join_step();
  // Micro-batches per step (the last step's), and how many of the step in progress this rank ran:
  // join_step() under sharding=full takes part in the rest of the peers'.
  unsigned micro_count = 1, join_micro_done = 0;
  void write_checkpoint();
  // Rank 0's files, commit, local prune and messages of a checkpoint of steps_done. shards_in: a
  // sharded rescue's folder holding every rank's shard file (moved in; no collective).
  std::string save_checkpoint(bool rescue, const std::string &shards_in = "");
  // Stopped without the final checkpoint (stop without EOS, an error): rank 0 alone, no
  // collective, writes the last completed step when it is newer than the last checkpoint
  // and the state is whole and finite. True when it wrote one; else rescue_why says why not.
  // Sharded runs: every rank writes its shard, rank 0 seals them (rescue_shards()).
  bool rescue(const std::string &context);
  bool rescue_shards(const std::string &context);
  bool all_steps_skipped() const { return steps_run > 0 && steps_applied == 0; }
  std::string all_skipped_text() const;
  // Loads `c` into the model (built as needed): "" when its weights and optimizer state
  // are finite, else why it cannot be used. Throws when a verified one does not load.
  std::string load_checkpoint(const FoundCheckpoint &c);
  void load_sharded(const FoundCheckpoint &c);  // a sharding= checkpoint's shards, into the whole model
  std::string first_non_finite_optimizer();  // "exp_avg_sq of NAME" (any optimizer's state), or ""
  std::string first_non_finite_grad() const;  // parameter name, or ""
  void find_checkpoint();
  void agree_resume_step();
  bool logged_step(uint64_t step) const { return cfg.log_every > 0 && step % cfg.log_every == 0; }
  void report(const StepReport &r);  // a message and the run log every log-every steps, then notify()
  void log_report(const StepReport &r);  // the message and the run log of one step
  // The last step when log-every passed it over: logged at end of stream, so that a run that
  // ends between two logged steps (or before the first) still records where it ended.
  StepReport unlogged;
  bool has_unlogged = false;
  // Steps per second between two logged steps (the progress line's rate and ETA).
  double rate_time = -1;
  uint64_t rate_step = 0;
  double steps_per_s = 0;
  void notify(const StepReport &r);  // the step callbacks
  // process_inputs() without its failure report.
  ProcessResult process(const ModelInputs &in, const BatchInfo &info);
  // The step callbacks' report of a failed run (finished and failed set), once: what waits for
  // the next step (a sampler) learns that none will come.
  void report_failure();
  bool failure_reported = false;
  void metrics_written(bool ok);  // warns once when rank 0's metrics file cannot be written
};

}  // namespace videotrain
