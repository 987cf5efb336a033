/* The training-step mode that wan-bench and cogvideox-bench share: our native transformer against
 * diffusers' own class (bench/dit_diffusers_peer.py) at any depth and latent size, on CPU or CUDA,
 * fp32 or bf16 autocast, full fine-tune (fp32 master weights) or LoRA over a frozen base (bf16 under
 * bf16 autocast), with or without gradient checkpointing.
 *
 * The bench process writes one folder (config.json + weights, bf16 unless --save-dtype says
 * otherwise) and one inputs file; each side then runs in a process of its own (so that peak RSS
 * and CUDA memory are each side's alone) over the same weights and inputs: `BENCH --side ours`
 * and `PYTHON bench/dit_diffusers_peer.py`. Each prints one JSON line; the bench prints them, the
 * model flop count it uses (the accounting spelled out), MFU and the ratios peer/ours.
 * Torch TUs only. */
#pragma once

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "autocast_guard.h"
#include "bench_util.h"
#include "cpu_heap.h"
#include "models/layers.h"
#include "models/lora.h"
#include "models/native_model.h"
#include "models/weights_io.h"
#include "safetensors.h"

#ifdef VIDEOTRAIN_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace ditstep {

struct Options {
  bool active = false;          // a step-mode flag was given
  std::string side;             // "ours": the child that times our side
  std::string peer = "plain";   // plain (the old CPU comparison) | diffusers | none
  std::string device = "cpu", dtype = "float32", checkpointing = "none", optimizer = "none";
  std::string attention = "auto";  // our side's attention-backend (the peer runs diffusers' SDPA as it does)
  std::string weights;          // an existing transformer folder (its config wins over --layers)
  std::string workdir, folder, inputs, save_dtype = "bf16";
  int layers = 2, lora = 0, warmup = 1, steps = 3, rounds = 1, threads = 0;
  double peak_tflops = 989;     // H100 SXM dense bf16
  bool keep = false;
  bool flops_only = false;      // print the setup and the flop accounting, run nothing
};

// Takes argv[i] (and its value) when it is a step-mode flag; `dims` are the bench's latent sizes
// (--latent-frames/-height/-width are the bench's --frames/--height/--width by another name).
inline bool parse_flag(int argc, char **argv, int &i, Options &o, int64_t *frames, int64_t *height, int64_t *width,
                       int64_t *text) {
  const std::string a = argv[i];
  auto val = [&]() -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
    return argv[++i];
  };
  auto num = [&]() { return std::atoll(val().c_str()); };
  if (a == "--latent-frames") *frames = num();
  else if (a == "--latent-height") *height = num();
  else if (a == "--latent-width") *width = num();
  else if (a == "--text" && text) *text = num();
  else if (a == "--side") o.side = val();
  else if (a == "--peer") o.peer = val();
  else if (a == "--device") o.device = val();
  else if (a == "--dtype") o.dtype = val();
  else if (a == "--layers") o.layers = static_cast<int>(num());
  else if (a == "--lora") o.lora = static_cast<int>(num());
  else if (a == "--warmup") o.warmup = static_cast<int>(num());
  else if (a == "--steps") o.steps = static_cast<int>(num());
  else if (a == "--optimizer") o.optimizer = val();
  else if (a == "--attention-backend") o.attention = val();
  else if (a == "--weights") o.weights = val();
  else if (a == "--workdir") o.workdir = val();
  else if (a == "--folder") o.folder = val();
  else if (a == "--inputs") o.inputs = val();
  else if (a == "--save-dtype") o.save_dtype = val();
  else if (a == "--peak-tflops") o.peak_tflops = std::atof(val().c_str());
  else if (a == "--keep") o.keep = true;
  else if (a == "--flops-only") o.flops_only = true;
  else return false;
  // Only these select the step mode; --latent-* alone keep the old comparison.
  if (a != "--latent-frames" && a != "--latent-height" && a != "--latent-width" && a != "--text") o.active = true;
  return true;
}

