/* TrainerEngine's start: resolving rank, world, device, precision and backend from the
 * properties and the environment, the rendezvous, resuming, and building the model
 * (on every rank from rank 0's weights). See trainer_engine.h. */
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <mutex>

#include "cpu_heap.h"
#include "default_rng.h"
#include "device_dtype.h"
#include "dist_env.h"
#include "models/expert_pair.h"
#include "models/flow_timesteps.h"
#include "first_line.h"
#include "models/layers.h"
#include "models/native_model.h"
#include "trainer_engine_impl.h"

namespace fs = std::filesystem;

namespace videotrain {

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
  if (!resolve_torch_device(cfg.device, local_rank, &device, &device_error)) return fail(device_error);
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
  if (cfg.gather_dtype != "auto" && cfg.gather_dtype != "fp32" && cfg.gather_dtype != "bf16")
    return fail("gather-dtype '" + cfg.gather_dtype + "' is not one of auto, fp32, bf16 (property gather-dtype)");
  if (cfg.gather_prefetch != "auto" && cfg.gather_prefetch != "true" && cfg.gather_prefetch != "false")
    return fail("gather-prefetch '" + cfg.gather_prefetch + "' is not one of auto, true, false (property gather-prefetch)");
  if (!parse_lr_schedule(cfg.lr_schedule, &lr_params.schedule))
    return fail("lr-schedule '" + cfg.lr_schedule + "' is not one of constant, cosine, linear");
  lr_params.base = cfg.lr;
  lr_params.warmup_steps = cfg.warmup_steps;
  lr_params.max_steps = cfg.max_steps;
  optim.kind = cfg.optimizer;
  optim.lr = cfg.lr;
  optim.weight_decay = cfg.weight_decay;
  optim.beta1 = cfg.beta1;
  optim.beta2 = cfg.beta2;
  optim.eps = cfg.eps;
  optim.x = cfg.optim;
  if (std::string why = resolve_optimizer_settings(&optim); !why.empty()) return fail(why);
  if (cfg.sharding != Sharding::none) {
    const std::string what = std::string("sharding=") + sharding_name(cfg.sharding);
    if (optim.kind != "adamw" && optim.kind != "sgd")
      return fail(what + " needs optimizer=adamw or sgd, whose state is per element (each rank owns a slice of "
                  "it); optimizer=" + optim.kind + " keeps state over whole tensors (use sharding=none)");
    if (!cfg.native.model_2.empty()) return fail(what + " with model-2 (two experts in one run) is not built yet");
  }
  if (cfg.nan_policy != "skip" && cfg.nan_policy != "fail")
    return fail("nan-policy '" + cfg.nan_policy + "' is not one of skip, fail");
  if (cfg.model.empty())
    return fail("no model: set the model property (a diffusers transformer folder, a TorchScript file or builtin:NAME)");
  if (!is_builtin_spec(cfg.model) && !is_model_folder(cfg.model)) {
    std::error_code ec;
    if (fs::is_directory(cfg.model, ec))
      return fail("model folder '" + cfg.model + "' has no config.json (property model: point it at a diffusers "
                  "transformer folder, e.g. Wan2.1-T2V-1.3B-Diffusers/transformer)");
    if (!fs::is_regular_file(cfg.model, ec))
      return fail("model file '" + cfg.model + "' does not exist or is not a file (property model)");
  }
  if (std::string why = resolve_model_options(); !why.empty()) return fail(why);
  if (cfg.resume && cfg.checkpoint_dir.empty()) return fail("resume=true needs checkpoint-dir");
  if (std::string why = ema_schedule().check(); !why.empty()) return fail(why);
  if (cfg.export_ema && !ema_schedule().on())
    return fail("export-ema=true needs an EMA to export: set ema-decay (e.g. 0.999)");
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

std::string TrainerEngine::Impl::resolve_model_options() {
  model_opts = cfg.native;
  ModelOptions &o = model_opts;
  o.seed = cfg.seed;
  if (std::string why = models::check_timestep_options(o); !why.empty()) return why;
  if (is_model_folder(cfg.model))
    if (std::string why = models::attention_backend_unavailable(o.attention_backend, device, bf16); !why.empty())
      return why + " (model " + cfg.model + ")";
  if (is_model_folder(cfg.model))
    if (std::string why = models::check_family_timestep_options(model_folder_class(cfg.model), o); !why.empty())
      return why + " (model " + cfg.model + ")";
  double lo = 0, hi = 0;
  char tail = 0;
  if (std::sscanf(cfg.timestep_range.c_str(), "%lf , %lf %c", &lo, &hi, &tail) != 2 || !(lo >= 0 && lo < hi && hi <= 1000))
    return "timestep-range '" + cfg.timestep_range + "' is not LO,HI with 0 <= LO < HI <= 1000 (e.g. 875,1000)";
  o.timestep_lo = lo;
  o.timestep_hi = hi;
  o.val_sigmas.clear();
  std::stringstream vs(cfg.val_sigmas);
  for (std::string item; std::getline(vs, item, ',');) {
    char *end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    while (end && *end == ' ') end++;
    if (item.empty() || !end || *end || !(v > 0 && v <= 1))
      return "val-sigmas '" + cfg.val_sigmas + "' is not a comma list of numbers in (0, 1]";
    o.val_sigmas.push_back(v);
  }
  if (o.val_sigmas.empty()) return "val-sigmas is empty: give at least one sigma in (0, 1]";
  if (o.lora() && !o.trainable.empty())
    return "lora-rank/lora-init and trainable are exclusive: a LoRA trains its own tensors, trainable picks base "
           "parameters";
  if ((o.lora() || !o.trainable.empty()) && !is_model_folder(cfg.model))
    return "lora-rank, lora-init and trainable apply to a diffusers transformer folder (property model), not to " +
           cfg.model;
  if (!o.model_2.empty()) {  // Wan 2.2 A14B: both experts in this model (expert_pair.h)
    if (!is_model_folder(cfg.model) || !is_model_folder(o.model_2))
      return "model-2 '" + o.model_2 + "' needs model= and model-2= to be diffusers transformer folders (Wan 2.2 "
             "A14B's transformer and transformer_2)";
    if (lo != 0 || hi != 1000)
      return "timestep-range '" + cfg.timestep_range + "' with model-2: the boundary splits the range between the "
             "experts (unset timestep-range, or train one expert alone without model-2)";
    if (!o.lora_init.empty()) return "lora-init with model-2: one LoRA file cannot continue two experts";
    if (o.boundary_ratio == 0) {
      std::string why;
      o.boundary_ratio = models::pipeline_boundary_ratio(cfg.model, &why);
      if (o.boundary_ratio == 0) return "model-2: " + why + ": set boundary-ratio (0.875 for Wan2.2-T2V-A14B, 0.9 for I2V)";
    }
  } else if (o.boundary_ratio != 0) {
    return "boundary-ratio without model-2: set model-2 to the low-noise expert's folder (transformer_2)";
  }
  if (!o.lora_init.empty() && !fs::is_regular_file(o.lora_init))
    return "lora-init '" + o.lora_init + "' does not exist or is not a file";
  if (o.lora_targets.empty()) return "lora-targets is empty";
  if (o.base_dtype != "bf16" && o.base_dtype != "fp8") return "base-dtype '" + o.base_dtype + "' is not one of bf16, fp8";
  if (o.base_dtype == "fp8") {
    if (!o.lora())
      return "base-dtype=fp8 stores a LoRA run's frozen base: set lora-rank (or lora-init), or base-dtype=bf16 for a "
             "full or partial fine-tune";
    if (std::string why = models::fp8_unavailable(); !why.empty()) return why;
  }
  if (cfg.save_dtype != "bf16" && cfg.save_dtype != "fp16" && cfg.save_dtype != "fp32")
    return "save-dtype '" + cfg.save_dtype + "' is not one of bf16, fp16, fp32";
  return "";
}

void TrainerEngine::Impl::construct_model(const ModelDims &d) {
  dims = d;
  std::unique_lock<std::mutex> rng(default_rng_mutex());  // see default_rng.h
  torch::manual_seed(cfg.seed);  // the same initial weights on every rank (and broadcast anyway)
  auto m = make_model(cfg.model, d, device, model_opts);
  rng.unlock();
  std::vector<at::Tensor> ps;
  std::vector<std::string> names;
  for (auto &[name, p] : m->named_parameters())
    if (p.requires_grad()) {
      ps.push_back(p);
      names.push_back(name);
    }
  if (ps.empty()) throw std::runtime_error("model " + cfg.model + " has no trainable parameters");
  std::lock_guard<std::mutex> lock(state_mu);
  model = std::move(m);
  params = ps;
  param_names = names;
  opt = make_optimizer(optim, params);
  ema.reset();
  if (ema_schedule().on()) {
    NamedTensors named;
    for (size_t i = 0; i < params.size(); i++) named.emplace_back(param_names[i], params[i]);
    ema = std::make_unique<EmaWeights>(ema_schedule(), named);
  }
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
    if (ema && !resumed) {  // the average starts from rank 0's weights too
      std::lock_guard<std::mutex> lock(state_mu);
      ema->reset(params);
    }
    if (cfg.sharding == Sharding::none) reducer = std::make_unique<BucketReducer>(params, group.get(), cfg.bucket_cap_mb, 1.0);
  }
  if (cfg.sharding != Sharding::none && !shards) shard_model();
  if (shards && steps_done == 0) {
    // at-start: the whole copies for the followers subscribed by now (agreed: every rank gathers).
    const auto [raw, avg] = agree_snapshots_wanted(0, false);
    gather_snapshots(raw, avg);
  }
  // ddpvalsink's at-start needs these weights; builtin models only exist from here.
  StepReport built;
  built.step = steps_done;
  built.model_built = true;
  notify(built);
}

