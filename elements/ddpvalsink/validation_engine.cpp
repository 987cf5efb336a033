/* ValidationEngine, its per-trainer hub and the validation process group (one torch
 * TU). See validation_engine.h. */
#include "validation_engine.h"

#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <sstream>
#include <tuple>

#include "c10d_setup.h"
#include "default_rng.h"
#include "device_dtype.h"
#include "dist_env.h"
#include "first_line.h"
#include "models/layers.h"
#include "models/param_snapshot.h"
#include "models/train_model.h"
#include "roll_call.h"
#include "run_context.h"
#include "seeded_hash.h"
#include "tensor_buffer.h"

namespace videotrain {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

/* Validation's own Gloo group: a client of the trainer's TCPStore (rank 0 of the
 * trainer serves it) under the prefix "ddpvalsink/", so that its collectives never
 * interleave with gradient traffic. */
class ValGroup {
 public:
  ValGroup(int rank, int world, const std::string &addr, int port, std::chrono::milliseconds timeout)
      : rank_(rank), world_(world), timeout_(timeout) {
    const auto deadline = Clock::now() + timeout;
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(port);
    so.isServer = false;
    so.waitWorkers = false;
    so.timeout = timeout;
    const std::string where = addr + ":" + std::to_string(port);
    try {
      tcp_ = make_tcp_store(addr, so);
    } catch (const std::exception &e) {
      throw std::runtime_error("validation group: rank " + std::to_string(rank) +
                               " cannot reach the trainer's c10d store at " + where + ": " + first_line(e.what()));
    }
    store_ = c10::make_intrusive<c10d::PrefixStore>(store_scope_from_environment().prefix + "ddpvalsink", tcp_);
    auto pg_store = c10::make_intrusive<c10d::PrefixStore>("pg", store_);
    try {
      await_ranks(*store_, rank, world, deadline, timeout);
    } catch (const std::exception &e) {
      throw std::runtime_error(std::string("validation group: ") + e.what());
    }
    try {
      auto o = c10d::ProcessGroupGloo::Options::create(timeout);
      o->devices.push_back(gloo_device(addr));
      o->threads = 1;
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(pg_store, rank, world, o);
    } catch (const std::exception &e) {
      throw std::runtime_error("creating the validation Gloo group (rank " + std::to_string(rank) + " of " +
                               std::to_string(world) + ", store " + where + ") failed: " + first_line(e.what()));
    }
  }
  ~ValGroup() {
    pg_.reset();
    store_.reset();
    tcp_.reset();
  }
  // In-place sum of a CPU double tensor over ranks for the pass of `step`; throws naming
  // `what` and the ranks that never reached it.
  void allreduce(at::Tensor &t, const std::string &what, uint64_t step) {
    const std::string reached = "reached/" + std::to_string(step) + "/";
    std::vector<at::Tensor> v{t};
    try {
      store_->set(reached + std::to_string(rank_), std::vector<uint8_t>{'1'});
      c10d::AllreduceOptions o;
      o.timeout = timeout_;
      auto w = pg_->allreduce(v, o);
      if (!w->wait(timeout_)) throw std::runtime_error("timed out");
    } catch (const std::exception &e) {
      throw std::runtime_error("gloo " + what + " failed on rank " + std::to_string(rank_) + " of " +
                               std::to_string(world_) + " within the " + std::to_string(timeout_.count() / 1000) +
                               " s timeout: " + missing_peers(reached) + " (" + first_line(e.what()) + ")");
    }
  }
  // The peers that set no `prefix`<rank> key, looked up without blocking.
  std::string missing_peers(const std::string &prefix) {
    std::string out;
    try {
      for (int r = 0; r < world_; r++)
        if (r != rank_ && !store_->check({prefix + std::to_string(r)}))
          out += (out.empty() ? "rank " : ", rank ") + std::to_string(r);
    } catch (const std::exception &) {
      return "the c10d store is gone with rank 0, which serves it";
    }
    return out.empty() ? "a peer rank failed or exited" : out + " failed or exited before reaching it";
  }

  // Every rank says whether it is busy with `step`; true when any is (store keys).
  bool any_busy(uint64_t step, bool mine) {
    const std::string base = "busy/" + std::to_string(step) + "/";
    store_->set(base + std::to_string(rank_), std::vector<uint8_t>{static_cast<uint8_t>(mine ? '1' : '0')});
    bool any = false;
    for (int r = 0; r < world_; r++) {
      auto v = store_->get(base + std::to_string(r));
      any = any || (!v.empty() && v[0] == '1');
    }
    return any;
  }

