/* TrainerEngine: the work behind ddptrainsink, without GObject and without torch
 * types in this header (pimpl), so that the element face compiles without LibTorch.
 *
 * One engine per process (rank). Micro-batches come in one at a time; each one is
 * forward/backward'ed; on the last micro-batch of a step (sync) the gradients are
 * all-reduced by the bucketed reducer while backward runs, then the optimizer steps
 * (optimizer=, optimizers/train_optimizer.h).
 *
 * Threading: start()/process_*()/finish()/stop() are called from one thread at a time
 * (the element's streaming thread or state changes). The engine is the run's
 * RunContext (run_context.h): snapshot_state(), the step callbacks and append_log() are
 * for other threads (validators). Buffers are read into these plain values by
 * trainer_buffers.h. */
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "batch_info.h"
#include "sharding.h"
#include "bus_message.h"
#include "models/model_options.h"
#include "optimizers/optimizer_settings.h"
#include "run_context.h"

namespace at {
class Tensor;
}

namespace videotrain {

struct TrainerConfig {
  // Model and optimisation.
  std::string model;              // TorchScript file, diffusers transformer folder, or builtin:NAME
  int latent_channels = 0;        // 0: from the first micro-batch (builtin models)
  // eps < 0: the optimizer's own (optimizers/optimizer_settings.h), e.g. AdamW's 1e-8.
  double lr = 1e-4, weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = -1;
  std::string optimizer = "adamw";  // adamw | adamw8bit | adafactor | prodigy | came | sgd
  OptimizerExtras optim;            // the hyper-parameters only some optimizers use
  std::string lr_schedule = "constant";  // constant | cosine | linear
  uint64_t warmup_steps = 0;
  uint64_t max_steps = 0;         // 0: until EOS
  double grad_clip = 0.0;         // global norm; 0: off
  std::string device;             // "" / "auto": resolve_device() (device_rule.h)
  std::string precision = "auto"; // auto | fp32 | bf16
  bool tune_malloc = true;        // on CPU: retain_cpu_heap() (process-wide)
  uint64_t seed = 0;
  // Native models (diffusers folders): objective, memory, LoRA (seed and the parsed values
  // timestep_lo/hi and val_sigmas are filled at start from `seed` and the two strings below).
  ModelOptions native;
  std::string timestep_range = "0,1000";  // LO,HI in [0, 1000]
  std::string val_sigmas = "0.25,0.5,0.75";
  std::string save_dtype = "bf16";        // bf16 | fp16 | fp32: the exported folder's weights
  std::string export_dir;                 // "": <checkpoint-dir>/transformer (or /lora) when the model is a folder
  // EMA of the trainable parameters (ema_weights.h): decay 0 = off; a copy up to ema_start_step, then
  // averaged at every ema_every-th step; export_ema: the end-of-run export writes it too (<export>_ema).
  double ema_decay = 0;
  uint64_t ema_start_step = 0, ema_every = 1;
  bool export_ema = false;
  // Distributed (-1 / 0 / "" = from the environment).
  int rank = -1, world_size = 0, master_port = 0;
  std::string master_addr;
  std::string backend = "auto";   // auto | nccl | gloo
  double timeout_s = 600.0;
  double bucket_cap_mb = 25.0;
  // none: DDP; optimizer: ZeRO-2 (optimizer state and gradients sharded); full: weights too (param_shards.h).
  Sharding sharding = Sharding::none;
  // sharding=full's block all-gathers: auto (bf16 where the run computes in bf16, else fp32) | fp32 |
  // bf16 (the float32 shards stay the optimizer's); prefetch: auto (true on CUDA) | true (the next
  // block's issued while a block computes: two blocks in memory) | false (each gathered when used);
  // the same results either way.
  std::string gather_dtype = "auto";
  std::string gather_prefetch = "auto";
  // Checkpoints.
  std::string checkpoint_dir;
  uint64_t checkpoint_every = 0;  // steps; 0: only at the end
  // Seconds after the last checkpoint (or the start) at which the next step writes one,
  // on rank 0's clock (agreed at the step's all-reduce); 0: off.
  double checkpoint_interval_s = 1800;
  unsigned keep_checkpoints = 3;  // 0: keep all
  bool resume = false;
  std::string nan_policy = "skip"; // skip | fail
  unsigned max_skipped_steps = 10; // nan-policy=skip: steps skipped in a row before an error; 0: no bound
  // Monotonic seconds for checkpoint-interval; empty: the steady clock (tests inject one).
  std::function<double()> clock;
  // Progress.
  unsigned log_every = 10;
  std::string metrics_file;
  std::string tensorboard_dir;
};

struct ResumePoint {
  unsigned epoch = 0;
  uint64_t clip = 0;
  uint64_t step = 0;  // next optimizer step
  std::string row_facts;  // csvvideosrc's row facts of every rank when it was written (row_facts.h)
  // Written by another number of ranks (0: this one): its world size and every old rank's next
  // clip in `epoch` ("c0,c1,..."), for the source to find the global position.
  int world_then = 0;
  std::string clips_then;
};

// The gradient reducer after the last sync step (tests; see bucket_reducer.h). Empty
// with one rank.
struct ReducerInfo {
  std::vector<std::vector<size_t>> buckets;  // parameter indices, in launch order
  std::vector<size_t> bucket_bytes;
  std::vector<size_t> param_bytes;           // by parameter index
  bool rebuilt = false;                      // buckets follow the gradients' arrival order
  std::vector<size_t> launch_order;          // buckets as launched in the last sync step
  std::vector<size_t> pending_at_launch;     // gradients still to come at each launch
  // sharding=full: block weight all-gathers so far, how many were issued ahead of their use, and
  // their dtype ("fp32" | "bf16"; "" without).
  int64_t gathers = 0, gathers_ahead = 0;
  std::string gather_dtype;
};

// Latents with captions or text embeddings (torch types: see models/train_model.h).
struct ModelInputs;

enum class ProcessResult {
  kOk,
  kDone,         // max-steps reached: EOS
  kError,
  kInterrupted,  // interrupt() ended the wait in a collective: no error to report
};

class TrainerEngine : public RunContext {
 public:
  explicit TrainerEngine(const TrainerConfig &config);
  ~TrainerEngine();
  TrainerEngine(const TrainerEngine &) = delete;
  TrainerEngine &operator=(const TrainerEngine &) = delete;