// Everything a step mode run needs to know, checked once: a clear error rather than a crash.
inline std::string check(const Options &o) {
  if (o.peer != "plain" && o.peer != "diffusers" && o.peer != "none")
    return "--peer '" + o.peer + "' is not one of plain, diffusers, none";
  if (o.dtype != "float32" && o.dtype != "bfloat16") return "--dtype '" + o.dtype + "' is not one of float32, bfloat16";
  if (o.checkpointing != "none" && o.checkpointing != "full" && o.checkpointing != "selective")
    return "--checkpointing '" + o.checkpointing + "' is not one of none, full, selective";
  videotrain::AttentionBackend backend;
  if (!videotrain::parse_attention_backend(o.attention, &backend))
    return "--attention-backend '" + o.attention + "' is not one of auto, flash, cudnn, efficient, math";
  if (o.optimizer != "none" && o.optimizer != "adamw") return "--optimizer '" + o.optimizer + "' is not one of none, adamw";
  if (o.layers < 1) return "--layers must be at least 1";
  if (o.lora < 0) return "--lora must be a rank >= 0";
  if (o.steps < 1 || o.warmup < 0) return "--steps must be >= 1 and --warmup >= 0";
  if (o.device != "cpu" && o.device.rfind("cuda", 0) != 0) return "--device '" + o.device + "' is not cpu or cuda:N";
#ifndef VIDEOTRAIN_HAVE_CUDA
  if (o.device != "cpu") return "--device " + o.device + ": this build has no CUDA (VIDEOTRAIN_HAVE_CUDA unset)";
#endif
  return "";
}

// What differs between the families.
struct Family {
  std::string name;                                           // "wan-bench"
  std::function<std::string(int layers)> config;              // config.json text of the bench's model
  // The inputs in diffusers' layout (hidden_states, timestep, encoder_hidden_states) and `target`,
  // shaped for the latent sizes, from `config` (a folder's config.json).
  std::function<std::map<std::string, at::Tensor>(const nlohmann::json &config)> inputs;
  // Forward flops of one sample, by part, with how each was counted.
  std::function<std::vector<std::pair<std::string, double>>(const nlohmann::json &config)> flops;
  std::function<std::string(const nlohmann::json &config)> tokens;  // "32760 video + 512 text"
};

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline void sync(const c10::Device &dev) {
  if (dev.is_cuda()) torch::cuda::synchronize(dev.index());
}

// The side's peak memory, MiB: the CUDA caching allocator's peak allocated bytes since the reset,
// or the process's peak RSS on CPU.
inline double peak_mem_mb(const c10::Device &dev) {
#ifdef VIDEOTRAIN_HAVE_CUDA
  if (dev.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index()).allocated_bytes[0].peak / 1048576.0;
#endif
  return benchutil::peak_rss_mb();
}

inline void reset_peak(const c10::Device &dev) {
#ifdef VIDEOTRAIN_HAVE_CUDA
  if (dev.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(dev.index());
#endif
  (void)dev;
}

// LoRA of `rank` (alpha = rank, scale 1) on every Linear named ...to_q, to_k, to_v, to_out.0 (self-
// and cross-attention), as ddptrainsink's default lora-targets and PEFT's suffix match.
inline void attach_lora(torch::nn::Module &m, int rank) {
  static const char *kTargets[] = {"to_q", "to_k", "to_v", "to_out.0"};
  for (auto &[name, l] : videotrain::models::linear_modules(m))
    for (const char *t : kTargets) {
      const std::string s = std::string(".") + t;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) l->add_lora(rank, 1.0);
    }
}