 private:
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> tcp_, store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace

/* ---------------- the hub: one per run, kept in its RunContext ---------------- */

struct Hub {
  struct Slot {
    std::shared_ptr<const ParamSnapshot> pending;
    bool running = false;
    bool attached = false;
    bool flushing = false;
    bool ended = false;  // its source ended (EOS): it takes no more snapshots
  };
  struct Combine {
    double sum = 0;
    uint64_t count = 0;
    unsigned arrived = 0;
  };

  std::shared_ptr<RunContext> trainer;
  ValidationConfig cfg;  // of the first shard (every, at-start, skip-if-busy, group)
  unsigned n = 1;
  int rank = 0, world = 1;
  int cb_id = 0;

  std::mutex mu;
  std::condition_variable cv;
  std::vector<Slot> slots;
  bool closing = false;
  bool finished = false;       // trainer EOS: no snapshot after the final one
  bool at_start_done = false;
  // With peers, step 0's snapshot waits for step 1 to say whether every rank's validators
  // had joined by then (see at_start_held()).
  std::shared_ptr<const ParamSnapshot> at_start_snap;
  uint64_t last_dispatched = kNone;
  std::map<uint64_t, double> dispatched_at;
  std::map<uint64_t, Combine> combines;
  uint64_t tickets_issued = 0, tickets_done = 0;
  uint64_t progress = 0;     // batches evaluated by any shard: a waiting trainer's sign of life
  bool warned_wait = false;
  std::vector<ValidationEngine::Message> messages;  // drained by any shard
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  uint64_t last_step = kNone;

  std::mutex dispatch_mu;  // one dispatch at a time (training thread, at-start, EOS)
  std::mutex group_mu;
  std::unique_ptr<ValGroup> group;

  ~Hub() {
    if (trainer && cb_id) trainer->remove_step_callback(cb_id);
  }

  ValGroup &get_group() {
    std::lock_guard<std::mutex> lock(group_mu);
    if (!group)
      group = std::make_unique<ValGroup>(rank, world, cfg.master_addr, cfg.master_port,
                                         std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1000)));
    return *group;
  }

  void note(const std::string &name, uint64_t step, const std::string &text) {
    ValidationEngine::Message m(name);
    m.set_uint64("step", step).set_string("text", text);
    messages.push_back(std::move(m));
  }

  // A shard whose source has ended (a stop, or a source with num-buffers) cannot do its part
  // of a pass: the step is skipped on this rank (true, with a message), and training does not
  // wait for that shard. With mu held.
  bool skipped_for_ended(uint64_t step, bool final) {
    for (unsigned k = 0; k < slots.size(); k++) {
      if (!slots[k].ended) continue;
      const uint64_t which = final ? trainer->steps_done() : step;
      note("ddpvalsink-skipped", which,
           std::string(final ? "the final validation" : "validation") + " of step " + std::to_string(which) +
               " skipped: the validation source of shard-index " + std::to_string(k) + " has ended (EOS)");
      last_dispatched = which;  // the final dispatch after this step skips quietly
      if (final) finished = true;
      cv.notify_all();
      return true;
    }
    return false;
  }