  // Resolves rank/world/device, joins the process group, loads the model (unless it
  // must wait for the first micro-batch to know its channels) and, with resume, the
  // newest checkpoint that verifies (checkpoint_store.h). False with error().
  bool start();
  // Where this rank's data resumes (valid after start() when resumed() is true).
  bool resumed() const;
  ResumePoint resume_point() const;

  // One micro-batch: tensor [m, C, t, h, w] (any device/float dtype). `info` is its batch meta
  // (BatchInfo{}: a whole step on its own); the model gets the samples' captions, ids and epoch
  // from it.
  ProcessResult process_tensor(const at::Tensor &batch, const BatchInfo &info);
  // The same with text embeddings [m, L, D] and mask [m, L] when `in` has them (a textencoder), and
  // image-to-video's tensors; in's captions, sample_ids and epoch are replaced by info's.
  ProcessResult process_inputs(const ModelInputs &in, const BatchInfo &info);
  // The stream's caps say whether micro-batches carry text embeddings: false with error() when
  // the model (if built) takes the other conditioning, so that the mismatch is an error before
  // the first micro-batch. process_inputs() checks it again for models built later.
  bool set_stream_text(bool has_text);
  // Time the caller spent waiting for this micro-batch (for the data-wait fraction).
  void add_wait_time(double seconds);