void TrainerEngine::Impl::shard_model() {
  std::vector<int> block_of(params.size(), -1);
  models::DitModel *dit = model->dit();
  if (dit) {
    const std::string prefix = dit->block_prefix();
    for (size_t i = 0; i < params.size(); i++)
      if (param_names[i].rfind(prefix, 0) == 0) block_of[i] = std::atoi(param_names[i].c_str() + prefix.size());
    if (cfg.sharding == Sharding::full && dit->checkpointing() == Checkpointing::none) {
      // Gathered weights are freed after each block's forward, so backward must recompute it.
      dit->set_checkpointing(Checkpointing::full);
      model_opts.gradient_checkpointing = Checkpointing::full;
      warn("sharding=full recomputes each block in backward: gradient-checkpointing=true is used (set it, or "
           "selective, to say so)");
    }
  }
  std::lock_guard<std::mutex> lock(state_mu);
  auto whole_opt = std::move(opt);
  shards = std::make_unique<ParamShards>(cfg.sharding, params, param_names, block_of, group.get(), rank, world);
  opt = make_optimizer(optim, shards->shards());
  // The state a resume loaded into the whole model's optimizer, cut into this rank's shards.
  std::map<std::string, ParamState> state;
  for (size_t i = 0; i < params.size(); i++) {
    ParamState ps;
    for (auto &[n, t] : whole_opt->param_state(i, &ps.step)) ps.state[n] = t;
    if (!ps.state.empty()) state[param_names[i]] = std::move(ps);
  }
  if (!state.empty()) shards->load(state, *opt);
  whole_opt.reset();
  params = shards->shards();
  param_names = shards->shard_names();
  if (ema) {
    // Each rank averages the slices it holds (the update is elementwise): its part of the whole
    // EMA, which a resume loaded or rank 0's weights started.
    std::map<std::string, at::Tensor> whole;
    for (const auto &[n, t] : ema->tensors()) whole[n] = t;
    const auto slices = shards->cut_named(whole);
    NamedTensors named;
    for (size_t k = 0; k < slices.size(); k++) named.emplace_back(param_names[k], slices[k]);
    ema = std::make_unique<EmaWeights>(ema_schedule(), named);
  }
  // auto: the dtype the blocks compute in (autocast casts their float32 weights to bf16 anyway).
  const bool bf16_gathers = cfg.gather_dtype == "bf16" || (cfg.gather_dtype == "auto" && bf16);
  // Prefetch where the gather overlaps compute (NCCL's stream); on CPUs the memory of one block more
  // buys little (Gloo's threads share the cores).
  const bool prefetch = cfg.gather_prefetch == "true" || (cfg.gather_prefetch == "auto" && device.is_cuda());
  shards->set_gather(bf16_gathers ? at::kBFloat16 : at::kFloat, bf16, prefetch);
  if (dit) dit->set_block_hooks(shards.get());
}