  // Hands a snapshot of the trainer's weights to every shard (see header). Runs on the
  // training thread (step callback, trainer EOS) or a shard's thread (at-start).
  void dispatch(uint64_t step, bool final, std::shared_ptr<const ParamSnapshot> held = nullptr) {
    std::lock_guard<std::mutex> dlock(dispatch_mu);
    {
      std::unique_lock<std::mutex> lock(mu);
      if (closing || finished) return;
      if (final && last_dispatched != kNone && last_dispatched == trainer->steps_done()) {
        finished = true;  // this step was (or is being) validated already
        cv.notify_all();
        return;
      }
      if (!final && last_dispatched == step) return;
      if (skipped_for_ended(step, final)) return;
      if (cfg.skip_if_busy && !final) {
        bool busy = false;
        for (auto &s : slots) busy = busy || s.pending || s.running;
        lock.unlock();
        if (world > 1) busy = get_group().any_busy(step, busy);  // the same decision on every rank
        lock.lock();
        if (busy) {
          note("ddpvalsink-skipped", step,
               "validation of step " + std::to_string(step) + " skipped: the previous one is still running (skip-if-busy)");
          return;
        }
      }
      // A slot holds one snapshot: a newer one waits for it to be taken (bounded memory), so
      // training waits while validation is busy. Only shards that make no progress at all
      // for `timeout` (a missing shard-index, a starved branch) are an error.
      auto free = [&] {
        if (closing) return true;
        for (auto &s : slots)
          if (s.pending) return false;
        return true;
      };
      if (!free() && !warned_wait) {
        warned_wait = true;
        note("warning", step,
             "training waits at step " + std::to_string(step) +
                 " for validation to take the previous snapshot: validation is slower than every=" +
                 std::to_string(cfg.every) + " steps (raise every, add shards, or set skip-if-busy=true)");
      }
      const auto patience = std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1000));
      uint64_t seen = progress;
      while (!cv.wait_until(lock, Clock::now() + patience, free)) {
        if (progress == seen)
          throw std::runtime_error("ddpvalsink: validation shards took no snapshot and evaluated nothing for " +
                                   std::to_string(static_cast<int>(cfg.timeout_s)) +
                                   " s (is every shard-index of num-shards=" + std::to_string(n) +
                                   " present and fed?)");
        seen = progress;
      }
      if (closing || skipped_for_ended(step, final)) return;
    }
    // Between two optimizer steps, on the training device (or step 0's, held since).
    auto snap = held ? std::move(held) : snapshot();
    std::lock_guard<std::mutex> lock(mu);
    if (skipped_for_ended(step, final)) return;
    if (!snap) {
      if (final) finished = true;
      cv.notify_all();
      return;
    }
    for (auto &s : slots) s.pending = snap;
    last_dispatched = snap->step;
    dispatched_at[snap->step] = now_s();
    if (final) finished = true;
    cv.notify_all();
  }

  /* A due step (every `every`). The validators of all ranks must validate the same steps,
   * but each subscribes when its branch starts, maybe steps after its peers in a fast run:
   * only steps that every rank's validators see (the trainer's all-reduce says so) are
   * validated, so that they all start at the same one. */
  void due(const StepReport &r) {
    if (r.every_rank_subscribed) return dispatch(r.step, false);
    std::lock_guard<std::mutex> lock(mu);
    note("ddpvalsink-skipped", r.step,
         "validation of step " + std::to_string(r.step) +
             " skipped on every rank: the validators of some rank had not joined the run yet");
  }

  // The weights the shards evaluate: the trainer's, or their EMA (weights=ema).
  std::shared_ptr<const ParamSnapshot> snapshot() const {
    return cfg.ema ? trainer->snapshot_ema() : trainer->snapshot_state();
  }

  // at-start: step 0's weights, once the trainer has its model (builtin models build
  // theirs at the first micro-batch). Alone: called by each shard at its first buffer and
  // by the trainer's model_built callback; whichever finds the model first dispatches.
  // With peers: by attach (before the step callback is added) and model_built only, so
  // that a hub holds step 0 exactly when it was subscribed before step 1's all-reduce.
  void maybe_at_start() {
    const bool built = trainer->has_model();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (at_start_done || !cfg.at_start || !built) return;
      at_start_done = true;
      if (trainer->steps_done() != 0) {
        note("warning", 0,
             "at-start: the trainer had already " +
                 std::string(trainer->ended(nullptr) ? "finished after " : "done ") +
                 std::to_string(trainer->steps_done()) + " step(s) when validation started" +
                 (trainer->ended(nullptr) ? "" : " (resumed?)") + "; step 0 is not validated");
        return;
      }
    }
    if (world == 1) return dispatch(0, false);
    auto snap = snapshot();
    std::lock_guard<std::mutex> lock(mu);
    if (snap && snap->step == 0) at_start_snap = std::move(snap);
  }

  // Step 1's report: step 0's held snapshot goes to the shards when every rank held one.
  void at_start_held(const StepReport &r) {
    std::shared_ptr<const ParamSnapshot> snap;
    {
      std::lock_guard<std::mutex> lock(mu);
      snap = std::move(at_start_snap);
      at_start_snap.reset();
      if (!snap || !cfg.at_start || world == 1) return;
      if (!r.every_rank_subscribed) {
        note("ddpvalsink-skipped", 0,
             "at-start validation of step 0 skipped on every rank: the validators of some rank joined the run "
             "after its first step");
        return;
      }
    }
    dispatch(0, false, snap);
  }

  // The trainer failed: nothing after its last good step is validated, so the shards end
  // (kEos) once the snapshot they hold is done, not wait for one that never comes.
  void trainer_failed(uint64_t step) {
    std::lock_guard<std::mutex> lock(mu);
    if (finished || closing) return;
    note("warning", step,
         "the trainer failed after step " + std::to_string(step) +
             ": no final validation (the trainer's error says why)");
    finished = true;
    cv.notify_all();
  }

  void append_result(uint64_t step, double loss, uint64_t samples, double seconds) {
    if (rank != 0) return;
    auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
    const auto line =
        nlohmann::json{
            {"type", "validation"},
            {"step", step},
            {"loss", num(loss)},
            {"samples", samples},
            {"seconds", seconds},
            {"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}}
            .dump();
    std::vector<std::pair<std::string, float>> scalars;
    if (std::isfinite(loss)) scalars.emplace_back("val/loss", static_cast<float>(loss));
    if (!trainer->append_log(line, step, scalars))
      note("warning", step, "cannot append the validation result to the trainer's metrics-file");
  }
};

/* ---------------- ValidationEngine ---------------- */

struct ValidationEngine::Impl {
  ValidationConfig cfg;
  std::string error;
  std::shared_ptr<Hub> hub;
  c10::Device device{c10::kCPU};
  std::unique_ptr<TrainModel> model;
  std::string model_spec;
  ModelDims model_dims;
  bool warned_fallback = false;
  std::vector<Message> messages;
  std::function<void()> message_hook;

  // The pass in progress.
  bool active = false;
  unsigned pass_epoch = 0;
  uint64_t pass_step = 0;
  double pass_sum = 0;
  uint64_t pass_count = 0;
  std::vector<at::Tensor> batch;
  std::vector<at::Tensor> batch_embeds, batch_masks;  // with a textencoder, per sample
  std::vector<at::Tensor> batch_conditions, batch_images;  // image-to-video, per sample
  std::vector<ValSample> batch_samples;

  uint64_t passes = 0, evaluated = 0;
  bool epochs_marked = false;  // the source sends csvvideosrc-epoch events

  Result fail(const std::string &m) {
    error = m;
    return Result::kError;
  }
  Hub::Slot &slot() { return hub->slots[cfg.shard_index]; }

  void load(const ParamSnapshot &snap) {
    if (!model || model_spec != snap.model || model_dims.latent_channels != snap.dims.latent_channels ||
        model_dims.text_dim != snap.dims.text_dim) {
      // Building draws initial weights (overwritten below) from torch's default generator,
      // which the trainer may be using: borrowed, and put back as it was.
      BorrowedDefaultRng rng(device);
      ModelOptions o = snap.options;
      o.attention_backend = models::follower_attention_backend(cfg.attention_backend, device, "ddpvalsink");
      model = make_model(snap.model, snap.dims, device, o);
      model_spec = snap.model;
      model_dims = snap.dims;
    }
    load_snapshot(*model, snap);
  }

  Result start_pass(unsigned epoch) {
    // The wait below may last until the trainer's next snapshot: what the last pass
    // queued (its result) goes out first.
    if (message_hook) message_hook();
    std::shared_ptr<const ParamSnapshot> snap;
    {
      std::unique_lock<std::mutex> lock(hub->mu);
      auto &s = slot();
      hub->cv.wait(lock, [&] { return s.flushing || hub->closing || s.pending || hub->finished; });
      if (s.flushing || hub->closing) return Result::kFlushing;
      if (!s.pending) return Result::kEos;  // finished and nothing left
      snap = std::move(s.pending);
      s.pending.reset();
      s.running = true;
      hub->cv.notify_all();  // the trainer may be waiting for this slot
    }
    try {
      load(*snap);
    } catch (const std::exception &e) {
      end_running();
      return fail("cannot load the trainer's weights into the validation model on " + device_name(device) + ": " +
                  first_line(e.what()));
    }
    active = true;
    pass_epoch = epoch;
    pass_step = snap->step;
    pass_sum = 0;
    pass_count = 0;
    return Result::kOk;
  }

  void end_running() {
    std::lock_guard<std::mutex> lock(hub->mu);
    slot().running = false;
    hub->cv.notify_all();
  }

  // The pass in progress ends without a result: the error, and the slot is free again.
  Result abandon_pass(const std::string &m) {
    end_running();
    active = false;
    return fail(m);
  }

  void evaluate_batch() {
    if (batch.empty()) return;
    torch::NoGradGuard ng;
    ModelInputs in;
    in.latents = torch::stack(batch).to(device, torch::kFloat);
    if (!batch_embeds.empty()) {
      in.text_embeds = torch::stack(batch_embeds).to(device, torch::kFloat);
      in.text_mask = torch::stack(batch_masks).to(device, torch::kLong);
    }
    if (!batch_conditions.empty()) in.condition = torch::stack(batch_conditions).to(device, torch::kFloat);
    if (!batch_images.empty()) in.image_embeds = torch::stack(batch_images).to(device, torch::kFloat);
    if (std::string m = check_model_inputs(*model, in.has_text()); !m.empty()) throw std::runtime_error(m);
    const auto &x = in.latents;
    std::vector<int64_t> seeds;
    for (const auto &s : batch_samples) {
      in.captions.push_back(s.caption);
      seeds.push_back(validation_seed(s.sample_id));
    }
    at::Tensor losses = model->validation_step(in, seeds);
    if (!losses.defined()) {
      // No validation_step: training_step per sample under a generator seeded from its id.
      if (!warned_fallback) {
        warned_fallback = true;
        messages.push_back(Message::warning(
            "model '" + model_spec +
            "' has no validation_step(latents, captions | text_embeds, text_mask, seeds): using training_step with "
            "torch's default generator seeded per sample, which makes its forwards take turns with the trainer's"));
      }
      std::vector<at::Tensor> ls;
      for (int64_t i = 0; i < x.size(0); i++) {
        BorrowedDefaultRng rng(device);
        rng.seed(static_cast<uint64_t>(seeds[i]));
        ls.push_back(model->training_step(in.narrow(i, 1)).reshape({1}).to(torch::kFloat));
      }
      losses = torch::cat(ls);
    }
    if (losses.numel() != x.size(0))
      throw std::runtime_error("validation_step of '" + model_spec + "' returned " + std::to_string(losses.numel()) +
                               " losses for " + std::to_string(x.size(0)) + " samples");
    auto l = losses.to(torch::kCPU, torch::kDouble).contiguous();
    const double *p = l.data_ptr<double>();
    for (int64_t i = 0; i < l.numel(); i++) pass_sum += p[i];
    pass_count += static_cast<uint64_t>(l.numel());
    evaluated += static_cast<uint64_t>(l.numel());
    {
      std::lock_guard<std::mutex> lock(hub->mu);
      hub->progress++;
    }
    batch.clear();
    batch_embeds.clear();
    batch_masks.clear();
    batch_conditions.clear();
    batch_images.clear();
    batch_samples.clear();
  }

  Result finish_pass();
  // One sample's latents and, where the stream has them, its text, condition and image tensors.
  Result take(const at::Tensor &x, const at::Tensor &embeds, const at::Tensor &mask, const at::Tensor &condition,
              const at::Tensor &image, const ValSample &s);
};

ValidationEngine::Result ValidationEngine::Impl::finish_pass() {
  try {
    evaluate_batch();
  } catch (const std::exception &e) {
    return abandon_pass("validation of step " + std::to_string(pass_step) + " failed: " + first_line(e.what()));
  }
  active = false;
  passes++;
  Hub &h = *hub;
  Hub::Combine total;
  uint64_t ticket = 0;
  {
    std::unique_lock<std::mutex> lock(h.mu);
    auto &c = h.combines[pass_step];
    c.sum += pass_sum;
    c.count += pass_count;
    c.arrived++;
    slot().running = false;
    h.cv.notify_all();
    if (c.arrived < h.n) return Result::kOk;  // another shard completes this step
    total = c;
    h.combines.erase(pass_step);
    ticket = h.tickets_issued++;
    // Cross-rank reductions in the order the steps completed here (same on every rank).
    h.cv.wait(lock, [&] { return h.tickets_done == ticket; });
  }
  std::string err;
  double sum = total.sum, count = static_cast<double>(total.count);
  if (h.world > 1) {
    try {
      const double st = static_cast<double>(pass_step);
      auto t = torch::tensor({sum, count, st, st * st}, torch::kDouble);
      h.get_group().allreduce(t, "validation all-reduce of step " + std::to_string(pass_step), pass_step);
      auto a = t.accessor<double, 1>();
      sum = a[0];
      count = a[1];
      // Every rank must have validated the same step: sum(s)^2 == world * sum(s^2).
      if (std::abs(a[2] * a[2] - h.world * a[3]) > 0.5)
        err = "ranks validated different steps (this rank: step " + std::to_string(pass_step) +
              "); every rank needs the same every/at-start/skip-if-busy settings";
    } catch (const std::exception &e) {
      err = first_line(e.what());
    }
  }
  double seconds = 0;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.tickets_done++;
    h.cv.notify_all();
    if (auto it = h.dispatched_at.find(pass_step); it != h.dispatched_at.end()) {
      seconds = now_s() - it->second;
      h.dispatched_at.erase(it);
    }
    if (err.empty()) {
      h.last_loss = count > 0 ? sum / count : std::numeric_limits<double>::quiet_NaN();
      h.last_step = pass_step;
    }
  }
  if (!err.empty()) return fail(err);
  const double loss = count > 0 ? sum / count : std::numeric_limits<double>::quiet_NaN();
  if (count == 0) {
    messages.push_back(Message::warning("validation of step " + std::to_string(pass_step) +
                                        " saw no samples (all padding, or no sample for any shard-index)"));
  }
  if (h.rank == 0) {
    Message m("ddpvalsink-result");
    m.set_uint64("step", pass_step).set_double("loss", loss).set_uint64("samples", count).set_double("seconds", seconds);
    messages.push_back(m);
    std::lock_guard<std::mutex> lock(h.mu);
    h.append_result(pass_step, loss, static_cast<uint64_t>(count), seconds);
  }
  return Result::kOk;
}

