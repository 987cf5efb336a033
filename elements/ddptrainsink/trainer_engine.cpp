/* TrainerEngine: model, AdamW, LR schedule, gradient accumulation, the bucketed
 * all-reduce, checkpoints and progress. See trainer_engine.h. */
#include "trainer_engine.h"

#include <ATen/autocast_mode.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>

#include "bucket_reducer.h"
#include "checkpoint_store.h"
#include "cpu_heap.h"
#include "cuda_devices.h"
#include "default_rng.h"
#include "device_rule.h"
#include "dist_env.h"
#include "first_line.h"
#include "dist_group.h"
#include "models/param_snapshot.h"
#include "models/train_model.h"
#include "tensor_buffer.h"
#include "run_log.h"
#include "seeded_hash.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace videotrain {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// bf16 autocast for the forward pass (CUDA, or CPU when asked).
class AutocastGuard {
 public:
  AutocastGuard(bool on, bool cuda) : on_(on), cuda_(cuda) {
    if (!on_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    const auto dev = cuda_ ? at::kCUDA : at::kCPU;
    prev_enabled_ = at::autocast::is_autocast_enabled(dev);
    prev_dtype_ = at::autocast::get_autocast_dtype(dev);
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::set_autocast_dtype(dev, at::kBFloat16);
#else
    if (cuda_) {
      prev_enabled_ = at::autocast::is_enabled();
      prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_enabled(true);
      at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    } else {
      prev_enabled_ = at::autocast::is_cpu_enabled();
      prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_cpu_enabled(true);
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    }
#endif
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    const auto dev = cuda_ ? at::kCUDA : at::kCPU;
    at::autocast::set_autocast_enabled(dev, prev_enabled_);
    at::autocast::set_autocast_dtype(dev, prev_dtype_);
#else
    if (cuda_) {
      at::autocast::set_enabled(prev_enabled_);
      at::autocast::set_autocast_gpu_dtype(prev_dtype_);
    } else {
      at::autocast::set_cpu_enabled(prev_enabled_);
      at::autocast::set_autocast_cpu_dtype(prev_dtype_);
    }
#endif
  }

 private:
  bool on_, cuda_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

}  // namespace

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
  std::unique_ptr<TrainModel> model;
  ModelDims dims;  // what the model was built for
  // The stream's conditioning from its caps (set_stream_text), checked against the model
  // when both are known: -1 unknown, 0 captions, 1 text embeddings.
  int stream_text = -1;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::AdamW> opt;
  std::unique_ptr<BucketReducer> reducer;

  uint64_t steps_done = 0;
  // The step in progress.
  bool in_step = false;
  bool joining = false;  // taking part in a step with no samples (data ended here)
  at::Tensor step_loss;  // sum of weighted micro-batch losses (device)
  unsigned step_samples = 0;
  unsigned epoch = 0;
  uint64_t next_clip = 0;
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
  std::string rescue_why;  // why no rescue checkpoint was written ("" when none was needed)

  // Non-finite steps: in a row (nan-policy=skip's bound) and over the run.
  uint64_t skipped_in_row = 0, steps_run = 0, steps_applied = 0;

  // Throughput window (since the last log).
  double window_start = 0, window_wait = 0;
  uint64_t window_samples = 0;

  std::vector<Message> messages;
  RunLog run_log;  // metrics file and events: the training thread and validation write
  bool metrics_warned = false;

  mutable std::mutex state_mu;  // parameters change under it (optimizer step, loads)
  std::mutex cb_mu;
  std::map<int, StepCallback> callbacks;
  int next_cb = 1;

  bool fail(const std::string &msg) {
    error = msg;
    return false;
  }
  double clock() const { return cfg.clock ? cfg.clock() : now_s(); }
  void warn(const std::string &text) {
    messages.push_back(Message::warning(text));
  }

  bool resolve();
  std::vector<std::string> param_names;  // of params
  // The model and optimizer on this rank (no collective); build_model() then broadcasts
  // rank 0's weights and sets up the reducer.
  void construct_model(const ModelDims &d);
  void build_model(const ModelDims &d);
  // "" when the model takes what the stream carries (or either is not known yet).
  std::string inputs_mismatch() const {
    return model && stream_text >= 0 ? check_model_inputs(*model, stream_text == 1) : "";
  }
  double lr_at(uint64_t step) const {  // `step`: optimizer steps done before this one
    return scheduled_lr(cfg.lr, cfg.lr_schedule, cfg.warmup_steps, cfg.max_steps, step);
  }
  double grad_norm() const;
  // Reduces, steps the optimizer, reports; false when no rank had samples (no step).
  bool end_step(const MicroBatchInfo &info);
  // After this rank's end of stream, with peers: see TrainerEngine::finish().
  void join_step();
  void join_until_all_end();
  void write_checkpoint();
  // Rank 0's files, commit, local prune and messages of a checkpoint of steps_done.
  std::string save_checkpoint(bool rescue);
  // Stopped without the final checkpoint (stop without EOS, an error): rank 0 alone, no
  // collective, writes the last completed step when it is newer than the last checkpoint
  // and the state is whole and finite. True when it wrote one; else rescue_why says why not.
  bool rescue(const std::string &context);
  bool all_steps_skipped() const { return steps_run > 0 && steps_applied == 0; }
  std::string all_skipped_text() const;
  // Loads `c` into the model (built as needed): "" when its weights and optimizer state
  // are finite, else why it cannot be used. Throws when a verified one does not load.
  std::string load_checkpoint(const FoundCheckpoint &c);
  std::string first_non_finite_optimizer();  // "exp_avg_sq of NAME", or ""
  std::string first_non_finite_grad() const;  // parameter name, or ""
  void find_checkpoint();
  void agree_resume_step();
  void report(const StepReport &r);
  void notify(const StepReport &r);  // the step callbacks
  void append_metrics(const json &j);  // rank 0's metrics file; warns once when it cannot be written
};

