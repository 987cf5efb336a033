/* TrainerEngine's checkpoints: the step a run writes (rank 0), the rescue of the last
 * completed step when a run stops without end of stream, and resuming (find the newest
 * checkpoint that verifies and loads, then agree on it with the peers). The files
 * themselves: checkpoint_store.h. */
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "first_line.h"
#include "models/expert_pair.h"
#include "models/param_snapshot.h"
#include "optimizer_file.h"
#include "param_shards.h"
#include "trainer_engine_impl.h"

using json = nlohmann::json;

namespace videotrain {

std::string TrainerEngine::Impl::load_checkpoint(const FoundCheckpoint &c) {
  // Local only (no collective): ranks agree on the step found afterwards.
  ModelDims d;
  d.latent_channels = cfg.latent_channels > 0 ? cfg.latent_channels : c.state.value("latent_channels", 0);
  d.text_dim = c.state.value("text_dim", 0);
  try {
    if (!model || d.latent_channels != dims.latent_channels || d.text_dim != dims.text_dim) construct_model(d);
    std::lock_guard<std::mutex> lock(state_mu);
    if (c.state.contains("sharding")) {
      load_sharded(c);
    } else {
      model->load(c.dir);
      load_optimizer(*opt, c.dir + "/optimizer.pt", device);
    }
    if (ema) {
      const std::string file = c.state.value("ema_file", std::string());
      if (!file.empty()) {
        ema->load(c.dir + "/" + file);
      } else {
        ema->reset(params);
        warn("checkpoint '" + c.dir + "' holds no EMA (its run had ema-decay=0): the EMA starts from its weights at step " +
             std::to_string(c.step));
      }
    } else if (!c.state.value("ema_file", std::string()).empty()) {
      warn("checkpoint '" + c.dir + "' holds an EMA, which this run (ema-decay=0) neither continues nor keeps");
    }
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
  if (ema)
    if (std::string bad = first_non_finite(ema->tensors()); !bad.empty()) return "its EMA holds NaN/Inf (first: " + bad + ")";
  return "";
}

std::string TrainerEngine::Impl::first_non_finite_optimizer() {
  std::lock_guard<std::mutex> lock(state_mu);
  return first_non_finite(opt->state(param_names));
}

void TrainerEngine::Impl::load_sharded(const FoundCheckpoint &c) {
  // Into the whole model and its optimizer (this run shards them afterwards, in build_model()):
  // a checkpoint of any world size and sharding resumes on any other.
  const auto &layout = c.state.at("sharding");
  const std::string kind = layout.value("optimizer", std::string("adamw"));
  if (kind != opt->kind())
    throw std::runtime_error("its optimizer state is optimizer=" + kind + "'s and this run has optimizer=" +
                             opt->kind() + " (resume with optimizer=" + kind + ", or start a new checkpoint-dir)");
  if (!opt->elementwise())
    throw std::runtime_error("optimizer=" + opt->kind() + " cannot take a sharded checkpoint's state");
  auto whole = read_sharded_checkpoint(c.dir, layout);
  torch::NoGradGuard ng;
  auto named = model->named_parameters();
  std::map<std::string, at::Tensor> by_name(named.begin(), named.end());
  for (size_t i = 0; i < params.size(); i++) {
    const auto it = whole.find(param_names[i]);
    if (it == whole.end())
      throw std::runtime_error("its shards hold no parameter " + param_names[i]);
    if (it->second.weight.sizes() != params[i].sizes())
      throw std::runtime_error("its shards hold " + param_names[i] + " in another shape");
    params[i].detach().copy_(it->second.weight);
    NamedTensors st;
    for (auto &[n, t] : it->second.state) st.emplace_back(n, t.to(params[i].device()));
    opt->set_param_state(i, st, it->second.step);
    whole.erase(it);
  }
  if (!whole.empty()) throw std::runtime_error("its shards hold " + whole.begin()->first + ", which this model does not train");
}

void TrainerEngine::Impl::find_checkpoint() {
  ResumeRun run;
  run.world = world;
  run.rank = rank;
  run.model = cfg.model;
  run.lr_schedule = cfg.lr_schedule;
  run.max_steps = cfg.max_steps;
  run.warmup_steps = cfg.warmup_steps;
  std::vector<uint64_t> clips_then;
  if (!find_resume(
          *store, run, &resume_from, &rp.epoch, &rp.clip, &rp.world_then, &clips_then,
          [this](const std::string &t) { warn(t); }, [this](const FoundCheckpoint &c) { return load_checkpoint(c); }))
    return;  // no step- folder at all: nothing was loaded
  for (uint64_t c : clips_then) rp.clips_then += (rp.clips_then.empty() ? "" : ",") + std::to_string(c);
  last_ckpt_step = resume_from.step;
  resumed = true;
  rp.step = resume_from.step;
  const auto facts = resume_from.state.find("row_facts");
  rp.row_facts = facts != resume_from.state.end() && facts->is_string() ? facts->get<std::string>() : std::string();
  {
    std::lock_guard<std::mutex> g(facts_mu);
    row_facts = rp.row_facts;  // the next checkpoint keeps them
  }
  steps_done = resume_from.step;
  // Where this rank's data resumes, until its first micro-batch says: a rank whose data ends before
  // it trains again keeps that position, not (0, 0). (Another world size: the source maps the
  // global position; the old rank's clip stands in until the first micro-batch.)
  epoch = rp.epoch;
  next_clip = rp.clip;
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
  if (rank != 0 && !shards) return;  // every rank holds the same weights; rank 0 writes
  try {
    save_checkpoint(false);
  } catch (const std::exception &e) {
    last_ckpt_step = prev_step;  // not written: a rescue may try again, the stop warning counts it lost
    // Say what is kept and what is not: a full disk must not look like a finished run.
    throw std::runtime_error("checkpoint of step " + std::to_string(steps_done) + " not written: " +
                             first_line(e.what()) + "; checkpoint-dir '" + cfg.checkpoint_dir + "' keeps " +
                             (prev_step ? "step " + std::to_string(prev_step) + " and older"
                                        : std::string("no checkpoint of this run")) +
                             (steps_done > prev_step ? ", steps " + std::to_string(prev_step + 1) + ".." +
                                                           std::to_string(steps_done) + " are not saved"
                                                     : std::string()));
  }
}

namespace {

// "(N MiB free there)" for the folder holding `path`, "" when the system does not say.
std::string free_space(const std::string &path) {
  struct statvfs v;
  const std::string dir = path.substr(0, path.find_last_of('/'));
  if (::statvfs(dir.c_str(), &v) != 0) return "";
  return " (" + std::to_string(uint64_t(v.f_bavail) * v.f_frsize / (1024 * 1024)) + " MiB free there)";
}

}  // namespace

// torch::save() writes through an archive writer that throws from its destructor when a write
// fails (a full disk: "unexpected pos ..."), which ends the process. Here the writer always sees
// success; the first failed write is kept and reported once the archive is complete.
static void write_archive(torch::serialize::OutputArchive &archive, const std::string &path);

void save_optimizer(torch::optim::Optimizer &opt, const std::string &path) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  write_archive(archive, path);
}

void save_optimizer(TrainOptimizer &opt, const std::string &path) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  write_archive(archive, path);
}