ValidationEngine::Result ValidationEngine::Impl::take(const at::Tensor &x, const at::Tensor &embeds,
                                                     const at::Tensor &mask, const at::Tensor &condition,
                                                     const at::Tensor &image, const ValSample &s) {
  for (;;) {
    if (!active) {
      Result r = start_pass(s.epoch);
      if (r != Result::kOk) return r;
    }
    if (s.epoch == pass_epoch) break;
    // First sample of the next epoch: the pass is complete; this sample opens the next one.
    Result r = finish_pass();
    if (r != Result::kOk) return r;
  }
  if (s.padding || s.clip_index % cfg.num_shards != cfg.shard_index) return Result::kOk;
  try {
    // A sample stacks onto the batch when every tensor it has is there, of the same shape.
    const auto differs = [](const std::vector<at::Tensor> &b, const at::Tensor &t) {
      return b.empty() != !t.defined() || (t.defined() && b.front().sizes() != t.sizes());
    };
    if (!batch.empty() && (batch.front().sizes() != x.sizes() || differs(batch_embeds, embeds) ||
                           differs(batch_conditions, condition) || differs(batch_images, image)))
      evaluate_batch();
    batch.push_back(x);
    if (embeds.defined()) {
      batch_embeds.push_back(embeds);
      batch_masks.push_back(mask);
    }
    if (condition.defined()) batch_conditions.push_back(condition);
    if (image.defined()) batch_images.push_back(image);
    batch_samples.push_back(s);
    if (batch.size() >= std::max(1u, cfg.batch_size)) evaluate_batch();
  } catch (const std::exception &e) {
    return abandon_pass("validation of step " + std::to_string(pass_step) + " failed: " + first_line(e.what()));
  }
  return Result::kOk;
}