// The child: our model from the folder, the inputs from the file, warm-ups then timed steps.
inline int run_ours(const Options &o) {
  using namespace videotrain;
  const c10::Device dev(o.device);
  if (o.threads > 0) at::set_num_threads(o.threads);
  if (dev.is_cpu()) retain_cpu_heap();  // as ddptrainsink on CPU
  const bool bf16 = o.dtype == "bfloat16";
  auto m = models::open_dit(o.folder, dev);  // float32: the full fine-tune's master weights
  std::vector<at::Tensor> params;
  if (o.lora > 0) {
    for (auto &p : m->module().parameters()) p.set_requires_grad(false);
    if (bf16) {  // the frozen base in bf16, the LoRA tensors float32
      m->module().to(torch::kBFloat16);
      // What diffusers' from_pretrained(torch_dtype=bf16) keeps float32 (the class's
      // _keep_in_fp32_modules: Wan's time embedder, modulation tables and norms).
      std::vector<std::string> keep;
      if (m->family() == "wan") keep = {"time_embedder", "scale_shift_table", "norm1", "norm2", "norm3"};
      torch::NoGradGuard ng;
      for (auto &p : m->module().named_parameters(true)) {
        const std::string dotted = "." + p.key() + ".";
        for (const auto &k : keep)
          if (dotted.find("." + k + ".") != std::string::npos) p.value().set_data(p.value().to(torch::kFloat));
      }
    }
    attach_lora(m->module(), o.lora);
    for (auto &[n, t] : models::lora_parameters(m->module())) params.push_back(t);
  } else {
    params = m->module().parameters();
  }
  m->set_checkpointing(o.checkpointing == "selective" ? videotrain::Checkpointing::selective
                       : o.checkpointing == "full"    ? videotrain::Checkpointing::full
                                                      : videotrain::Checkpointing::none);
  videotrain::AttentionBackend backend = videotrain::AttentionBackend::automatic;
  videotrain::parse_attention_backend(o.attention, &backend);
  if (std::string why = models::attention_backend_unavailable(backend, c10::Device(o.device), o.dtype == "bfloat16");
      !why.empty())
    throw std::runtime_error(why);
  m->set_attention_backend(backend);
  m->module().train(true);
  std::string err;
  auto file = SafetensorsFile::open(o.inputs, &err);
  if (!file) throw std::runtime_error(err);
  std::map<std::string, at::Tensor> in;
  for (const char *k : {"hidden_states", "timestep", "encoder_hidden_states", "target"}) {
    const auto *e = file->find(k);
    if (!e) throw std::runtime_error(o.inputs + " has no tensor '" + k + "'");
    in[k] = models::tensor_of(*e).to(dev);
    const auto md = file->metadata().find(std::string(k) + "_dtype");
    if (md != file->metadata().end() && md->second == "int64") in[k] = in[k].to(torch::kLong);
  }
  std::unique_ptr<torch::optim::AdamW> opt;
  if (o.optimizer == "adamw") opt = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-5));
  int64_t trained = 0;
  for (auto &p : params) trained += p.numel();
  sync(dev);
  reset_peak(dev);
  std::vector<double> times;
  double first_loss = 0;
  for (int s = 0; s < o.warmup + o.steps; s++) {
    const double t0 = now_s();
    at::Tensor pred;
    {
      AutocastGuard cast(bf16, dev.is_cuda());
      pred = m->forward(in["hidden_states"], in["timestep"], in["encoder_hidden_states"]);
    }
    auto loss = torch::mse_loss(pred.to(torch::kFloat), in["target"]);
    loss.backward();
    if (opt) opt->step();
    for (auto &p : params) p.mutable_grad() = at::Tensor();
    sync(dev);
    if (s == 0) first_loss = loss.item<double>();
    if (s >= o.warmup) times.push_back(now_s() - t0);
  }
  std::sort(times.begin(), times.end());
  nlohmann::json r;
  r["side"] = "ours";
  r["impl"] = std::string("native LibTorch ") + TORCH_VERSION;
  r["lora_impl"] = o.lora > 0 ? "native (layers.h add_lora)" : "";
  r["seconds"] = times;
  r["median_s"] = times[times.size() / 2];
  r["peak_mem_mb"] = peak_mem_mb(dev);
  r["memory"] = dev.is_cuda() ? "peak CUDA allocated" : "peak RSS";
  r["first_loss"] = first_loss;
  r["trained_parameters"] = trained;
  r["threads"] = at::get_num_threads();
  std::printf("%s\n", r.dump().c_str());
  return 0;
}

inline std::string shell_quote(const std::string &s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The JSON line a side printed (its last line starting with '{'); throws with the output when none.
inline nlohmann::json side_result(const std::string &cmd) {
  int rc = 0;
  const std::string out = benchutil::run(cmd + " 2>&1", &rc);
  std::istringstream ss(out);
  nlohmann::json r;
  for (std::string line; std::getline(ss, line);)
    if (!line.empty() && line[0] == '{') {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("median_s")) r = j;
    }
  if (r.is_null()) throw std::runtime_error("no result from: " + cmd + "\n" + out);
  return r;
}

