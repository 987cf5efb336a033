/* TrainerEngine: the model, the optimizer, gradient accumulation, the step (bucketed all-reduce,
 * non-finite checks, update) and progress. Checkpoints: trainer_checkpoints.cpp; the
 * end-of-stream agreement: step_agreement.h. See trainer_engine.h. */
#include "trainer_engine.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <mutex>
#include <tuple>
#include <sstream>

#include "autocast_guard.h"
#include "cpu_heap.h"
#include "default_rng.h"
#include "dist_env.h"
#include "first_line.h"
#include "models/param_snapshot.h"
#include "row_facts.h"
#include "seeded_hash.h"
#include "tensor_buffer.h"
#include "trainer_engine_impl.h"

namespace fs = std::filesystem;

namespace videotrain {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double TrainerEngine::Impl::clock() const { return cfg.clock ? cfg.clock() : now_s(); }

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

void TrainerEngine::Impl::metrics_written(bool ok) {
  if (ok || metrics_warned) return;
  metrics_warned = true;  // once, not at every record
  warn("cannot append to metrics-file '" + cfg.metrics_file + "': training goes on without it");
}

void TrainerEngine::Impl::log_report(const StepReport &r) {
  Message m("ddptrainsink-step");
  m.set_uint64("step", r.step).set_uint("epoch", r.epoch).set_bool("skipped", r.skipped);
  m.set_double("loss", r.loss).set_double("lr", r.lr).set_double("grad-norm", r.grad_norm);
  m.set_double("samples-per-second", r.samples_per_s).set_double("data-wait", r.data_wait);
  // Progress: the step rate since the last logged step, and what is left of max-steps.
  const double t = now_s();
  if (rate_time >= 0 && r.step > rate_step && t > rate_time) {
    const double now_rate = static_cast<double>(r.step - rate_step) / (t - rate_time);
    steps_per_s = steps_per_s > 0 ? 0.7 * steps_per_s + 0.3 * now_rate : now_rate;  // smoothed
  }
  rate_time = t;
  rate_step = r.step;
  m.set_uint64("max-steps", cfg.max_steps).set_double("steps-per-second", steps_per_s);
  if (cfg.max_steps > r.step && steps_per_s > 0)
    m.set_double("eta-seconds", static_cast<double>(cfg.max_steps - r.step) / steps_per_s);
  messages.push_back(std::move(m));
  metrics_written(run_log.log_step(r));
}

void TrainerEngine::Impl::report(const StepReport &r) {
  has_unlogged = !logged_step(r.step);
  if (has_unlogged) unlogged = r;
  else log_report(r);
  notify(r);
}

void TrainerEngine::Impl::notify(const StepReport &r) {
  std::vector<StepCallback> cbs;
  {
    std::lock_guard<std::mutex> lock(cb_mu);
    // Recorded with the callbacks taken: a follower subscribing later learns the end from ended().
    if (r.finished && !ended) {
      ended = true;
      ended_report = r;
    }
    for (auto &[id, cb] : callbacks) cbs.push_back(cb);
  }
  for (auto &cb : cbs) cb(r);
}

bool TrainerEngine::Impl::end_step() {
  torch::NoGradGuard ng;
  if (reducer) reducer->finish();
  if (shards) shards->finish_gradients();
  // One small all-reduce: loss, non-finite flag, and every rank's data position.
  const auto stats_opts = torch::TensorOptions().dtype(torch::kDouble);
  at::Tensor local_loss = step_loss.defined() ? step_loss.to(torch::kCPU, torch::kDouble) : torch::zeros({}, stats_opts);
  const double l = local_loss.item<double>();
  // [loss, non-finite ranks, ranks with samples, (epoch, clip) of each rank, checkpoint
  // due on rank 0's clock, ranks with step callbacks]: checkpoint-interval is decided
  // once, so that every rank takes its checkpoint at the same step; the callbacks'
  // count, so that validators joining at different steps start at the same one.
  // [..., this rank's followers want the weights' / the EMA's snapshot of this step where only
  // slices of them are held (set_snapshot_schedule): every rank gathers them then].
  auto stats = torch::zeros({7 + 2 * world}, stats_opts);
  stats[0] = std::isfinite(l) ? l : 0.0;
  stats[1] = std::isfinite(l) ? 0.0 : 1.0;
  stats[2] = joining ? 0.0 : 1.0;
  stats[3 + 2 * rank] = static_cast<double>(epoch);
  stats[4 + 2 * rank] = static_cast<double>(next_clip);
  if (rank == 0 && store && cfg.checkpoint_interval_s > 0 && clock() - last_ckpt_time >= cfg.checkpoint_interval_s)
    stats[3 + 2 * world] = 1.0;
  {
    std::lock_guard<std::mutex> lock(cb_mu);
    stats[4 + 2 * world] = callbacks.empty() ? 0.0 : 1.0;
  }
  if (shards) {
    const auto [raw, avg] = snapshots_wanted(steps_done + 1, false);
    stats[5 + 2 * world] = raw ? 1.0 : 0.0;
    stats[6 + 2 * world] = avg ? 1.0 : 0.0;
  }
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
  if (!joining && active < world - 0.5) peer_ended = true;
  const bool log = logged_step(steps_done + 1);  // this step's report and grad-norm
  StepReport rep;
  rep.epoch = epoch;
  rep.lr = lr_at(steps_done);
  rep.grad_norm = std::numeric_limits<double>::quiet_NaN();
  rep.every_rank_subscribed = acc[4 + 2 * world] > world - 0.5;
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
    if (shards) {
      // Each rank holds a slice of the gradients: their norm and finiteness come from all ranks.
      const auto [norm, bad] = shards->gradient_norm();
      rep.grad_norm = norm;
      if (bad > 0)
        skip_why = "non-finite gradient (" + std::to_string(bad) + " values) with a finite loss (" +
                   std::to_string(rep.loss) + ") at step " + std::to_string(steps_done + 1);
      else if (cfg.grad_clip > 0 && norm + 1e-6 > cfg.grad_clip)  // LibTorch's clip_grad_norm_ rule
        for (auto &p : params) p.mutable_grad().mul_(cfg.grad_clip / (norm + 1e-6));
    } else if (cfg.grad_clip > 0) {
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
    opt->set_lr(rep.lr);
    std::lock_guard<std::mutex> lock(state_mu);
    // The only place that changes the weights during training: every collective of the
    // step (gradient buckets, the loss/position all-reduce) is done, and the checks
    // above throw before it. A throw from inside it leaves `updating` set.
    updating = true;
    opt->step();
    if (shards) shards->after_update();
    if (ema) ema->update(steps_done + 1, params);
  }
  for (auto &p : params) p.mutable_grad() = at::Tensor();
  in_step = false;
  join_micro_done = 0;
  positions = std::move(step_positions);
  steps_done++;
  updating = false;
  steps_run++;
  rep.step = steps_done;
  // Before the callbacks, on every rank alike (the flags are all-reduced): the whole copies the
  // followers of some rank take at this step (and the previous step's copies go).
  if (shards) gather_snapshots(acc[5 + 2 * world] > 0.5, acc[6 + 2 * world] > 0.5);
  last_loss = rep.loss;
  window_samples += static_cast<uint64_t>(step_samples) * world;
  if (group) group->mark_progress(steps_done);
  const double t = now_s();
  const double elapsed = std::max(t - window_start, 1e-9);
  rep.samples_per_s = window_samples / elapsed;
  rep.data_wait = std::min(1.0, window_wait / elapsed);
  report(rep);
  if (log) {
    window_start = now_s();
    window_wait = 0;
    window_samples = 0;
  }
  const bool time_due = acc[3 + 2 * world] > 0.5;
  if (store && (time_due || (cfg.checkpoint_every > 0 && steps_done % cfg.checkpoint_every == 0)))
    write_checkpoint();
  return true;
}

void TrainerEngine::Impl::join_step() {
  // The collectives of step steps_done + 1 with zero gradients and no loss: the peers
  // average over the ranks that had samples, and every rank applies the same update.
  for (auto &p : params) p.mutable_grad() = at::Tensor();
  if (shards) {
    // sharding=full: the peers' micro-batches gather and reduce block by block, so this rank takes
    // part in as many as they run (the step's count, as this rank's own steps had; those of them it
    // already ran before its data ended have been reduced with the peers).
    // Under full, what this rank ran of the step is already summed into every rank's slices: kept.
    if (join_micro_done == 0 || shards->mode() != Sharding::full) shards->drop_gradients();
    for (unsigned i = join_micro_done; i < micro_count; i++) shards->join_micro_batch();
    join_micro_done = 0;
  }
  step_loss = at::Tensor();
  if (reducer) reducer->prepare(true, steps_done);
  joining = true;
  try {
    end_step();
  } catch (...) {
    joining = false;
    throw;
  }
  joining = false;
}

/* ---------------- TrainerEngine ---------------- */

// What the model reads of each sample (captions for caption models, ids and epoch for noise drawn
// per sample) comes from the batch record, here only.
static void take_sample_facts(ModelInputs &x, const BatchInfo &b) {
  x.captions = b.captions;
  x.sample_ids = b.sample_ids;
  x.epoch = b.epoch;
}

TrainerEngine::TrainerEngine(const TrainerConfig &config) : impl_(std::make_unique<Impl>()) { impl_->cfg = config; }

TrainerEngine::~TrainerEngine() { stop(); }

ProcessResult TrainerEngine::process_tensor(const at::Tensor &batch, const BatchInfo &info) {
  ModelInputs in;
  in.latents = batch;
  return process_inputs(in, info);
}

ProcessResult TrainerEngine::process_inputs(const ModelInputs &in, const BatchInfo &info) {
  const ProcessResult r = impl_->process(in, info);
  if (r == ProcessResult::kError || r == ProcessResult::kInterrupted) impl_->report_failure();
  return r;
}

void TrainerEngine::Impl::report_failure() {
  if (failure_reported) return;
  failure_reported = true;
  StepReport r;
  r.step = steps_done;
  r.finished = true;
  r.failed = true;
  try {
    notify(r);
  } catch (const std::exception &e) {
    warn("after the failed step: " + first_line(e.what()));
  }
}

ProcessResult TrainerEngine::Impl::process(const ModelInputs &in, const BatchInfo &info) {
  auto &im = *this;
  if (im.cfg.max_steps > 0 && im.steps_done >= im.cfg.max_steps) return ProcessResult::kDone;
  im.interrupted = false;
  if (im.group && im.group->broken()) {
    im.error = "step " + std::to_string(im.steps_done + 1) +
               " cannot be trained: a collective of this run was interrupted (the pipeline stopped or flushed), "
               "which leaves the ranks out of step; restart the run (resume=true goes on from the last checkpoint)";
    return ProcessResult::kError;
  }
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
      std::tie(im.epoch, im.next_clip) = im.step_start;
    }
    if (!im.in_step) {
      im.step_start = {im.epoch, im.next_clip};
      // First micro-batch of a step (a partial step that never got its sync micro-batch
      // is discarded with its gradients).
      for (auto &p : im.params) p.mutable_grad() = at::Tensor();
      if (im.shards) im.shards->drop_gradients();
      im.step_loss = at::Tensor();
      im.in_step = true;
      if (im.agreement) im.agreement->begin(im.steps_done + 1);  // before any collective of the step
      std::lock_guard<std::mutex> rng(default_rng_mutex());
      torch::manual_seed(step_seed(im.cfg.seed, im.rank, im.steps_done));
    }
    im.step_samples = S;
    im.micro_count = std::max(1u, info.micro_count);
    im.join_micro_done = info.micro_index + 1;  // a step left after this one joins only the rest
    im.epoch = info.epoch;
    im.next_clip = info.next_clip;
    const bool reduce = info.sync && im.reducer;
    if (im.reducer) im.reducer->prepare(reduce, im.steps_done);
    if (im.shards) im.shards->begin_micro_batch(info.sync);
    ModelInputs x = in;
    x.latents = batch.to(im.device, torch::kFloat, /*non_blocking=*/true);
    take_sample_facts(x, info);
    if (x.has_text()) {
      x.text_embeds = in.text_embeds.to(im.device, torch::kFloat, /*non_blocking=*/true);
      x.text_mask = in.text_mask.to(im.device, torch::kLong, /*non_blocking=*/true);
    }
    at::Tensor loss;
    {
      std::lock_guard<std::mutex> rng(default_rng_mutex());  // the step's noise is drawn here
      AutocastGuard autocast(im.bf16, im.device.is_cuda());
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
    im.end_step();
  } catch (const std::exception &e) {
    im.error = first_line(e.what());
    im.step_failed = true;
    im.interrupted = im.group && im.group->cancelled();
    // The error path (a collective that failed because a peer died, nan-policy=fail, an
    // interruption, ...): the last completed step is saved now, before the face posts the error.
    im.rescue((im.interrupted ? "interrupted in step " : "the run failed in step ") +
              std::to_string(im.steps_done + 1));
    return im.interrupted ? ProcessResult::kInterrupted : ProcessResult::kError;
  }
  if (im.peer_ended && !im.wants_no_data) {
    // Every rank ends at this step: the peers' end-of-stream agreement, then the final checkpoint.
    im.wants_no_data = true;
    im.warn("a peer's data ended at step " + std::to_string(im.steps_done) +
            " (it was stopped): this rank stops there too and writes the run's end as usual");
    return ProcessResult::kDone;
  }
  if (im.cfg.max_steps > 0 && im.steps_done >= im.cfg.max_steps) {
    im.wants_no_data = true;
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
  im.wants_no_data = true;
  struct Finished {  // ddpvalsink's final validation: after the last (joined) step
    Impl &im;
    ~Finished() {
      StepReport r;
      r.step = im.steps_done;
      r.finished = true;
      try {
        im.notify(r);
      } catch (const std::exception &e) {  // a destructor: what a callback threw becomes a warning
        im.warn("after end of stream: " + first_line(e.what()));
      }
    }
  } finished{im};
  im.interrupted = false;
  try {
    if (im.agreement && im.model) {
      if (im.in_step)
        im.warn("end of stream in the middle of step " + std::to_string(im.steps_done + 1) +
                ": this rank's micro-batches of it are dropped; the step goes on with the other ranks' samples");
      const bool mid_step = im.in_step;
      im.in_step = false;
      // Its dropped micro-batches were not trained: the position stays where the last step left it.
      if (mid_step) std::tie(im.epoch, im.next_clip) = im.step_start;
      im.agreement->join_until_all_end(im.steps_done, mid_step, [&im] {
        im.join_step();
        return im.steps_done;
      });
    } else if (im.in_step) {
      im.warn("end of stream in the middle of step " + std::to_string(im.steps_done + 1) +
              ": its micro-batches are dropped");
      for (auto &p : im.params) p.mutable_grad() = at::Tensor();
      im.in_step = false;
      std::tie(im.epoch, im.next_clip) = im.step_start;
    }
    // Every rank skipped the same steps (agreed), so every rank fails here alike.
    if (im.all_steps_skipped()) return im.fail(im.all_skipped_text());
    if (im.has_unlogged && im.cfg.log_every > 0) {
      im.has_unlogged = false;
      im.log_report(im.unlogged);
    }
    if (im.store && im.model && im.steps_done > 0) im.write_checkpoint();
    if (im.model && im.steps_done > 0) im.export_model();
    if (im.shards && im.model) {
      // The final snapshot the followers take once the run has ended (collective, agreed).
      auto [raw, avg] = im.agree_snapshots_wanted(im.steps_done, true);
      im.gather_snapshots(raw, avg);
    }
  } catch (const std::exception &e) {
    im.fail(first_line(e.what()));
    im.step_failed = true;
    im.interrupted = im.group && im.group->cancelled();
    im.rescue((im.interrupted ? "end of stream interrupted after step " : "end of stream failed after step ") +
              std::to_string(im.steps_done));
    return false;
  }
  im.finished = true;
  if (im.store) im.store->unlock();  // the final checkpoint is written: the folder is free
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
  if (im.store) im.store->unlock();  // no more checkpoints from this run: the folder is free
  if (im.group) im.group->mark_exit();
  im.reducer.reset();
  im.agreement.reset();
  if (im.group) im.group->cancel(true);  // an agree_row_facts() waiting gives up
  std::lock_guard<std::mutex> g(im.group_use);
  im.group.reset();
  im.run_log.close();
}

bool TrainerEngine::append_image(const std::string &tag, uint64_t step, const std::string &png, int width,
                                 int height) {
  return impl_->run_log.add_image(step, tag, png, width, height);
}

bool TrainerEngine::append_log(const std::string &json_line, uint64_t step,
                               const std::vector<std::pair<std::string, float>> &scalars) {
  return impl_->run_log.append(json_line, step, scalars);
}

const std::string &TrainerEngine::error() const { return impl_->error; }

void TrainerEngine::interrupt(bool on) {
  impl_->start_cancelled = on;
  if (impl_->group) impl_->group->cancel(on);
}

bool TrainerEngine::agree_row_facts(uint32_t epoch, const std::string &mine, std::string *all) {
  auto &im = *impl_;
  std::lock_guard<std::mutex> g(im.group_use);
  if (im.world == 1) {
    *all = mine;
    return true;
  }
  if (!im.group) {
    all->clear();  // not started, or stopped
    return false;
  }
  try {
    all->clear();
    // A run that trains no more (max-steps, end of stream) needs no agreement: the source's next
    // buffer only learns that downstream is done (its peers may never get this far).
    const auto posted = im.group->exchange("row facts of epoch " + std::to_string(epoch), mine,
                                           [&im] { return im.wants_no_data.load(); });
    if (posted.empty()) *all = mine;
    for (const std::string &s : posted) *all += s;
    return true;
  } catch (const std::exception &e) {
    *all = im.group->cancelled() ? std::string() : first_line(e.what());
    return false;
  }
}

void TrainerEngine::note_row_facts(const std::string &facts) {
  auto &im = *impl_;
  std::string mine;
  {
    std::lock_guard<std::mutex> f(im.facts_mu);
    mine = im.row_facts += facts;
  }
  std::lock_guard<std::mutex> g(im.group_use);  // short: no agreement runs while a rank decodes
  if (!im.group || im.world == 1) return;
  try {
    im.group->post("row facts", mine);
  } catch (const std::exception &e) {
    std::lock_guard<std::mutex> f(im.facts_mu);
    im.row_facts_lost = first_line(e.what());  // the checkpoint then says less; training goes on
  }
}

std::string TrainerEngine::Impl::all_row_facts(bool peers) {
  std::string all;
  {
    std::lock_guard<std::mutex> f(facts_mu);
    all = row_facts;
  }
  if (!peers || !group || world == 1) return all;
  try {
    const auto posted = group->peek_all("row facts");
    for (int r = 0; r < world; r++)
      if (r != rank) all += posted[size_t(r)];
  } catch (const std::exception &) {
    // The store is gone (a peer or rank 0's host failed): this rank's own facts, as on a rescue.
  }
  // Once each: ranks that decoded the same row learn the same fact, and every rank of a resumed
  // run starts from the checkpoint's facts (so they would double with each resume).
  std::vector<RowFact> facts;
  std::string why;
  if (!parse_row_facts(all, &facts, &why)) return all;  // not ours to judge: the resumed source warns
  normalise_row_facts(&facts);
  return format_row_facts(facts);
}

void TrainerEngine::set_message_hook(std::function<void()> hook) { impl_->message_hook = std::move(hook); }

bool TrainerEngine::interrupted() const { return impl_->interrupted; }

std::vector<TrainerEngine::Message> TrainerEngine::take_messages() {
  std::vector<Message> out;
  out.swap(impl_->messages);
  return out;
}

int TrainerEngine::rank() const { return impl_->rank; }
int TrainerEngine::world_size() const { return impl_->world; }
uint64_t TrainerEngine::steps_done() const { return impl_->steps_done; }
std::string TrainerEngine::model_spec() const { return impl_->cfg.model; }
std::string TrainerEngine::device_name() const { return videotrain::device_name(impl_->device); }
std::string TrainerEngine::master_addr() const { return impl_->master_addr; }
int TrainerEngine::master_port() const { return impl_->master_port; }
double TrainerEngine::timeout_s() const { return impl_->cfg.timeout_s; }
double TrainerEngine::last_loss() const { return impl_->last_loss; }

std::shared_ptr<const ParamSnapshot> TrainerEngine::snapshot_state() const { return impl_->snapshot(false); }

std::shared_ptr<const ParamSnapshot> TrainerEngine::Impl::snapshot(bool with_ema) const {
  std::lock_guard<std::mutex> lock(state_mu);
  if (!model || (with_ema && !ema)) return nullptr;
  if (with_ema ? sliced_ema() : sliced_weights()) {
    // Only what a step's end gathered for the followers (set_snapshot_schedule); after the
    // run's export rank 0 holds the whole weights itself.
    const auto &g = gathered[with_ema ? 1 : 0];
    if (g && g->step == steps_done) return g;
    if (with_ema || !shards->materialized()) return nullptr;
  }
  std::map<std::string, at::Tensor> avg;  // the trainable parameters' EMA, in their own dtype
  if (with_ema)
    for (const auto &[n, t] : ema->tensors()) avg[n] = t;
  return copy_state(avg, false);
}

std::shared_ptr<ParamSnapshot> TrainerEngine::Impl::copy_state(const std::map<std::string, at::Tensor> &trainable,
                                                                bool fresh) const {
  auto s = std::make_shared<ParamSnapshot>();
  torch::NoGradGuard ng;
  s->step = steps_done;
  s->model = cfg.model;
  s->dims = dims;
  s->options = model_opts;
  for (auto &[n, p] : model->named_parameters()) {
    const auto it = trainable.find(n);
    s->parameters.emplace_back(
        n, it == trainable.end() ? p.detach().clone() : it->second.to(p.device(), p.scalar_type(), false, !fresh));
  }
  for (auto &[n, b] : model->named_buffers()) s->buffers.emplace_back(n, b.detach().clone());
  return s;
}

bool TrainerEngine::Impl::sliced_weights() const { return shards && shards->mode() == Sharding::full; }

std::pair<bool, bool> TrainerEngine::Impl::snapshots_wanted(uint64_t step, bool final) {
  bool raw = false, avg = false;
  std::lock_guard<std::mutex> lock(cb_mu);
  for (const auto &[id, cb] : callbacks) {
    const auto it = schedules.find(id);
    if (it == schedules.end()) {  // subscribed, its schedule not yet told: both, to be safe
      raw = avg = true;
      continue;
    }
    const auto &w = it->second;
    if (final || (step > 0 && w.every > 0 && step % w.every == 0) || (step == 0 && w.at_start))
      (w.ema ? avg : raw) = true;
  }
  return {raw && sliced_weights(), avg && sliced_ema()};
}

std::pair<bool, bool> TrainerEngine::Impl::agree_snapshots_wanted(uint64_t step, bool final) {
  auto [raw, avg] = snapshots_wanted(step, final);
  if (!group) return {raw, avg};
  auto flags = torch::tensor({raw ? 1.0 : 0.0, avg ? 1.0 : 0.0}, torch::TensorOptions().dtype(torch::kDouble));
  std::vector<at::Tensor> t{backend == "nccl" ? flags.to(device) : flags};
  group->allreduce(t, "the followers' snapshots of step " + std::to_string(step));
  flags = t[0].to(torch::kCPU);
  return {flags[0].item<double>() > 0.5, flags[1].item<double>() > 0.5};
}

void TrainerEngine::Impl::gather_snapshots(bool raw, bool with_ema) {
  // The same decision on every rank: what was gathered for this step already is not again.
  for (int k = 0; k < 2; k++)
    if (gathered[k] && gathered[k]->step == steps_done) (k ? with_ema : raw) = false;
  std::shared_ptr<const ParamSnapshot> made[2];
  auto whole = [&](const std::vector<at::Tensor> &slices) {
    std::map<std::string, at::Tensor> by_name;
    for (auto &[n, t] : shards->gather_whole(slices)) by_name[n] = t;
    return copy_state(by_name, true);
  };
  if (raw) made[0] = whole(shards->shards());
  if (with_ema) {
    std::map<std::string, at::Tensor> by_name;
    for (auto &[n, t] : gathered_ema()) by_name[n] = t;
    made[1] = copy_state(by_name, true);
  }
  std::lock_guard<std::mutex> lock(state_mu);
  for (int k = 0; k < 2; k++)
    if (made[k] || !gathered[k] || gathered[k]->step != steps_done) gathered[k] = std::move(made[k]);
}

bool TrainerEngine::has_ema() const { return impl_->ema_schedule().on(); }

std::shared_ptr<const ParamSnapshot> TrainerEngine::snapshot_ema() const { return impl_->snapshot(true); }

std::map<std::string, std::vector<float>> TrainerEngine::ema_cpu() const {
  std::map<std::string, std::vector<float>> out;
  auto &im = *impl_;
  std::lock_guard<std::mutex> lock(im.state_mu);
  if (!im.ema) return out;
  for (const auto &[n, t] : im.ema->tensors()) {
    auto c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
    out[n] = std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
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
  impl_->schedules.erase(id);
}

void TrainerEngine::set_snapshot_schedule(int id, uint64_t every, bool at_start, bool ema) {
  std::lock_guard<std::mutex> lock(impl_->cb_mu);
  if (impl_->callbacks.count(id)) impl_->schedules[id] = {every, at_start, ema};
}

bool TrainerEngine::ended(StepReport *report) const {
  std::lock_guard<std::mutex> lock(impl_->cb_mu);
  if (impl_->ended && report) *report = impl_->ended_report;
  return impl_->ended;
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
  if (im.shards && im.shards->mode() == Sharding::full) {
    std::tie(out.gathers, out.gathers_ahead) = im.shards->gather_counts();
    out.gather_dtype = im.shards->gather_dtype() == at::kBFloat16 ? "bf16" : "fp32";
  }
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