ValidationEngine::ValidationEngine(const ValidationConfig &config) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = config;
}

ValidationEngine::~ValidationEngine() { detach(); }

bool ValidationEngine::attach(std::shared_ptr<RunContext> trainer) {
  auto &im = *impl_;
  auto &c = im.cfg;
  if (!trainer) {
    im.error = "no trainer run";
    return false;
  }
  if (c.num_shards < 1 || c.shard_index >= c.num_shards) {
    im.error = "shard-index " + std::to_string(c.shard_index) + " is out of range for num-shards " +
               std::to_string(c.num_shards) + " (0 .. num-shards - 1)";
    return false;
  }
  if (c.ema && !trainer->has_ema()) {
    im.error = "weights=ema, but the trainer keeps no EMA: set ema-decay on its ddptrainsink (or weights=raw)";
    return false;
  }
  // The validation group is a client of the run's store.
  if (c.master_addr.empty()) c.master_addr = trainer->master_addr();
  if (c.master_port <= 0) c.master_port = trainer->master_port();
  if (c.timeout_s <= 0) c.timeout_s = trainer->timeout_s();
  {
    // auto: the trainer's device, itself chosen by the shared rule (an explicit device of the
    // trainer included). The trainer's device name is always "cpu" or "cuda:N".
    const bool follow = c.device.empty() || c.device == "auto";
    if (!resolve_torch_device(follow ? trainer->device_name() : c.device, &im.device, &im.error)) return false;
  }
  // The shards of one run share a hub, kept by the run itself (nothing process-wide).
  std::function<std::shared_ptr<Hub>()> make = [&]() {
    auto hub = std::make_shared<Hub>();
    hub->trainer = trainer;
    hub->cfg = c;
    hub->n = c.num_shards;
    hub->rank = trainer->rank();
    hub->world = trainer->world_size();
    hub->slots.resize(c.num_shards);
    if (hub->world > 1) hub->maybe_at_start();  // before subscribing: see maybe_at_start()
    std::weak_ptr<Hub> weak = hub;
    const uint64_t every = c.every;
    // A trainer that has already ended (a short run that finished before this branch joined)
    // calls back at once: its final snapshot is validated, or a failed one ends the shards.
    hub->cb_id = trainer->follow_steps([weak, every](const StepReport &r) {
      auto h = weak.lock();
      if (!h) return;
      if (r.failed) return h->trainer_failed(r.step);  // no final pass of a failed run
      if (r.finished) return h->dispatch(0, true);
      if (r.model_built) return h->maybe_at_start();
      if (r.step == 1) h->at_start_held(r);
      if (every != 0 && r.step % every == 0) h->due(r);
    }, every, c.at_start, c.ema);
    // The model may have been built between the first look and subscribing, its
    // model_built callback gone by: step 0's weights are taken now instead (at_start_held()
    // drops them if step 1's all-reduce came before the subscription).
    if (hub->world > 1) hub->maybe_at_start();
    return hub;
  };
  std::shared_ptr<Hub> hub;
  try {
    hub = trainer->shared_state<Hub>("ddpvalsink/hub", make);
  } catch (const std::exception &e) {  // the final snapshot of a trainer that had ended
    im.error = "validation of the trainer's final weights: " + first_line(e.what());
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(hub->mu);
    if (hub->n != c.num_shards) {
      im.error = "num-shards " + std::to_string(c.num_shards) + " differs from " + std::to_string(hub->n) +
                 " of another ddpvalsink of the same trainer";
      return false;
    }
    if (hub->cfg.every != c.every || hub->cfg.at_start != c.at_start || hub->cfg.skip_if_busy != c.skip_if_busy ||
        hub->cfg.ema != c.ema) {
      im.error = "every/at-start/skip-if-busy/weights of shard-index " + std::to_string(c.shard_index) +
                 " differ from those of another ddpvalsink of the same trainer: they validate the same snapshots, "
                 "give them the same settings";
      return false;
    }
    if (hub->slots[c.shard_index].attached) {
      im.error = "shard-index " + std::to_string(c.shard_index) + " is used by two ddpvalsinks of the same trainer";
      return false;
    }
    hub->slots[c.shard_index].attached = true;
    hub->slots[c.shard_index].flushing = false;
    hub->slots[c.shard_index].ended = false;
  }
  im.hub = hub;
  return true;
}

