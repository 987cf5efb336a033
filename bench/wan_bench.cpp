/* Native Wan transformer: forward+backward time of a real-width 2-layer Wan 2.1 1.3B config (dim
 * 1536, 12 heads, ffn 8960, text 4096, 16 latent channels) against bench/wan_peer.py, a plain
 * PyTorch implementation that matches the same reference cases (wan_peer.py --check), on the same
 * torch threads; and the peak memory of one training step at a real clip size with gradient
 * checkpointing (49x480x720: 13x60x90 latents, 17,550 tokens).
 *
 *   wan-bench [--frames 3] [--height 30] [--width 52] [--threads 2] [--repeat 2] [--rounds 3] [--no-peer]
 *   wan-bench --memory [--frames 13] [--height 60] [--width 90] [--checkpointing 1]
 *   wan-bench --profile FILE   # one forward+backward under LibTorch's profiler: a Chrome trace
 *   wan-bench --lora-vs-full [--frames 3] [--height 30] [--width 52]   # a LoRA step (rank 32 on the
 *             attention projections, base frozen) against a full fine-tune step, each with AdamW, each
 *             in a process of its own: seconds and peak RSS of each
 * The peer runs through PYTHON (default /usr/bin/python3) from VIDEOTRAIN_SOURCE_DIR or the source
 * tree this was built from.
 *
 * Training-step mode (bench/dit_step.h; docs/gpu-benchmarks.md), ours against diffusers' own
 * WanTransformer3DModel (bench/dit_diffusers_peer.py) on the same weights and inputs:
 *   wan-bench --peer diffusers|none [--device cpu|cuda:N] [--dtype float32|bfloat16] [--layers 2]
 *             [--latent-frames 3 --latent-height 30 --latent-width 52] [--text 512] [--lora R]
 *             [--checkpointing none|full|selective] [--attention-backend auto|flash|cudnn|efficient|math]
 *             [--optimizer none|adamw] [--warmup 1] [--steps 3]
 *             [--rounds 1] [--peak-tflops 989] [--weights DIR] [--save-dtype bf16] [--workdir DIR] [--keep]
 *             [--flops-only]   # the setup line and the flop accounting alone
 * Latent sizes are the transformer's input ([1, 16, F, H, W]: 81x480x832 video = 21x60x104 latents);
 * any of these flags but the sizes selects the mode. The real Wan 2.1 1.3B is --layers 30. */
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <torch/version.h>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <memory>
#include <string>

#include "bench_util.h"
#include "dit_step.h"
#include "cpu_heap.h"
#include "models/layers.h"
#include "models/lora.h"
#include "models/native_model.h"

using namespace videotrain;

namespace {

const char *kConfig = R"({"_class_name": "WanTransformer3DModel", "attention_head_dim": 128, "cross_attn_norm": true,
  "eps": 1e-06, "ffn_dim": 8960, "freq_dim": 256, "in_channels": 16, "num_attention_heads": 12, "num_layers": 2,
  "out_channels": 16, "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024,
  "text_dim": 4096})";

// Model flops of one forward (one sample) by part: 2 flops per multiply-add. S video tokens, L text
// tokens, D = heads x head_dim, F = ffn_dim: self-attention 4 S^2 D per layer (QK^T and PV), cross-
// attention 4 S L D, linears 2 S (4 D^2 self q/k/v/o + 2 D^2 cross q/o + 2 D F ffn) + 2 L 2 D^2 (cross
// k/v) per layer, plus patch embedding, output projection and the text/time embedders.
std::vector<std::pair<std::string, double>> wan_flops(const nlohmann::json &c, int64_t frames, int64_t height,
                                                      int64_t width, int64_t text) {
  const auto ps = c.value("patch_size", std::vector<int64_t>{1, 2, 2});
  const double S = double(frames / ps[0]) * (height / ps[1]) * (width / ps[2]), L = double(text);
  const double D = c.value("num_attention_heads", 12) * c.value("attention_head_dim", 128);
  const double F = c.value("ffn_dim", 8960), n = c.value("num_layers", 2), T = c.value("text_dim", 4096);
  const double P = double(ps[0] * ps[1] * ps[2]), freq = c.value("freq_dim", 256);
  return {{"self-attention", n * 4 * S * S * D},
          {"cross-attention", n * 4 * S * L * D},
          {"linears", n * (2 * S * (6 * D * D + 2 * D * F) + 2 * L * 2 * D * D) +
                          2 * S * D * P * (c.value("in_channels", 16) + c.value("out_channels", 16)) +
                          2 * L * (T * D + D * D) + 2 * (freq * D + 7 * D * D)}};
}

}  // namespace