bool TrainerEngine::Impl::resolve() {
  DistEnv env = dist_env_from_environment();
  rank = cfg.rank >= 0 ? cfg.rank : env.rank;
  world = cfg.world_size > 0 ? cfg.world_size : env.world_size;
  local_rank = env.source == "default" ? rank : env.local_rank;
  master_addr = cfg.master_addr.empty() ? env.master_addr : cfg.master_addr;
  master_port = cfg.master_port > 0 ? cfg.master_port : env.master_port;
  if (rank < 0 || rank >= world)
    return fail("rank " + std::to_string(rank) + " is not below world-size " + std::to_string(world) +
                " (properties rank/world-size or RANK/WORLD_SIZE)");
  // Device.
  std::string device_error;
  const std::string dev = resolve_device(cfg.device, local_rank, visible_cuda_devices(), &device_error);
  if (dev.empty()) return fail(device_error);
  device = c10::Device(dev);
  if (device.is_cpu() && cfg.tune_malloc) {
    std::string why;
    if (!retain_cpu_heap(&why)) warn("tune-malloc: " + why);
  }
  if (cfg.precision == "auto")
    bf16 = device.is_cuda();
  else if (cfg.precision == "bf16")
    bf16 = true;
  else if (cfg.precision == "fp32")
    bf16 = false;
  else
    return fail("precision '" + cfg.precision + "' is not one of auto, fp32, bf16 (property precision)");
  if (cfg.lr_schedule != "constant" && cfg.lr_schedule != "cosine" && cfg.lr_schedule != "linear")
    return fail("lr-schedule '" + cfg.lr_schedule + "' is not one of constant, cosine, linear");
  if (cfg.nan_policy != "skip" && cfg.nan_policy != "fail")
    return fail("nan-policy '" + cfg.nan_policy + "' is not one of skip, fail");
  if (cfg.model.empty()) return fail("no model: set the model property (a TorchScript file or builtin:NAME)");
  if (!is_builtin_spec(cfg.model)) {
    std::error_code ec;
    if (!fs::is_regular_file(cfg.model, ec))
      return fail("model file '" + cfg.model + "' does not exist or is not a file (property model)");
  }
  if (cfg.resume && cfg.checkpoint_dir.empty()) return fail("resume=true needs checkpoint-dir");
  // Backend.
  if (cfg.backend == "auto")
    backend = (device.is_cuda() && nccl_available()) ? "nccl" : "gloo";
  else if (cfg.backend == "gloo" || cfg.backend == "nccl")
    backend = cfg.backend;
  else
    return fail("backend '" + cfg.backend + "' is not one of auto, nccl, gloo");
  if (backend == "nccl" && !device.is_cuda()) return fail("backend=nccl needs a CUDA device (property device)");
  if (backend == "nccl" && !nccl_available())
    return fail("backend=nccl but this LibTorch was built without NCCL (use backend=gloo)");
  return true;
}

void TrainerEngine::Impl::construct_model(const ModelDims &d) {
  dims = d;
  std::unique_lock<std::mutex> rng(default_rng_mutex());  // see default_rng.h
  torch::manual_seed(cfg.seed);  // the same initial weights on every rank (and broadcast anyway)
  auto m = make_model(cfg.model, d, device);
  rng.unlock();
  std::vector<at::Tensor> ps;
  std::vector<std::string> names;
  for (auto &[name, p] : m->named_parameters())
    if (p.requires_grad()) {
      ps.push_back(p);
      names.push_back(name);
    }
  if (ps.empty()) throw std::runtime_error("model " + cfg.model + " has no trainable parameters");
  auto o = torch::optim::AdamWOptions(cfg.lr)
               .betas(std::make_tuple(cfg.beta1, cfg.beta2))
               .eps(cfg.eps)
               .weight_decay(cfg.weight_decay);
  std::lock_guard<std::mutex> lock(state_mu);
  model = std::move(m);
  params = ps;
  param_names = names;
  opt = std::make_unique<torch::optim::AdamW>(params, o);
}

void TrainerEngine::Impl::build_model(const ModelDims &d) {
  // A resumed model was built and loaded by find_checkpoint().
  if (!model) construct_model(d);
  if (group) {
    // Rank 0's weights everywhere (TorchScript files may differ per host; random inits).
    torch::NoGradGuard ng;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    std::vector<at::Tensor> all;
    for (auto &[n, p] : model->named_parameters()) all.push_back(p);
    for (auto &[n, b] : model->named_buffers()) all.push_back(b);
    for (auto &t : all) {
      std::vector<at::Tensor> one{t.detach()};
      works.push_back(group->broadcast_async(one, 0));
    }
    for (size_t i = 0; i < works.size(); i++) group->wait(works[i], "initial parameter broadcast");
    reducer = std::make_unique<BucketReducer>(params, group.get(), cfg.bucket_cap_mb, 1.0);
  }
  // ddpvalsink's at-start needs these weights; builtin models only exist from here.
  StepReport built;
  built.step = steps_done;
  built.model_built = true;
  notify(built);
}

std::string TrainerEngine::Impl::load_checkpoint(const FoundCheckpoint &c) {
  // Local only (no collective): ranks agree on the step found afterwards.
  ModelDims d;
  d.latent_channels = cfg.latent_channels > 0 ? cfg.latent_channels : c.state.value("latent_channels", 0);
  d.text_dim = c.state.value("text_dim", 0);
  try {
    if (!model || d.latent_channels != dims.latent_channels || d.text_dim != dims.text_dim) construct_model(d);
    std::lock_guard<std::mutex> lock(state_mu);
    model->load(c.dir);
    torch::load(*opt, c.dir + "/optimizer.pt", device);
  } catch (const std::exception &e) {
    // Files that verified and still do not load are this run's problem (another model):
    // an error. A legacy checkpoint's files were never checked: damaged, try an older one.
    if (!c.legacy) throw std::runtime_error("cannot resume from checkpoint '" + c.dir + "': " + first_line(e.what()));
    return "it cannot be loaded (" + first_line(e.what()) + ")";
  }
  // Checksums say the bytes are those written, not that they are numbers: a checkpoint
  // with NaN/Inf would make every step after the resume non-finite.
  if (std::string bad = first_non_finite(*model); !bad.empty()) return "its weights hold NaN/Inf (first: " + bad + ")";
  if (std::string bad = first_non_finite_optimizer(); !bad.empty())
    return "its optimizer state holds NaN/Inf (first: " + bad + ")";
  return "";
}