void load_optimizer(TrainOptimizer &opt, const std::string &path, const c10::Device &device) {
  torch::serialize::InputArchive archive;
  archive.load_from(path, device);
  opt.load(archive);
}

static void write_archive(torch::serialize::OutputArchive &archive, const std::string &path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create '" + path + "': " + std::strerror(errno) + free_space(path));
  int err = 0;
  archive.save_to([&](const void *data, size_t n) -> size_t {
    const char *p = static_cast<const char *>(data);
    for (size_t left = n; left > 0 && err == 0;) {
      const ssize_t w = ::write(fd, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        err = w < 0 ? errno : ENOSPC;
        break;
      }
      p += w;
      left -= size_t(w);
    }
    return n;
  });
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) throw std::runtime_error("cannot write '" + path + "': " + std::strerror(err) + free_space(path));
}

std::string TrainerEngine::Impl::save_checkpoint(bool rescue, const std::string &shards_in) {
  std::string tmp = rank == 0 ? store->begin(steps_done) : std::string();
  std::string model_file;
  if (!shards_in.empty()) {
    for (int r = 0; r < world; r++) {
      const std::string f = shard_file_name(r);
      if (::rename((shards_in + "/" + f).c_str(), (tmp + "/" + f).c_str()) != 0)
        throw std::runtime_error("cannot move '" + shards_in + "/" + f + "' into the checkpoint: " + std::strerror(errno));
    }
    ::rmdir(shards_in.c_str());
    model_file = shard_file_name(0);
  } else if (shards) {
    // Every rank writes its shard into rank 0's temporary folder; rank 0 seals it once all have.
    const std::string at = "checkpoint of step " + std::to_string(steps_done);
    if (group) tmp = group->exchange(at + " folder", tmp).at(0);
    std::string err;
    try {
      torch::serialize::OutputArchive a;
      std::lock_guard<std::mutex> lock(state_mu);
      shards->save(a, *opt);
      write_archive(a, tmp + "/" + shard_file_name(rank));
    } catch (const std::exception &e) {
      err = "rank " + std::to_string(rank) + ": " + first_line(e.what());
    }
    auto failed = torch::full({1}, err.empty() ? 0.0 : 1.0, torch::TensorOptions().dtype(torch::kDouble));
    if (group) {
      std::vector<at::Tensor> t{backend == "nccl" ? failed.to(device) : failed};
      group->allreduce(t, at + " (every rank's shard written)");
      failed = t[0].to(torch::kCPU);
    }
    if (failed.item<double>() > 0)
      throw std::runtime_error(!err.empty() ? err : "another rank could not write its shard (its error says why)");
    if (ema) {
      // Each rank averages its slices: gathered (every rank takes part) into rank 0's ema file,
      // the whole average an unsharded run writes, so that any run resumes it.
      NamedTensors whole;
      {
        std::lock_guard<std::mutex> lock(state_mu);
        whole = gathered_ema();
      }
      if (rank == 0) EmaWeights(ema->schedule(), whole).save(tmp + "/" + kEmaFile, steps_done);
    }
    if (rank != 0) return "";
    model_file = shard_file_name(0);
  } else {
    std::lock_guard<std::mutex> lock(state_mu);
    model_file = model->save(tmp);
    save_optimizer(*opt, tmp + "/optimizer.pt");
    if (ema) ema->save(tmp + "/" + kEmaFile, steps_done);  // sealed by the manifest with the others
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
                {"row_facts", all_row_facts(!rescue)},  // a rescue does not touch the store
                {"optimizer_file", shards ? model_file : std::string("optimizer.pt")},
                {"rng_note", "no generator state: each step reseeds from seed, rank and step"}};
  if (!model_opts.model_2.empty()) {  // the second expert's files are in model_2_dir/
    state["model_2"] = model_opts.model_2;
    state["model_2_dir"] = models::kExpert2Prefix;
    state["boundary_ratio"] = model_opts.boundary_ratio;
  }
  if (ema && shards_in.empty()) {  // a sharded rescue has no EMA file: gathering it is a collective
    state["ema_file"] = kEmaFile;
    state["ema_decay"] = cfg.ema_decay;
    state["ema_start_step"] = cfg.ema_start_step;
    state["ema_every"] = cfg.ema_every;
  }
  if (shards) state["sharding"] = shards->layout(opt->kind());  // shard-RRRRR.pt: param_shards.h
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
  metrics_written(run_log.append_line(rec.dump()));
  return final_dir;
}