int main(int argc, char **argv) {
  int64_t frames = 3, height = 30, width = 52, text = 512;
  int threads = 2, repeat = 2, rounds = 3;
  bool peer = true, memory = false, checkpointing = true, versus = false, rounds_given = false;
  std::string train;  // full | lora: one optimizer step (--lora-vs-full runs both)
  std::string profile;  // --profile FILE: one step under LibTorch's profiler, as a Chrome trace
  ditstep::Options step_opts;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (a == "--checkpointing" && i + 1 < argc && !std::isdigit(static_cast<unsigned char>(argv[i + 1][0]))) {
      step_opts.checkpointing = argv[++i];  // none | full | selective: the training-step mode
      step_opts.active = true;
      continue;
    }
    bool taken = false;
    try {
      taken = ditstep::parse_flag(argc, argv, i, step_opts, &frames, &height, &width, &text);
    } catch (const std::exception &e) {
      std::fprintf(stderr, "wan-bench: %s\n", e.what());
      return 2;
    }
    if (taken) continue;
    if (a == "--frames") frames = next();
    else if (a == "--height") height = next();
    else if (a == "--width") width = next();
    else if (a == "--threads") threads = static_cast<int>(next());
    else if (a == "--repeat") repeat = static_cast<int>(next());
    else if (a == "--rounds") rounds = std::max<int>(1, static_cast<int>(next())), rounds_given = true;
    else if (a == "--checkpointing") checkpointing = next() != 0;
    else if (a == "--no-peer") peer = false;
    else if (a == "--memory") memory = true;
    else if (a == "--lora-vs-full") versus = true;
    else if (a == "--train" && i + 1 < argc) train = argv[++i];
    else if (a == "--profile" && i + 1 < argc) profile = argv[++i];
    else {
      std::fprintf(stderr, "wan-bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (step_opts.active || step_opts.peer != "plain") {
    step_opts.threads = threads;
    step_opts.rounds = rounds_given ? rounds : 1;
    if (!peer || step_opts.peer == "plain") step_opts.peer = "none";
    ditstep::Family fam;
    fam.name = "wan-bench";
    fam.config = [](int layers) {
      auto j = nlohmann::json::parse(kConfig);
      j["num_layers"] = layers;
      return j.dump();
    };
    fam.inputs = [&](const nlohmann::json &c) {
      const int64_t cin = c.value("in_channels", 16), cout = c.value("out_channels", 16);
      return std::map<std::string, at::Tensor>{
          {"hidden_states", torch::randn({1, cin, frames, height, width})},
          {"timestep", torch::full({1}, 500.0)},
          {"encoder_hidden_states", torch::randn({1, text, c.value("text_dim", 4096)})},
          {"target", torch::randn({1, cout, frames, height, width})}};
    };
    fam.flops = [&](const nlohmann::json &c) { return wan_flops(c, frames, height, width, text); };
    fam.tokens = [&](const nlohmann::json &c) {
      const auto ps = c.value("patch_size", std::vector<int64_t>{1, 2, 2});
      return std::to_string(frames / ps[0] * (height / ps[1]) * (width / ps[2])) + " video (latents " +
             std::to_string(frames) + "x" + std::to_string(height) + "x" + std::to_string(width) + ") + " +
             std::to_string(text) + " text";
    };
    return ditstep::main(step_opts, fam, argv[0]);
  }
  if (memory && frames == 3 && height == 30 && width == 52) frames = 13, height = 60, width = 90;
  if (versus) {
    const std::string base = std::string(argv[0]) + " --frames " + std::to_string(frames) + " --height " +
                             std::to_string(height) + " --width " + std::to_string(width) + " --threads " +
                             std::to_string(threads) + " --train ";
    const std::string full = benchutil::run(base + "full"), lora = benchutil::run(base + "lora");
    std::printf("%s%s", full.c_str(), lora.c_str());
    auto num = [](const std::string &out, const char *key) {
      const auto at = out.find(key);
      return at == std::string::npos ? 0.0 : std::atof(out.c_str() + at + std::strlen(key));
    };
    std::printf("LoRA/full: time %.2f, peak RSS %.2f\n", num(lora, "\"seconds\": ") / num(full, "\"seconds\": "),
                num(lora, "\"peak_rss_mb\": ") / num(full, "\"peak_rss_mb\": "));
    return 0;
  }
  at::set_num_threads(threads);
  std::string why;
  if (!retain_cpu_heap(&why)) std::fprintf(stderr, "wan-bench: tune-malloc: %s\n", why.c_str());  // as ddptrainsink on CPU
  torch::manual_seed(0);
  const double rss0 = benchutil::peak_rss_mb();
  auto m = models::build_dit(kConfig, torch::kCPU);
  const double rss_model = benchutil::peak_rss_mb();
  m->set_gradient_checkpointing(memory ? checkpointing : false);
  const auto x = torch::randn({1, 16, frames, height, width});
  const auto ctx = torch::randn({1, text, 4096});
  const auto t = torch::full({1}, 500.0);
  const int64_t tokens = frames * (height / 2) * (width / 2);
  auto step = [&] { m->forward(x, t, ctx).square().mean().backward(); };
  auto reset = [&] {
    for (auto &p : m->module().parameters()) p.mutable_grad() = at::Tensor();
  };
  if (!profile.empty()) {
    benchutil::profile_step(profile, step, reset);
    std::printf("{\"profile\": \"%s\", \"tokens\": %lld}\n", profile.c_str(), (long long)tokens);
    return 0;
  }
  if (!train.empty()) {
    std::vector<at::Tensor> params;
    if (train == "lora") {
      for (auto &p : m->module().parameters()) p.set_requires_grad(false);
      for (auto &item : m->module().named_modules("", false)) {
        auto *l = item.value()->as<models::LinearImpl>();
        const std::string &n = item.key();
        if (l && (n.find(".to_q") != std::string::npos || n.find(".to_k") != std::string::npos ||
                  n.find(".to_v") != std::string::npos || n.find(".to_out") != std::string::npos))
          l->add_lora(32, 1.0);
      }
      for (auto &[n, t] : models::lora_parameters(m->module())) params.push_back(t);
    } else {
      params = m->module().parameters();
    }
    torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-4));
    double best = 1e30;
    for (int r = 0; r < 2; r++) {
      auto t0 = std::chrono::steady_clock::now();
      opt.zero_grad();
      m->forward(x, t, ctx).square().mean().backward();
      opt.step();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    int64_t trained = 0;
    for (auto &p : params) trained += p.numel();
    std::printf("{\"train\": \"%s\", \"tokens\": %lld, \"trained_parameters\": %lld, \"seconds\": %.3f, "
                "\"peak_rss_mb\": %.0f}\n", train.c_str(), (long long)tokens, (long long)trained, best, benchutil::peak_rss_mb());
    return 0;
  }
  if (memory) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("{\"what\": \"one training step, real width, 2 layers\", \"tokens\": %lld, \"checkpointing\": %s, "
                "\"seconds\": %.1f, \"peak_rss_mb\": %.0f, \"model_and_grads_mb\": %.0f, \"step_over_model_mb\": %.0f}\n",
                (long long)tokens, checkpointing ? "true" : "false", s, benchutil::peak_rss_mb(), (rss_model - rss0) * 2,
                benchutil::peak_rss_mb() - rss_model);
    return 0;
  }
  auto ours = [&] { return benchutil::best_of(repeat, step, reset); };
  if (!peer) {
    std::printf("{\"ours\": \"native LibTorch\", \"threads\": %d, \"tokens\": %lld, \"seconds_per_step\": %.3f}\n",
                threads, (long long)tokens, ours());
    return 0;
  }
  const std::string cmd = benchutil::peer_command("wan_peer.py") + " --bench --frames " + std::to_string(frames) +
                          " --height " + std::to_string(height) + " --width " + std::to_string(width) +
                          " --threads " + std::to_string(threads) + " --repeat " + std::to_string(repeat);
  const std::string peer_name = std::string("plain PyTorch ") + TORCH_VERSION;
  const double median =
      benchutil::median_ratio(rounds, ours, [&] { return benchutil::peer_seconds(cmd); }, peer_name.c_str());
  std::printf("{\"threads\": %d, \"tokens\": %lld, \"median_ratio_ours_over_peer\": %.3f}  (<= 1: at least as fast)\n",
              threads, (long long)tokens, median);
  return 0;
}