template <class Key>
static Key optimizer_state_key(const at::Tensor &p) {
  // LibTorch 1.x keys the state by the printed TensorImpl address, 2.x by the address.
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

std::string TrainerEngine::Impl::first_non_finite_optimizer() {
  using Key = typename std::decay_t<decltype(opt->state())>::key_type;
  NamedTensors moments;
  std::lock_guard<std::mutex> lock(state_mu);
  auto &state = opt->state();
  for (size_t i = 0; i < params.size(); i++) {
    auto it = state.find(optimizer_state_key<Key>(params[i]));
    if (it == state.end()) continue;
    auto *s = dynamic_cast<torch::optim::AdamWParamState *>(it->second.get());
    if (!s) continue;
    moments.emplace_back("exp_avg of " + param_names[i], s->exp_avg());
    moments.emplace_back("exp_avg_sq of " + param_names[i], s->exp_avg_sq());
    moments.emplace_back("max_exp_avg_sq of " + param_names[i], s->max_exp_avg_sq());
  }
  return first_non_finite(moments);
}

std::string TrainerEngine::Impl::first_non_finite_grad() const {
  NamedTensors grads;
  for (size_t i = 0; i < params.size(); i++) grads.emplace_back(param_names[i], params[i].grad());
  return first_non_finite(grads);
}

double TrainerEngine::Impl::grad_norm() const {
  // One host sync for all parameters (a per-parameter item() stalls a GPU for each).
  std::vector<at::Tensor> norms;
  for (const auto &p : params)
    if (p.grad().defined()) norms.push_back(p.grad().detach().norm(2).to(at::kDouble));
  return norms.empty() ? 0.0 : at::stack(norms).norm(2).item<double>();
}

void TrainerEngine::Impl::append_metrics(const json &j) {
  if (!run_log.append_line(j.dump()) && !metrics_warned) {
    metrics_warned = true;  // once, not at every record
    warn("cannot append to metrics-file '" + cfg.metrics_file + "': training goes on without it");
  }
}

void TrainerEngine::Impl::report(const StepReport &r) {
  const bool log = cfg.log_every > 0 && (r.step % cfg.log_every == 0);
  if (log) {
    Message m("ddptrainsink-step");
    m.set_uint64("step", r.step).set_uint("epoch", r.epoch).set_bool("skipped", r.skipped);
    m.set_double("loss", r.loss).set_double("lr", r.lr).set_double("grad-norm", r.grad_norm);
    m.set_double("samples-per-second", r.samples_per_s).set_double("data-wait", r.data_wait);
    messages.push_back(m);
    auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
    append_metrics({{"type", "step"},
                    {"step", r.step},
                    {"epoch", r.epoch},
                    {"loss", num(r.loss)},
                    {"lr", r.lr},
                    {"grad_norm", num(r.grad_norm)},
                    {"samples_per_second", r.samples_per_s},
                    {"data_wait", r.data_wait},
                    {"skipped", r.skipped},
                    {"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}});
    {
      std::vector<std::pair<std::string, float>> s{{"train/loss", static_cast<float>(r.loss)},
                                                  {"train/lr", static_cast<float>(r.lr)},
                                                  {"train/samples_per_second", static_cast<float>(r.samples_per_s)},
                                                  {"train/data_wait", static_cast<float>(r.data_wait)}};
      if (std::isfinite(r.grad_norm)) s.emplace_back("train/grad_norm", static_cast<float>(r.grad_norm));
      run_log.add_scalars(r.step, s);
    }
  }
  notify(r);
}

void TrainerEngine::Impl::notify(const StepReport &r) {
  std::vector<StepCallback> cbs;
  {
    std::lock_guard<std::mutex> lock(cb_mu);
    for (auto &[id, cb] : callbacks) cbs.push_back(cb);
  }
  for (auto &cb : cbs) cb(r);
}

bool TrainerEngine::Impl::end_step(const MicroBatchInfo &info) {
  torch::NoGradGuard ng;
  if (reducer) reducer->finish();
  // One small all-reduce: loss, non-finite flag, and every rank's data position.
  const auto stats_opts = torch::TensorOptions().dtype(torch::kDouble);
  at::Tensor local_loss = step_loss.defined() ? step_loss.to(torch::kCPU, torch::kDouble) : torch::zeros({}, stats_opts);
  const double l = local_loss.item<double>();
  // [loss, non-finite ranks, ranks with samples, (epoch, clip) of each rank, checkpoint
  // due on rank 0's clock]: checkpoint-interval is decided once, so that every rank
  // takes its checkpoint at the same step.
  auto stats = torch::zeros({4 + 2 * world}, stats_opts);
  stats[0] = std::isfinite(l) ? l : 0.0;
  stats[1] = std::isfinite(l) ? 0.0 : 1.0;
  stats[2] = joining ? 0.0 : 1.0;
  stats[3 + 2 * rank] = static_cast<double>(epoch);
  stats[4 + 2 * rank] = static_cast<double>(next_clip);
  if (rank == 0 && store && cfg.checkpoint_interval_s > 0 && clock() - last_ckpt_time >= cfg.checkpoint_interval_s)
    stats[3 + 2 * world] = 1.0;
  if (group) {
    std::vector<at::Tensor> t{backend == "nccl" ? stats.to(device) : stats};
    group->allreduce(t, "loss/position all-reduce at step " + std::to_string(steps_done + 1));
    stats = t[0].to(torch::kCPU);
  }
  auto acc = stats.accessor<double, 1>();
  // Every rank's position after this step: taken over only once the step is counted, so
  // that a rescue checkpoint of the last completed step never holds a later position.
  std::vector<std::pair<unsigned, uint64_t>> step_positions(world, {0, 0});
  for (int r = 0; r < world; r++)
    step_positions[r] = {static_cast<unsigned>(acc[3 + 2 * r]), static_cast<uint64_t>(acc[4 + 2 * r])};
  const double active = acc[2];
  if (active < 0.5) {
    positions = step_positions;
    // Every rank's data had ended (each joined this step): nothing to train on.
    for (auto &p : params) p.mutable_grad() = at::Tensor();
    in_step = false;
    return false;
  }
  StepReport rep;
  rep.epoch = epoch;
  rep.lr = lr_at(steps_done);
  rep.grad_norm = std::numeric_limits<double>::quiet_NaN();
  // Why this step is not applied ("" when it is). A non-finite loss on any rank comes
  // from the all-reduced flag. Gradients are checked after the all-reduce: every rank
  // then holds the same gradients (BucketReducer::finish() copies the reduced buckets
  // into every trainable parameter's gradient, on every rank), so every rank decides
  // alike without another collective.
  std::string skip_why;
  if (acc[1] > 0) {
    rep.loss = std::numeric_limits<double>::quiet_NaN();
    skip_why = "non-finite loss at step " + std::to_string(steps_done + 1) + " on " +
               std::to_string(static_cast<int>(acc[1])) + " of " + std::to_string(world) + " rank(s) (this rank: " +
               std::to_string(l) + ")";
  } else {
    rep.loss = acc[0] / active;
    if (active < world) {
      // Ranks whose data ended contributed zeros: average over the ranks with samples.
      for (auto &p : params)
        if (p.grad().defined()) p.mutable_grad().mul_(world / active);
    }
    const bool log = cfg.log_every > 0 && ((steps_done + 1) % cfg.log_every == 0);
    if (cfg.grad_clip > 0) {
      // The total norm clipping computes says it: no second pass over the gradients.
      rep.grad_norm = torch::nn::utils::clip_grad_norm_(params, cfg.grad_clip);
      if (!std::isfinite(rep.grad_norm))
        skip_why = "non-finite gradient norm (" + std::to_string(rep.grad_norm) + ") with a finite loss (" +
                   std::to_string(rep.loss) + ") at step " + std::to_string(steps_done + 1);
    } else if (std::string bad = first_non_finite_grad(); !bad.empty()) {
      skip_why = "non-finite gradient (first: " + bad + ") with a finite loss (" + std::to_string(rep.loss) +
                 ") at step " + std::to_string(steps_done + 1);
    } else if (log) {
      rep.grad_norm = grad_norm();
    }
  }
  if (!skip_why.empty()) {
    rep.skipped = true;
    if (cfg.nan_policy == "fail") throw std::runtime_error(skip_why + "; nan-policy=fail");
    // Loss flag and gradients are the same on every rank, so every rank counts alike and
    // stops at the same step.
    if (cfg.max_skipped_steps > 0 && ++skipped_in_row >= cfg.max_skipped_steps)
      throw std::runtime_error(std::to_string(skipped_in_row) + " optimizer steps in a row (" +
                               std::to_string(steps_done + 2 - skipped_in_row) + " to " +
                               std::to_string(steps_done + 1) +
                               ") had a non-finite loss or gradient and were skipped (max-skipped-steps=" +
                               std::to_string(cfg.max_skipped_steps) + "; the last: " + skip_why +
                               "): the weights or the data hold NaN/Inf; lower lr, set grad-clip or check the input");
    warn(skip_why + ": optimizer step skipped on every rank (nan-policy=skip)");
  } else {
    skipped_in_row = 0;
    steps_applied++;
    for (auto &g : opt->param_groups()) static_cast<torch::optim::AdamWOptions &>(g.options()).lr(rep.lr);
    std::lock_guard<std::mutex> lock(state_mu);
    // The only place that changes the weights during training: every collective of the
    // step (gradient buckets, the loss/position all-reduce) is done, and the checks
    // above throw before it. A throw from inside it leaves `updating` set.
    updating = true;
    opt->step();
  }
  for (auto &p : params) p.mutable_grad() = at::Tensor();
  in_step = false;
  positions = std::move(step_positions);
  steps_done++;
  updating = false;
  steps_run++;
  rep.step = steps_done;
  last_loss = rep.loss;
  window_samples += static_cast<uint64_t>(step_samples) * world;
  if (group) group->mark_progress(steps_done);
  const double t = now_s();
  const double elapsed = std::max(t - window_start, 1e-9);
  rep.samples_per_s = window_samples / elapsed;
  rep.data_wait = std::min(1.0, window_wait / elapsed);
  const bool log = cfg.log_every > 0 && (steps_done % cfg.log_every == 0);
  report(rep);
  if (log) {
    window_start = now_s();
    window_wait = 0;
    window_samples = 0;
  }
  (void)info;
  const bool time_due = acc[3 + 2 * world] > 0.5;
  if (store && (time_due || (cfg.checkpoint_every > 0 && steps_done % cfg.checkpoint_every == 0)))
    write_checkpoint();
  return true;
}

void TrainerEngine::Impl::join_step() {
  // The collectives of step steps_done + 1 with zero gradients and no loss: the peers
  // average over the ranks that had samples, and every rank applies the same update.
  for (auto &p : params) p.mutable_grad() = at::Tensor();
  step_loss = at::Tensor();
  if (reducer) reducer->prepare(true, steps_done);
  joining = true;
  try {
    end_step(MicroBatchInfo{});
  } catch (...) {
    joining = false;
    throw;
  }
  joining = false;
}

void TrainerEngine::Impl::join_until_all_end() {
  // Ranks reach end of stream after different numbers of steps (Ctrl-C, queues of
  // different depth): until every rank has ended at the same step, this one takes part
  // in the steps its peers start (announced in the store before their collectives).
  uint64_t joined = steps_done;
  if (in_step) {
    warn("end of stream in the middle of step " + std::to_string(steps_done + 1) +
         ": this rank's micro-batches of it are dropped; the step goes on with the other ranks' samples");
    in_step = false;
    joined = steps_done + 1;  // announced: peers may be in it
    join_step();
  }
  group->mark_end(steps_done);
  const auto timeout = std::chrono::duration<double>(cfg.timeout_s);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!group->all_ended_at(steps_done)) {
    const uint64_t peer = group->max_peer_begin();
    if (peer > joined) {
      joined = peer;
      join_step();
      group->mark_end(steps_done);
      deadline = std::chrono::steady_clock::now() + timeout;
      continue;
    }
    if (int gone = group->peer_gone_before(steps_done); gone >= 0)
      throw std::runtime_error("end of stream after step " + std::to_string(steps_done) + ": rank " +
                               std::to_string(gone) + " stopped without reaching it (it failed or was stopped)");
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("end of stream after step " + std::to_string(steps_done) + ": waited " +
                               std::to_string(static_cast<int>(cfg.timeout_s)) +
                               " s for the other ranks to end or start a step: " + group->describe_peers());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void TrainerEngine::Impl::find_checkpoint() {
  ResumeRun run;
  run.world = world;
  run.rank = rank;
  run.model = cfg.model;
  run.lr_schedule = cfg.lr_schedule;
  run.max_steps = cfg.max_steps;
  run.warmup_steps = cfg.warmup_steps;
  if (!find_resume(
          *store, run, &resume_from, &rp.epoch, &rp.clip, [this](const std::string &t) { warn(t); },
          [this](const FoundCheckpoint &c) { return load_checkpoint(c); }))
    return;  // no step- folder at all: nothing was loaded
  last_ckpt_step = resume_from.step;
  resumed = true;
  rp.step = resume_from.step;
  steps_done = resume_from.step;
  if (cfg.latent_channels <= 0) cfg.latent_channels = resume_from.state.value("latent_channels", 0);
}

void TrainerEngine::Impl::agree_resume_step() {
  // Without a shared filesystem a rank may find no checkpoint (or an older one) and
  // would train out of step with the others, silently: every rank's step, then compare.
  // -1: this rank cannot resume at all (its error follows the agreement, so that no rank
  // is left waiting in it).
  auto steps = torch::zeros({world}, torch::TensorOptions().dtype(torch::kLong));
  steps[rank] = resume_error.empty() ? static_cast<int64_t>(resumed ? resume_from.step : 0) : -1;
  std::vector<at::Tensor> t{backend == "nccl" ? steps.to(device) : steps};
  group->allreduce(t, "resume step agreement");
  steps = t[0].to(torch::kCPU);
  const auto *v = steps.data_ptr<int64_t>();
  if (!resume_error.empty()) throw std::runtime_error(resume_error);
  for (int r = 0; r < world; r++)
    if (v[r] < 0)
      throw std::runtime_error("resume=true: rank " + std::to_string(r) + " cannot resume (its error says why)");
  if (std::all_of(v, v + world, [&](int64_t x) { return x == v[0]; })) return;
  std::string who;
  for (int r = 0; r < world; r++)
    who += (r ? ", " : "") + ("rank " + std::to_string(r) + ": " + (v[r] ? "step " + std::to_string(v[r]) : "none"));
  throw std::runtime_error("resume=true: the ranks found different checkpoints in checkpoint-dir (" + who +
                           "); every rank must see the same checkpoint-dir (a shared filesystem)");
}

void TrainerEngine::Impl::write_checkpoint() {
  if (!model || last_ckpt_step == steps_done) return;
  // Non-finite weights would load without a word and make every later step non-finite:
  // an error, not a warning, because the run cannot recover from them either.
  // Every rank holds the same weights, so every rank stops here alike.
  if (const std::string bad = first_non_finite(*model); !bad.empty())
    throw std::runtime_error("the weights hold NaN/Inf at step " + std::to_string(steps_done) + " (first: " + bad +
                             "): no checkpoint written, the checkpoints in checkpoint-dir are kept; training cannot "
                             "recover from this (lower lr, set grad-clip)");
  const uint64_t prev_step = last_ckpt_step;
  last_ckpt_step = steps_done;
  last_ckpt_time = clock();
  if (rank != 0) return;  // every rank holds the same weights; rank 0 writes
  try {
    save_checkpoint(false);
  } catch (...) {
    last_ckpt_step = prev_step;  // not written: a rescue may try again, the stop warning counts it lost
    throw;
  }
}

std::string TrainerEngine::Impl::save_checkpoint(bool rescue) {
  const std::string tmp = store->begin(steps_done);
  std::string model_file;
  {
    std::lock_guard<std::mutex> lock(state_mu);
    model_file = model->save(tmp);
    torch::save(*opt, tmp + "/optimizer.pt");
  }
  // No generator state: every step reseeds from (seed, rank, step), so a resume draws
  // the same numbers as an uninterrupted run.
  json pos = json::array();
  for (int r = 0; r < static_cast<int>(positions.size()); r++)
    pos.push_back({{"rank", r}, {"epoch", positions[r].first}, {"clip", positions[r].second}});
  json state = {{"format", 1},
                {"model", cfg.model},
                {"model_file", model_file},
                {"latent_channels", dims.latent_channels},
                {"text_dim", dims.text_dim},
                {"step", steps_done},
                {"lr", lr_at(steps_done ? steps_done - 1 : 0)},
                {"lr_schedule", cfg.lr_schedule},
                {"warmup_steps", cfg.warmup_steps},
                {"max_steps", cfg.max_steps},
                {"seed", cfg.seed},
                {"world_size", world},
                {"positions", pos},
                {"optimizer_file", "optimizer.pt"},
                {"rng_note", "no generator state: each step reseeds from seed, rank and step"}};
  if (rescue) state["rescue"] = true;  // informative only: resume reads it like any other
  const std::string final_dir = store->commit(tmp, steps_done, state);
  // Only now, with a newer checkpoint complete and verified, may older ones go (local
  // files only, no collective: also on the rescue path).
  store->prune(cfg.keep_checkpoints, steps_done);
  Message m("ddptrainsink-checkpoint");
  m.set_uint64("step", steps_done).set_string("path", final_dir);
  if (rescue) m.set_bool("rescue", true);
  messages.push_back(m);
  json rec = {{"type", "checkpoint"}, {"step", steps_done}, {"path", final_dir}};
  if (rescue) rec["rescue"] = true;
  append_metrics(rec);
  return final_dir;
}

bool TrainerEngine::Impl::rescue(const std::string &context) {
  // After every completed optimizer step every rank holds the same weights and optimizer
  // state, so rank 0 alone can write them: no collective, no barrier, no store access
  // (the peers may be dead).
  if (rescue_tried || finished || rank != 0 || !store || !model) return false;
  const uint64_t saved = saved_step();
  if (steps_done <= saved) return false;
  rescue_tried = true;
  if (step_failed && backend == "nccl") {
    // A failed NCCL collective can leave its kernel waiting on the GPU, and the copies
    // that save the weights would queue behind it (until NCCL's watchdog ends the
    // process): no rescue rather than a hang. Gloo ops fail on the host.
    rescue_why = "backend=nccl, and after a failed step the GPU may still be waiting in a collective";
    return false;
  }
  if (updating) {
    rescue_why = "step " + std::to_string(steps_done + 1) + " failed while the optimizer was updating the weights";
    return false;
  }
  if (all_steps_skipped()) {
    rescue_why = "every step of this run was skipped (non-finite)";
    return false;
  }
  try {
    if (std::string bad = first_non_finite(*model); !bad.empty()) {
      rescue_why = "the weights hold NaN/Inf (first: " + bad + ")";
      return false;
    }
    if (std::string bad = first_non_finite_optimizer(); !bad.empty()) {
      rescue_why = "the optimizer state holds NaN/Inf (first: " + bad + ")";
      return false;
    }
    for (const auto &[step, dir] : store->step_folders())
      if (step >= steps_done) {
        rescue_why = "checkpoint-dir already holds '" + dir + "'";
        return false;
      }
    const std::string dir = save_checkpoint(true);
    last_ckpt_step = steps_done;
    warn("wrote a rescue checkpoint of step " + std::to_string(steps_done) + " to " + dir + " (" + context +
         "; rank 0 alone, the last completed step)");
    return true;
  } catch (const std::exception &e) {
    rescue_why = "writing it failed: " + first_line(e.what());
    return false;
  }
}

std::string TrainerEngine::Impl::all_skipped_text() const {
  return "all " + std::to_string(steps_run) +
         " optimizer steps of this run had a non-finite loss or gradient and were skipped: nothing was trained, "
         "no checkpoint written (check the input and lr)";
}

/* ---------------- TrainerEngine ---------------- */

TrainerEngine::TrainerEngine(const TrainerConfig &config) : impl_(std::make_unique<Impl>()) { impl_->cfg = config; }

TrainerEngine::~TrainerEngine() { stop(); }

bool TrainerEngine::start() {
  auto &im = *impl_;
  if (!im.resolve()) return false;
  if (!im.cfg.checkpoint_dir.empty()) {
    // Now, not at the first checkpoint hours later; before the rendezvous, so that with
    // a shared folder every rank fails at once.
    im.store = std::make_unique<CheckpointStore>(im.cfg.checkpoint_dir);
    std::string why;
    if (!im.store->prepare(&why)) return im.fail(why + " (property checkpoint-dir)");
  }
  if (std::string w = im.run_log.open(im.rank, im.cfg.metrics_file); !w.empty()) im.warn(w);
  try {
    if (im.world > 1) {
      DistOptions o;
      o.rank = im.rank;
      o.world_size = im.world;
      o.master_addr = im.master_addr;
      o.master_port = im.master_port;
      o.backend = im.backend;
      o.timeout = std::chrono::milliseconds(static_cast<int64_t>(im.cfg.timeout_s * 1000));
      im.group = std::make_unique<DistGroup>(o);
    }
    if (im.rank == 0 && im.store) im.store->remove_stale();
    if (im.cfg.resume) {
      try {
        im.find_checkpoint();
      } catch (const std::exception &e) {
        if (!im.group) throw;
        im.resume_error = first_line(e.what());
      }
      // Before any model collective: a rank that resumes builds its model now.
      if (im.group) im.agree_resume_step();
    }
    // Built-in models whose sizes are not known yet are built at the first micro-batch.
    const ModelDims known = im.model ? im.dims : ModelDims{im.cfg.latent_channels, 0};
    if (im.model || model_dims_known(im.cfg.model, known)) im.build_model(known);
    if (std::string m = im.inputs_mismatch(); !m.empty()) return im.fail(m);
    if (std::string err = im.run_log.open_tensorboard(im.cfg.tensorboard_dir); !err.empty()) im.warn(err);
  } catch (const std::exception &e) {
    return im.fail(first_line(e.what()));
  }
  im.window_start = now_s();
  im.last_ckpt_time = im.clock();
  return true;
}

bool TrainerEngine::resumed() const { return impl_->resumed; }
ResumePoint TrainerEngine::resume_point() const { return impl_->rp; }

ProcessResult TrainerEngine::process_tensor(const at::Tensor &batch, const MicroBatchInfo &info) {
  ModelInputs in;
  in.latents = batch;
  in.captions = info.captions;
  return process_inputs(in, info);
}

ProcessResult TrainerEngine::process_inputs(const ModelInputs &in, const MicroBatchInfo &info) {
  auto &im = *impl_;
  if (im.cfg.max_steps > 0 && im.steps_done >= im.cfg.max_steps) return ProcessResult::kDone;
  const at::Tensor &batch = in.latents;
  try {
    if (batch.dim() != 5 || !batch.is_floating_point() || batch.size(0) < 1) {
      std::ostringstream s;
      s << "micro-batch tensor has shape " << batch.sizes() << " and dtype " << batch.scalar_type()
        << "; expected a float tensor [m, C, t, h, w]";
      im.error = s.str();
      return ProcessResult::kError;
    }
    if (in.has_text() && (in.text_embeds.dim() != 3 || !in.text_mask.defined() || in.text_mask.dim() != 2 ||
                          in.text_embeds.size(0) != batch.size(0) || in.text_mask.size(0) != batch.size(0) ||
                          in.text_mask.size(1) != in.text_embeds.size(1))) {
      std::ostringstream s;
      s << "micro-batch text tensors have shapes " << in.text_embeds.sizes() << " (text_embeds) and "
        << (in.text_mask.defined() ? in.text_mask.sizes() : c10::IntArrayRef{}) << " (text_mask) for "
        << batch.size(0) << " samples; expected [m, L, D] and [m, L]";
      im.error = s.str();
      return ProcessResult::kError;
    }
    const ModelDims seen{static_cast<int>(batch.size(1)), in.has_text() ? static_cast<int>(in.text_embeds.size(2)) : 0};
    if (!im.model) im.build_model(seen);
    im.stream_text = in.has_text() ? 1 : 0;
    if (std::string m = im.inputs_mismatch(); !m.empty()) {
      im.error = m;
      return ProcessResult::kError;
    }
    if (is_builtin_spec(im.cfg.model) && seen.latent_channels != im.dims.latent_channels) {
      im.error = "micro-batch has " + std::to_string(seen.latent_channels) +
                 " latent channels, the model was built for " + std::to_string(im.dims.latent_channels) +
                 " (property latent-channels / checkpoint)";
      return ProcessResult::kError;
    }
    if (is_builtin_spec(im.cfg.model) && im.dims.text_dim > 0 && seen.text_dim != im.dims.text_dim) {
      im.error = "micro-batch text embeddings have " + std::to_string(seen.text_dim) +
                 " dimensions, the model was built for " + std::to_string(im.dims.text_dim) +
                 " (textencoder model / checkpoint)";
      return ProcessResult::kError;
    }
    const int64_t m = batch.size(0);
    const unsigned S = info.step_samples > 0 ? info.step_samples : static_cast<unsigned>(m);
    if (im.in_step && info.micro_index == 0) {
      im.warn("step " + std::to_string(im.steps_done + 1) +
              " restarted before its last micro-batch (flush or upstream restart): its gradients are dropped");
      im.in_step = false;
    }
    if (!im.in_step) {
      // First micro-batch of a step (a partial step that never got its sync micro-batch
      // is discarded with its gradients).
      for (auto &p : im.params) p.mutable_grad() = at::Tensor();
      im.step_loss = at::Tensor();
      im.in_step = true;
      if (im.group) im.group->mark_begin(im.steps_done + 1);  // before any collective of the step
      std::lock_guard<std::mutex> rng(default_rng_mutex());
      torch::manual_seed(step_seed(im.cfg.seed, im.rank, im.steps_done));
    }
    im.step_samples = S;
    im.epoch = info.epoch;
    im.next_clip = info.next_clip;
    const bool reduce = info.sync && im.reducer;
    if (im.reducer) im.reducer->prepare(reduce, im.steps_done);
    ModelInputs x = in;
    x.latents = batch.to(im.device, torch::kFloat, /*non_blocking=*/true);
    if (x.has_text()) {
      x.text_embeds = in.text_embeds.to(im.device, torch::kFloat, /*non_blocking=*/true);
      x.text_mask = in.text_mask.to(im.device, torch::kLong, /*non_blocking=*/true);
    }
    at::Tensor loss;
    {
      std::lock_guard<std::mutex> rng(default_rng_mutex());  // the step's noise is drawn here
      AutocastGuard ac(im.bf16, im.device.is_cuda());
      loss = im.model->training_step(x);
    }
    if (!loss.defined() || loss.numel() != 1)
      throw std::runtime_error("training_step of model " + im.cfg.model + " returned a non-scalar loss");
    const double w = static_cast<double>(m) / S;
    auto scaled = loss.reshape({}).to(torch::kFloat) * w;
    scaled.backward();
    auto d = scaled.detach().to(torch::kDouble);
    im.step_loss = im.step_loss.defined() ? im.step_loss + d : d;
    if (!info.sync) return ProcessResult::kOk;
    im.end_step(info);
  } catch (const std::exception &e) {
    im.error = first_line(e.what());
    im.step_failed = true;
    // The error path (a collective that failed because a peer died, nan-policy=fail, ...):
    // the last completed step is saved now, before the face posts the error.
    im.rescue("the run failed in step " + std::to_string(im.steps_done + 1));
    return ProcessResult::kError;
  }
  if (im.cfg.max_steps > 0 && im.steps_done >= im.cfg.max_steps) {
    if (im.all_steps_skipped()) {
      im.error = im.all_skipped_text();
      return ProcessResult::kError;
    }
    try {
      if (im.store) im.write_checkpoint();
    } catch (const std::exception &e) {
      im.error = first_line(e.what());
      return ProcessResult::kError;
    }
    return ProcessResult::kDone;
  }
  return ProcessResult::kOk;
}

bool TrainerEngine::set_stream_text(bool has_text) {
  auto &im = *impl_;
  im.stream_text = has_text ? 1 : 0;
  if (std::string m = im.inputs_mismatch(); !m.empty()) return im.fail(m);
  return true;
}

void TrainerEngine::add_wait_time(double seconds) {
  if (seconds > 0) impl_->window_wait += seconds;
}

bool TrainerEngine::finish() {
  auto &im = *impl_;
  struct Finished {  // ddpvalsink's final validation: after the last (joined) step
    Impl &im;
    ~Finished() {
      StepReport r;
      r.step = im.steps_done;
      r.finished = true;
      im.notify(r);
    }
  } finished{im};
  try {
    if (im.group && im.model) {
      im.join_until_all_end();
    } else if (im.in_step) {
      im.warn("end of stream in the middle of step " + std::to_string(im.steps_done + 1) +
              ": its micro-batches are dropped");
      for (auto &p : im.params) p.mutable_grad() = at::Tensor();
      im.in_step = false;
    }
    // Every rank skipped the same steps (agreed), so every rank fails here alike.
    if (im.all_steps_skipped()) return im.fail(im.all_skipped_text());
    if (im.store && im.model && im.steps_done > 0) im.write_checkpoint();
  } catch (const std::exception &e) {
    im.fail(first_line(e.what()));
    im.step_failed = true;
    im.rescue("end of stream failed after step " + std::to_string(im.steps_done));
    return false;
  }
  im.finished = true;
  return true;
}

void TrainerEngine::stop() {
  auto &im = *impl_;
  // Stopped without a successful end of stream (gst-launch without -e, an error, a peer
  // that failed): say what is lost instead of nothing.
  // The rescue comes before mark_exit(): it must not depend on the store (a peer or the
  // store's host may be gone).
  const bool in_step = im.in_step;
  const bool rescued = im.rescue("stopped without end of stream");
  if (rescued && in_step)
    im.warn("stopped in the middle of step " + std::to_string(im.steps_done + 1) +
            ": its micro-batches are dropped (the rescue checkpoint holds step " + std::to_string(im.steps_done) + ")");
  const uint64_t saved = im.saved_step();
  if (im.store && im.model && !im.finished && im.rank == 0 && im.steps_done > saved)
    im.warn("stopped after step " + std::to_string(im.steps_done) + " without end of stream: steps " +
            std::to_string(saved + 1) + " to " + std::to_string(im.steps_done) + " are not in a checkpoint (" +
            (saved ? "the last is " + step_dir_name(saved) : std::string("none was written")) +
            ")" + (im.rescue_why.empty() ? std::string() : "; no rescue checkpoint: " + im.rescue_why) +
            "; send EOS to stop (gst-launch-1.0 -e, Ctrl-C in videotrain-run or videotrain-launch)");
  im.finished = true;  // once
  if (im.group) im.group->mark_exit();
  im.reducer.reset();
  im.group.reset();
  im.run_log.close();
}

bool TrainerEngine::append_log(const std::string &json_line, uint64_t step,
                               const std::vector<std::pair<std::string, float>> &scalars) {
  return impl_->run_log.append(json_line, step, scalars);
}

const std::string &TrainerEngine::error() const { return impl_->error; }

std::vector<TrainerEngine::Message> TrainerEngine::take_messages() {
  std::vector<Message> out;
  out.swap(impl_->messages);
  return out;
}

int TrainerEngine::rank() const { return impl_->rank; }
int TrainerEngine::world_size() const { return impl_->world; }
uint64_t TrainerEngine::steps_done() const { return impl_->steps_done; }
std::string TrainerEngine::device_name() const { return videotrain::device_name(impl_->device); }
std::string TrainerEngine::master_addr() const { return impl_->master_addr; }
int TrainerEngine::master_port() const { return impl_->master_port; }
double TrainerEngine::timeout_s() const { return impl_->cfg.timeout_s; }
double TrainerEngine::last_loss() const { return impl_->last_loss; }

std::shared_ptr<const ParamSnapshot> TrainerEngine::snapshot_state() const {
  auto &im = *impl_;
  std::lock_guard<std::mutex> lock(im.state_mu);
  if (!im.model) return nullptr;
  auto s = std::make_shared<ParamSnapshot>();
  torch::NoGradGuard ng;
  s->step = im.steps_done;
  s->model = im.cfg.model;
  s->dims = im.dims;
  for (auto &[n, p] : im.model->named_parameters()) s->parameters.emplace_back(n, p.detach().clone());
  for (auto &[n, b] : im.model->named_buffers()) s->buffers.emplace_back(n, b.detach().clone());
  return s;
}

bool TrainerEngine::has_model() const {
  std::lock_guard<std::mutex> lock(impl_->state_mu);
  return impl_->model != nullptr;
}

int TrainerEngine::add_step_callback(StepCallback cb) {
  std::lock_guard<std::mutex> lock(impl_->cb_mu);
  int id = impl_->next_cb++;
  impl_->callbacks[id] = std::move(cb);
  return id;
}

void TrainerEngine::remove_step_callback(int id) {
  std::lock_guard<std::mutex> lock(impl_->cb_mu);
  impl_->callbacks.erase(id);
}

std::map<std::string, std::vector<float>> TrainerEngine::parameters_cpu(bool with_buffers) const {
  std::map<std::string, std::vector<float>> out;
  auto &im = *impl_;
  std::lock_guard<std::mutex> lock(im.state_mu);
  if (!im.model) return out;
  auto add = [&](const std::string &n, const at::Tensor &t) {
    auto c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
    out[n] = std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  };
  for (auto &[n, p] : im.model->named_parameters()) add(n, p);
  if (with_buffers)
    for (auto &[n, b] : im.model->named_buffers()) add(n, b);
  return out;
}

ReducerInfo TrainerEngine::reducer_info() const {
  ReducerInfo out;
  auto &im = *impl_;
  if (!im.reducer) return out;
  out.buckets = im.reducer->bucket_layout();
  out.bucket_bytes = im.reducer->bucket_bytes();
  for (const auto &p : im.params) out.param_bytes.push_back(static_cast<size_t>(p.numel()) * p.element_size());
  out.rebuilt = im.reducer->rebuilt();
  out.launch_order = im.reducer->last_launch_order();
  out.pending_at_launch = im.reducer->last_pending_at_launch();
  return out;
}

}  // namespace videotrain