// The parent: folder and inputs, each side in its own process, the report.
inline int run_driver(const Options &o0, const Family &fam, const std::string &self) {
  using namespace videotrain;
  Options o = o0;
  namespace fs = std::filesystem;
  bool made_workdir = false;
  if (o.workdir.empty()) {
    const char *tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp ? tmp : "/tmp") + "/" + fam.name + "-XXXXXX";
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("cannot make a folder under " + tmpl);
    o.workdir = tmpl;
    made_workdir = true;
  }
  fs::create_directories(o.workdir);
  const double t_setup = now_s();
  torch::manual_seed(0);
  std::string config_text;
  if (!o.weights.empty()) {
    o.folder = o.weights;
    std::ifstream f(o.folder + "/config.json");
    if (!f) throw std::runtime_error("--weights '" + o.folder + "' has no config.json");
    config_text.assign(std::istreambuf_iterator<char>(f), {});
  } else if (o.flops_only) {
    config_text = fam.config(o.layers);
  } else {
    o.folder = o.workdir + "/transformer";
    at::ScalarType st;
    if (!models::parse_save_dtype(o.save_dtype, &st)) throw std::runtime_error("--save-dtype '" + o.save_dtype + "' is not bf16, fp16 or fp32");
    auto m = models::build_dit(fam.config(o.layers), torch::kCPU);
    m->save(o.folder, st, uint64_t(5) << 30);
    config_text = m->config_json();
  }
  const auto cfg = nlohmann::json::parse(config_text, nullptr, false);
  if (!cfg.is_object()) throw std::runtime_error(o.folder + "/config.json is not a JSON object");
  o.inputs = o.workdir + "/inputs.safetensors";
  if (!o.flops_only) {
    std::vector<SafetensorsOutTensor> ts;
    std::map<std::string, std::string> meta;
    for (auto &[k, t] : fam.inputs(cfg)) {
      // Stored float32; the integer timestep (CogVideoX's) is cast back by each side.
      if (t.scalar_type() == torch::kLong) meta[k + "_dtype"] = "int64";
      ts.push_back(models::out_tensor(k, t.to(torch::kFloat)));
    }
    std::string err;
    if (!write_safetensors(o.inputs, ts, meta, &err)) throw std::runtime_error(err);
  }
  std::printf("%s: %s, %d layers (%s), tokens %s, device %s, dtype %s, %s, checkpointing %s, optimizer %s; "
              "%d warm-up + %d timed steps per side (setup %.1f s, folder %s)\n",
              fam.name.c_str(), cfg.value("_class_name", std::string("?")).c_str(), cfg.value("num_layers", 0),
              !o.weights.empty() ? "--weights" : o.flops_only ? "config only" : ("random weights saved " + o.save_dtype).c_str(),
              fam.tokens(cfg).c_str(), o.device.c_str(), o.dtype.c_str(),
              o.lora > 0 ? ("LoRA rank " + std::to_string(o.lora) + " on to_q/to_k/to_v/to_out.0, base frozen" +
                            (o.dtype == "bfloat16" ? " in bf16" : "")).c_str()
                         : (std::string("full fine-tune") + (o.dtype == "bfloat16" ? " (fp32 master weights, bf16 autocast)" : "")).c_str(),
              o.checkpointing.c_str(), o.optimizer.c_str(), o.warmup, o.steps, now_s() - t_setup, o.folder.c_str());
  std::fflush(stdout);
  std::string common = " --device " + o.device + " --dtype " + o.dtype + " --lora " + std::to_string(o.lora) +
                       " --checkpointing " + o.checkpointing + " --optimizer " + o.optimizer + " --warmup " +
                       std::to_string(o.warmup) + " --steps " + std::to_string(o.steps) + " --folder " +
                       shell_quote(o.folder) + " --inputs " + shell_quote(o.inputs);
  if (o.threads > 0) common += " --threads " + std::to_string(o.threads);
  const std::string ours_cmd = shell_quote(self) + " --side ours" + common + " --attention-backend " + o.attention;
  // diffusers has whole-block checkpointing only: against our selective mode it runs full (the
  // comparison users make when they choose a trainer).
  std::string peer_common = common;
  if (o.checkpointing == "selective") {
    peer_common.replace(peer_common.find(" --checkpointing selective"), 26, " --checkpointing full");
    std::printf("checkpointing: ours selective, diffusers full (it has no selective mode)\n");
  }
  const std::string peer_cmd = benchutil::peer_command("dit_diffusers_peer.py") + peer_common;
  const bool peer = o.peer == "diffusers";
  // Model flops: forward by part, step = 3 x forward (backward = 2 x forward: input and weight
  // gradients); checkpointing's recomputation is not counted (model flops, not hardware flops).
  const auto parts = fam.flops(cfg);
  double fwd = 0;
  for (auto &[k, v] : parts) fwd += v;
  const double step_flops = 3 * fwd;
  std::printf("model flops per sample, forward %.4g TFLOP:", fwd / 1e12);
  for (auto &[k, v] : parts) std::printf(" %s %.4g;", k.c_str(), v / 1e12);
  std::printf(" step = 3 x forward = %.4g TFLOP; MFU = step flops / median step time / %.0f TFLOP/s (--peak-tflops)\n",
              step_flops / 1e12, o.peak_tflops);
  std::vector<double> ratios;
  for (int round = 0; round < (o.flops_only ? 0 : o.rounds); round++) {
    nlohmann::json a, b;
    const bool peer_first = round % 2 == 1;
    if (peer && peer_first) b = side_result(peer_cmd);
    a = side_result(ours_cmd);
    if (peer && !peer_first) b = side_result(peer_cmd);
    auto line = [&](const char *who, const nlohmann::json &r) {
      const double s = r["median_s"].get<double>();
      std::printf("  %-9s %-40s median step %.3f s, %s %.0f MiB, MFU %.3g%%, first loss %.6g, trained %lld%s%s\n", who,
                  r.value("impl", std::string()).c_str(), s, r.value("memory", std::string()).c_str(),
                  r["peak_mem_mb"].get<double>(), 100.0 * step_flops / s / (o.peak_tflops * 1e12),
                  r["first_loss"].get<double>(), (long long)r["trained_parameters"].get<int64_t>(),
                  r.value("lora_impl", std::string()).empty() ? "" : ", LoRA: ",
                  r.value("lora_impl", std::string()).c_str());
    };
    std::printf("round %d:\n", round + 1);
    line("ours", a);
    if (peer) {
      line("diffusers", b);
      const double rt = b["median_s"].get<double>() / a["median_s"].get<double>();
      ratios.push_back(rt);
      std::printf("  peer/ours: time %.3f (> 1: ours faster), peak memory %.3f, first loss rel. diff %.2g\n", rt,
                  b["peak_mem_mb"].get<double>() / a["peak_mem_mb"].get<double>(),
                  std::abs(b["first_loss"].get<double>() - a["first_loss"].get<double>()) /
                      std::max(1e-30, std::abs(a["first_loss"].get<double>())));
    }
    std::fflush(stdout);
  }
  if (ratios.size() > 1) {
    std::sort(ratios.begin(), ratios.end());
    std::printf("median peer/ours time over %zu rounds: %.3f\n", ratios.size(), ratios[ratios.size() / 2]);
  }
  if (made_workdir && !o.keep) fs::remove_all(o.workdir);
  else std::printf("kept %s\n", o.workdir.c_str());
  return 0;
}

// Entry: the child or the parent. Errors become one line and status 1.
inline int main(const Options &o, const Family &fam, const std::string &self) {
  try {
    if (const std::string why = check(o); !why.empty()) {
      std::fprintf(stderr, "%s: %s\n", fam.name.c_str(), why.c_str());
      return 2;
    }
    if (o.side == "ours") return run_ours(o);
    if (!o.side.empty()) throw std::invalid_argument("--side '" + o.side + "' is not ours");
    return run_driver(o, fam, self);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", fam.name.c_str(), e.what());
    return 1;
  }
}

}  // namespace ditstep
