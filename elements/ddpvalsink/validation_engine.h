/* ValidationEngine: the work behind ddpvalsink, without GObject (pimpl: no torch types
 * here except the at::Tensor declaration the tensor entry point needs).
 *
 * One engine per ddpvalsink. The engines of the sinks that validate the same run share
 * a hub, kept in the run's RunContext (shared_state "ddpvalsink/hub"): the hub takes the
 * trainer's snapshots (step callbacks: every `every` steps, at-start once the model
 * exists, and the final one when the trainer's finish() is done), gives
 * each shard a pending slot of size 1, adds up the shards' sums when a pass ends, and
 * the shard that completes a pass last all-reduces (sum, count) over ranks on the
 * validation process group (its own Gloo group on the trainer's c10d store, prefix
 * "ddpvalsink/") and reports the mean.
 *
 * Threading: push()/end_of_stream() run on the sink's streaming thread and may block
 * (waiting for a snapshot); set_flushing() wakes them. trainer_finished() may run on any
 * thread. Buffers are read into push()'s plain values by val_buffers.h. */
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "models/attention_backend.h"
#include <vector>

#include "bus_message.h"
#include "follower_settings.h"

namespace at {
class Tensor;
}

namespace videotrain {

class RunContext;

// every, at-start, skip-if-busy and weights: FollowerSettings.
struct ValidationConfig : FollowerSettings {
  unsigned shard_index = 0, num_shards = 1;
  unsigned batch_size = 1;        // samples evaluated together (latents input)
  std::string device;             // "" / "auto": the trainer's device
  // Cross-rank group on the run's c10d store: ""/0 take the run's address, port and timeout.
  std::string master_addr;
  int master_port = 0;
  double timeout_s = 0.0;
  AttentionBackend attention_backend = AttentionBackend::automatic;  // native models' kernel, on `device`
};

// One validation sample as the metas describe it.
struct ValSample {
  uint64_t sample_id = 0;
  unsigned epoch = 0;
  uint64_t clip_index = 0;
  bool padding = false;
  std::string caption;
};

class ValidationEngine {
 public:
  explicit ValidationEngine(const ValidationConfig &config);
  ~ValidationEngine();
  ValidationEngine(const ValidationEngine &) = delete;
  ValidationEngine &operator=(const ValidationEngine &) = delete;

  // Joins the hub of the run (creating it with the first shard). False with error():
  // shard-index out of range, the same shard twice, shards that disagree on num-shards.
  bool attach(std::shared_ptr<RunContext> run);
  bool attached() const;
  // Leaves the hub (wakes its waits); the hub goes away with its last shard.
  void detach();

  enum class Result { kOk, kFlushing, kEos /* trainer done, everything validated */, kError };
  // latents [C, t, h, w] with one sample, or [m, C, t, h, w] with samples.size() == m; with a
  // textencoder also their text embeddings ([L, D] or [m, L, D]) and masks ([L] or [m, L]); image-to-
  // video also their condition (vaeencoder condition=, [c, t, h, w] or [m, ...]) and image encoder
  // states (imageencoder's image_embeds, [n, N, D] or [m, ...]), as the trainer takes them.
  Result push(const at::Tensor &tensor, const std::vector<ValSample> &samples,
              const at::Tensor *text_embeds = nullptr, const at::Tensor *text_mask = nullptr,
              const at::Tensor *condition = nullptr, const at::Tensor *image_embeds = nullptr);
  // csvvideosrc-epoch (a serialized event after an epoch's last clip): completes the pass
  // over that epoch. Once the source has marked an epoch end, EOS in the middle of an
  // epoch drops the pass (a ddpvalsink-skipped message) instead of reporting a short one.
  Result end_of_epoch(unsigned epoch);
  // The validation source ended (a stop, the trainer's max-steps, a source cut short):
  // completes a running pass of a source without epoch marks, else drops it; a snapshot
  // not yet taken and the trainer's later validations are skipped (ddpvalsink-skipped).
  // Blocks until the trainer has finished (kOk) or the branch flushes (kFlushing).
  Result end_of_stream();
  // A final snapshot (unless its step was validated already). The trainer's finish()
  // triggers this itself through its step callback; for callers that drive an engine
  // without one.
  void trainer_finished();
  void set_flushing(bool flushing);
  // Called on the pushing thread before push() waits for the next snapshot, so that the
  // caller posts the messages queued so far (a pass's result) then, not when push() returns.
  // take_messages() may be called from it.
  void set_message_hook(std::function<void()> hook);

  // ddpvalsink-result | ddpvalsink-skipped | warning ("text")
  using Message = BusMessage;
  std::vector<Message> take_messages();
  const std::string &error() const;

  // Tests and properties.
  int rank() const;
  int world_size() const;
  uint64_t passes_done() const;      // passes this shard completed
  double last_loss() const;          // last combined result seen by this process (NaN: none)
  uint64_t last_step() const;
  uint64_t evaluated_samples() const;  // samples this shard evaluated, all passes

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace videotrain