bool ValidationEngine::attached() const { return impl_->hub != nullptr; }

void ValidationEngine::detach() {
  auto &im = *impl_;
  if (!im.hub) return;
  {
    std::lock_guard<std::mutex> lock(im.hub->mu);
    auto &s = im.slot();
    s.attached = false;
    s.pending.reset();
    s.running = false;
    bool any = false;
    for (auto &o : im.hub->slots) any = any || o.attached;
    if (!any) im.hub->closing = true;  // wakes a trainer waiting on a slot
    im.hub->cv.notify_all();
  }
  im.hub.reset();
  im.active = false;
  im.batch.clear();
  im.batch_embeds.clear();
  im.batch_masks.clear();
  im.batch_conditions.clear();
  im.batch_images.clear();
  im.batch_samples.clear();
}

ValidationEngine::Result ValidationEngine::push(const at::Tensor &tensor, const std::vector<ValSample> &samples,
                                                const at::Tensor *text_embeds, const at::Tensor *text_mask,
                                                const at::Tensor *condition, const at::Tensor *image_embeds) {
  auto &im = *impl_;
  if (!im.hub) return im.fail("not attached to a trainer");
  at::Tensor t = tensor;
  const bool one = t.dim() == 4;
  if (one) t = t.unsqueeze(0);
  if (t.dim() != 5 || !t.is_floating_point() || t.size(0) != static_cast<int64_t>(samples.size())) {
    std::ostringstream s;
    s << "validation buffer holds a tensor of shape " << tensor.sizes() << " for " << samples.size()
      << " sample(s); expected float latents [C, t, h, w] or a micro-batch [m, C, t, h, w]";
    return im.fail(s.str());
  }
  at::Tensor e, m;  // [n, L, D] and [n, L]
  if (text_embeds && text_mask) {
    e = one ? text_embeds->unsqueeze(0) : *text_embeds;
    m = one ? text_mask->unsqueeze(0) : *text_mask;
    if (e.dim() != 3 || m.dim() != 2 || e.size(0) != t.size(0) || m.size(0) != t.size(0) || m.size(1) != e.size(1)) {
      std::ostringstream s;
      s << "validation buffer's text tensors have shapes " << text_embeds->sizes() << " and " << text_mask->sizes()
        << " for " << samples.size() << " sample(s); expected [L, D] and [L] per sample";
      return im.fail(s.str());
    }
  }
  // Image-to-video tensors: one sample's, or the micro-batch's with a leading sample dimension.
  at::Tensor c, img;
  for (const auto &[name, in, out, dims] :
       {std::tuple<const char *, const at::Tensor *, at::Tensor *, int64_t>{"condition", condition, &c, 4},
        {"image_embeds", image_embeds, &img, 3}}) {
    if (!in) continue;
    *out = one ? in->unsqueeze(0) : *in;
    if (out->dim() != dims + 1 || out->size(0) != t.size(0)) {
      std::ostringstream s;
      s << "validation buffer's " << name << " has shape " << in->sizes() << " for " << samples.size()
        << " sample(s); expected " << dims << " dimensions per sample";
      return im.fail(s.str());
    }
  }
  try {
    if (im.hub->world == 1) im.hub->maybe_at_start();
  } catch (const std::exception &e) {
    return im.fail("at-start validation: " + first_line(e.what()));
  }
  for (size_t i = 0; i < samples.size(); i++) {
    const auto k = static_cast<int64_t>(i);
    Result r = im.take(t[k], e.defined() ? e[k] : at::Tensor(), m.defined() ? m[k] : at::Tensor(),
                       c.defined() ? c[k] : at::Tensor(), img.defined() ? img[k] : at::Tensor(), samples[i]);
    if (r != Result::kOk) return r;
  }
  return Result::kOk;
}

