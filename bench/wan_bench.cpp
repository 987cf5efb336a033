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
 * tree this was built from. */
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <torch/version.h>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "bench_util.h"
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

}  // namespace

int main(int argc, char **argv) {
  int64_t frames = 3, height = 30, width = 52, text = 512;
  int threads = 2, repeat = 2, rounds = 3;
  bool peer = true, memory = false, checkpointing = true, versus = false;
  std::string train;  // full | lora: one optimizer step (--lora-vs-full runs both)
  std::string profile;  // --profile FILE: one step under LibTorch's profiler, as a Chrome trace
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (a == "--frames") frames = next();
    else if (a == "--height") height = next();
    else if (a == "--width") width = next();
    else if (a == "--threads") threads = static_cast<int>(next());
    else if (a == "--repeat") repeat = static_cast<int>(next());
    else if (a == "--rounds") rounds = std::max<int>(1, static_cast<int>(next()));
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