bool TrainerEngine::start() {
  auto &im = *impl_;
  if (!im.resolve()) return false;
  if (!im.cfg.checkpoint_dir.empty()) {
    // Now, not at the first checkpoint hours later; before the rendezvous, so that with
    // a shared folder every rank fails at once.
    im.store = std::make_unique<CheckpointStore>(im.cfg.checkpoint_dir);
    std::string why;
    if (!im.store->prepare(&why)) return im.fail(why + " (property checkpoint-dir)");
    // Rank 0 writes the checkpoints: it holds the folder for the run.
    std::string warning;
    if (im.rank == 0 && !im.store->lock(&why, &warning)) return im.fail(why + " (property checkpoint-dir)");
    if (!warning.empty()) im.warn(warning);
  }
  // Like checkpoint-dir: a run that cannot keep the records it was asked for fails at once.
  if (std::string w = im.run_log.open(im.rank, im.cfg.metrics_file); !w.empty())
    return im.fail(w + " (property metrics-file)");
  try {
    if (im.world > 1) {
      DistOptions o;
      o.rank = im.rank;
      o.world_size = im.world;
      o.master_addr = im.master_addr;
      o.master_port = im.master_port;
      o.backend = im.backend;
      o.timeout = std::chrono::milliseconds(static_cast<int64_t>(im.cfg.timeout_s * 1000));
      o.on_waiting = [&im](const std::string &text) {
        im.warn(text);
        if (im.message_hook) im.message_hook();
      };
      o.cancelled = [&im] { return im.start_cancelled.load(); };
      im.group = std::make_unique<DistGroup>(o);
      DistGroup *g = im.group.get();
      im.agreement = std::make_unique<StepAgreement>(*g, im.cfg.timeout_s, [g] { return g->cancelled(); });
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

}  // namespace videotrain