ValidationEngine::Result ValidationEngine::end_of_epoch(unsigned epoch) {
  auto &im = *impl_;
  im.epochs_marked = true;
  if (!im.hub || !im.active || im.pass_epoch != epoch) return Result::kOk;
  return im.finish_pass();
}

ValidationEngine::Result ValidationEngine::end_of_stream() {
  auto &im = *impl_;
  if (!im.hub) return Result::kOk;
  if (im.active) {
    if (im.epochs_marked) {
      // A stop (EOS sent to the pipeline, the trainer's max-steps) or a source cut short: the
      // part of the epoch seen would give a loss over part of the set, so none is reported.
      im.end_running();
      im.active = false;
      std::lock_guard<std::mutex> lock(im.hub->mu);
      im.hub->note("ddpvalsink-skipped", im.pass_step,
                   "validation of step " + std::to_string(im.pass_step) +
                       " dropped: the validation source ended (EOS) in the middle of epoch " +
                       std::to_string(im.pass_epoch) + ", so the pass covers part of the set");
    } else {
      Result r = im.finish_pass();  // a source that marks no epochs: it ended with its epoch
      if (r != Result::kOk) return r;
    }
  }
  // This shard takes no more snapshots: one handed to it is dropped, and the trainer's later
  // validations are skipped (dispatch()); the branch ends with the trainer (or a flush).
  std::unique_lock<std::mutex> lock(im.hub->mu);
  auto &s = im.slot();
  s.ended = true;
  if (s.pending) {
    im.hub->note("ddpvalsink-skipped", s.pending->step,
                 "validation of step " + std::to_string(s.pending->step) +
                     " not done: the validation source ended (EOS) before its pass");
    s.pending.reset();
  }
  im.hub->cv.notify_all();
  im.hub->cv.wait(lock, [&] { return s.flushing || im.hub->closing || im.hub->finished; });
  if (s.flushing || im.hub->closing) return Result::kFlushing;
  return Result::kOk;
}