bool TrainerEngine::Impl::rescue(const std::string &context) {
  // After every completed optimizer step every rank holds the same weights and optimizer
  // state, so rank 0 alone can write them: no collective, no barrier, no store access
  // (the peers may be dead). Sharded: every rank holds its own part (rescue_shards()).
  if (rescue_tried || finished || (rank != 0 && !shards) || !store || !model) return false;
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
    if (shards) return rescue_shards(context);
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

bool TrainerEngine::Impl::rescue_shards(const std::string &context) {
  /* No collective (a peer may be dead, the group broken): the ranks meet in a folder of the shared
   * checkpoint-dir named for the step. Each rank whose state is whole writes its shard there (renamed
   * into place once complete); rank 0 waits for every rank's within the run's timeout, then moves them
   * into a checkpoint and seals it as usual. A rank that died, or stopped at another step, leaves its
   * file missing: rank 0 gives up at the timeout and removes the folder (left-overs go with the next
   * run's cleanup of .tmp-step-* folders). */
  const std::string meet = cfg.checkpoint_dir + "/.tmp-" + step_dir_name(steps_done) + "-rescue-shards";
  const std::string mine = meet + "/" + shard_file_name(rank);
  std::error_code ec;
  std::filesystem::create_directories(meet, ec);
  {
    torch::serialize::OutputArchive a;
    std::lock_guard<std::mutex> lock(state_mu);
    shards->save(a, *opt);
    write_archive(a, mine + ".part");
  }
  if (::rename((mine + ".part").c_str(), mine.c_str()) != 0)
    throw std::runtime_error("cannot rename '" + mine + ".part': " + std::strerror(errno));
  if (rank != 0) {
    warn("wrote this rank's shard of a rescue checkpoint of step " + std::to_string(steps_done) + " (" + context +
         "); rank 0 seals it once every rank's shard is there");
    return true;
  }
  const double deadline = now_s() + cfg.timeout_s;
  int missing = 0;
  for (;;) {
    missing = -1;
    for (int r = world - 1; r >= 0; r--)
      if (!std::filesystem::exists(meet + "/" + shard_file_name(r), ec)) missing = r;
    if (missing < 0 || now_s() >= deadline) break;
    ::usleep(50 * 1000);
  }
  if (missing >= 0) {
    std::filesystem::remove_all(meet, ec);
    rescue_why = "sharding=" + std::string(sharding_name(cfg.sharding)) + ": rank " + std::to_string(missing) +
                 " wrote no shard of step " + std::to_string(steps_done) + " within the timeout (" +
                 std::to_string(static_cast<int>(cfg.timeout_s)) + " s): it died, or stopped at another step";
    return false;
  }
  const std::string dir = save_checkpoint(true, meet);
  last_ckpt_step = steps_done;
  warn("wrote a rescue checkpoint of step " + std::to_string(steps_done) + " to " + dir + " (" + context +
       "; every rank's shard" + (ema ? ", without the EMA, which a resume starts again from the weights" : "") + ")");
  return true;
}

std::string TrainerEngine::Impl::all_skipped_text() const {
  return "all " + std::to_string(steps_run) +
         " optimizer steps of this run had a non-finite loss or gradient and were skipped: nothing was trained, "
         "no checkpoint written (check the input and lr)";
}

void TrainerEngine::Impl::export_model() {
  if (shards && exported_step != steps_done) {
    // The run is over: its optimizer state goes, and sharding=full's blocks are gathered on rank 0
    // (every rank takes part), which writes them.
    std::lock_guard<std::mutex> lock(state_mu);
    shards->materialize_on(0);
    params = shards->shards();
    opt = make_optimizer(optim, params);
    if (cfg.export_ema && ema) whole_ema = std::make_unique<EmaWeights>(ema->schedule(), gathered_ema());
  }
  if (rank != 0 || exported_step == steps_done) return;
  std::string dir = cfg.export_dir;
  if (dir.empty() && !cfg.checkpoint_dir.empty()) dir = cfg.checkpoint_dir + "/" + model->export_name();
  if (dir.empty()) return;
  bool written;
  {
    std::lock_guard<std::mutex> lock(state_mu);
    written = model->export_folder(dir, cfg.save_dtype);
  }
  if (!written) return;  // TorchScript and built-in models have their checkpoints alone
  exported_step = steps_done;
  // A LoRA's files keep the adapter's own float32 (save-dtype is the full model's).
  const std::string dtype = model->export_name() == "lora" ? std::string("fp32") : cfg.save_dtype;
  auto report = [&](const std::string &path, bool is_ema) {
    Message m("ddptrainsink-export");
    m.set_uint64("step", steps_done).set_string("path", path).set_string("dtype", dtype);
    if (is_ema) m.set_bool("ema", true);
    messages.push_back(m);
    json rec{{"type", "export"}, {"step", steps_done}, {"path", path}};
    if (is_ema) rec["ema"] = true;
    metrics_written(run_log.append_line(rec.dump()));
  };
  report(dir, false);
  if (!cfg.export_ema || !ema) return;
  // Beside the raw weights: transformer_ema/ or lora_ema/ (export-dir + "_ema"), through the model's
  // own writer with the average put in place of the trainable parameters for the time of the write.
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string ema_dir = dir + "_ema";
  {
    std::lock_guard<std::mutex> lock(state_mu);
    // A sharded run's average, gathered above, goes into the model's parameters of its names.
    std::vector<at::Tensor> into = params;
    if (whole_ema) {
      std::map<std::string, at::Tensor> by_name;
      for (auto &[n, p] : model->named_parameters()) by_name[n] = p;
      into.clear();
      for (const auto &[n, t] : whole_ema->tensors()) into.push_back(by_name.at(n));
    }
    EmaWeights::Applied applied(whole_ema ? *whole_ema : *ema, into);
    model->export_folder(ema_dir, cfg.save_dtype);
  }
  whole_ema.reset();
  report(ema_dir, true);
}

}  // namespace videotrain