  // End of stream. With peers, first waits until every rank's data has ended at the
  // same step: ranks whose data ended earlier take part in the later steps with no
  // samples (the update averages over the ranks that had some), so that Ctrl-C or
  // queues of different depth never leave a rank alone in a collective. Then writes the
  // final checkpoint (unless one was written for this step).
  bool finish();
  // Ends the run. Without a successful finish() (a stop without EOS, an error) rank 0
  // writes a rescue checkpoint of the last completed step when it is newer than the last
  // checkpoint: alone, with no collective (peers may be dead), never of NaN/Inf weights or
  // of weights a failed update may have half-changed. process_*() and finish() do the same
  // when they fail (not with backend=nccl, where a failed collective may hold the GPU).
  // A warning names it, or says which steps are lost and why.
  void stop();

  /* From any thread (the element's unlock): interrupt(true) makes a process_*() or finish()
   * waiting in a collective return at once (kInterrupted; finish(): false with
   * interrupted()), instead of waiting up to `timeout` for a stalled peer; interrupt(false)
   * lets later collectives wait again. An interrupted collective leaves the ranks out of
   * step: the run cannot train on (later process_*() fail with an error saying so), and
   * stop() still writes the rescue checkpoint of the last completed step. Gloo only: with
   * NCCL the wait is on the GPU, and the interruption is seen at the next collective.
   * It also ends start()'s wait for the other ranks at rendezvous (start() then fails). */
  void interrupt(bool on);
  // Called on start()'s thread when it queued a message while it waits (the rendezvous
  // says every ~15 s which ranks are missing), so that the face posts it then.
  void set_message_hook(std::function<void()> hook);
  bool interrupted() const;  // the last failure came from interrupt()

  /* csvvideosrc's row facts (row_facts_query.h) before it plans `epoch`, from its worker thread:
   * posted to the run's store, and true with every rank's in *all once all have posted; false
   * with why in *all, or an empty *all when the run is stopping (interrupt()). With one rank,
   * *all = mine. */
  bool agree_row_facts(uint32_t epoch, const std::string &mine, std::string *all);
  // A row fact csvvideosrc just learned (its worker thread): kept, posted to the store for rank 0,
  // and written with every checkpoint (all ranks' facts), so that a resumed source knows them.
  void note_row_facts(const std::string &facts);

  const std::string &error() const;
  // Messages that a face posts: drained by the caller after each call.
  // ddptrainsink-step | ddptrainsink-checkpoint | warning (text in "text")
  using Message = BusMessage;
  std::vector<Message> take_messages();

  // RunContext.
  int rank() const override;
  int world_size() const override;
  std::string device_name() const override;
  std::string model_spec() const override;
  std::string master_addr() const override;
  int master_port() const override;
  double timeout_s() const override;
  uint64_t steps_done() const override;
  bool has_model() const override;  // built (at start(), or at the first micro-batch for builtin models)
  std::shared_ptr<const ParamSnapshot> snapshot_state() const override;
  bool has_ema() const override;
  std::shared_ptr<const ParamSnapshot> snapshot_ema() const override;
  int add_step_callback(StepCallback cb) override;
  void remove_step_callback(int id) override;
  void set_snapshot_schedule(int id, uint64_t every, bool at_start, bool ema) override;
  bool ended(StepReport *report) const override;
  bool append_image(const std::string &tag, uint64_t step, const std::string &png, int width, int height) override;
  bool append_log(const std::string &json_line, uint64_t step,
                  const std::vector<std::pair<std::string, float>> &scalars) override;

  double last_loss() const;  // averaged over ranks, last completed step

  // Parameters (and buffers, if asked) copied to CPU float32, by name (tests, equivalence checks).
  std::map<std::string, std::vector<float>> parameters_cpu(bool with_buffers = false) const;
  // The EMA of the trainable parameters, by name, on CPU float32 (empty without ema-decay).
  std::map<std::string, std::vector<float>> ema_cpu() const;
  ReducerInfo reducer_info() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace videotrain