void ValidationEngine::trainer_finished() {
  if (auto h = impl_->hub) h->dispatch(0, true);
}

void ValidationEngine::set_message_hook(std::function<void()> hook) { impl_->message_hook = std::move(hook); }

void ValidationEngine::set_flushing(bool flushing) {
  auto &im = *impl_;
  if (!im.hub) return;
  std::lock_guard<std::mutex> lock(im.hub->mu);
  im.slot().flushing = flushing;
  im.hub->cv.notify_all();
}

std::vector<ValidationEngine::Message> ValidationEngine::take_messages() {
  auto &im = *impl_;
  std::vector<Message> out;
  out.swap(im.messages);
  if (im.hub) {
    std::lock_guard<std::mutex> lock(im.hub->mu);
    for (auto &m : im.hub->messages) out.push_back(std::move(m));
    im.hub->messages.clear();
  }
  return out;
}

const std::string &ValidationEngine::error() const { return impl_->error; }
int ValidationEngine::rank() const { return impl_->hub ? impl_->hub->rank : 0; }
int ValidationEngine::world_size() const { return impl_->hub ? impl_->hub->world : 1; }
uint64_t ValidationEngine::passes_done() const { return impl_->passes; }
uint64_t ValidationEngine::evaluated_samples() const { return impl_->evaluated; }

double ValidationEngine::last_loss() const {
  if (!impl_->hub) return std::numeric_limits<double>::quiet_NaN();
  std::lock_guard<std::mutex> lock(impl_->hub->mu);
  return impl_->hub->last_loss;
}

uint64_t ValidationEngine::last_step() const {
  if (!impl_->hub) return 0;
  std::lock_guard<std::mutex> lock(impl_->hub->mu);
  return impl_->hub->last_step == kNone ? 0 : impl_->hub->last_step;
}

}  // namespace videotrain
