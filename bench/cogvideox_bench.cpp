/* Native CogVideoX transformer: forward+backward time of a real-width 2-layer CogVideoX-2b config
 * (30 heads x 64, time 512, text 4096 x 226 tokens, 16 latent channels, sincos positions) against
 * bench/cogvideox_dit_peer.py, a plain PyTorch implementation that matches the same reference cases
 * (cogvideox_dit_peer.py --check), on the same torch threads; and the peak memory of one training
 * step at a real clip size with gradient checkpointing (49x480x720: 13x60x90 latents, 17,550 video
 * tokens + 226 text).
 *
 *   cogvideox-bench [--frames 3] [--height 30] [--width 44] [--threads 2] [--repeat 2] [--rounds 3]
 *   cogvideox-bench --memory [--frames 13] [--height 60] [--width 90] [--checkpointing 1]
 *   cogvideox-bench --profile FILE   # one forward+backward under LibTorch's profiler: a Chrome trace
 * The peer runs through PYTHON (default /usr/bin/python3) from VIDEOTRAIN_SOURCE_DIR or the source
 * tree this was built from.
 *
 * Training-step mode (bench/dit_step.h; docs/gpu-benchmarks.md), ours against diffusers' own
 * CogVideoXTransformer3DModel (bench/dit_diffusers_peer.py) on the same weights and inputs:
 *   cogvideox-bench --peer diffusers|none [--device cpu|cuda:N] [--dtype float32|bfloat16] [--layers 2]
 *             [--latent-frames 3 --latent-height 30 --latent-width 44] [--lora R]
 *             [--checkpointing none|full|selective] [--attention-backend auto|flash|cudnn|efficient|math]
 *             [--optimizer none|adamw] [--warmup 1] [--steps 3]
 *             [--rounds 1] [--peak-tflops 989] [--weights DIR] [--save-dtype bf16] [--workdir DIR] [--keep]
 *             [--flops-only]   # the setup line and the flop accounting alone
 * Latent sizes are the transformer's input ([1, F, 16, H, W]: 49x480x720 video = 13x60x90 latents),
 * text 226 tokens; any of these flags but the sizes selects the mode. CogVideoX-2b is --layers 30. */
#include <ATen/Parallel.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "dit_step.h"
#include "cpu_heap.h"
#include "models/native_model.h"

using namespace videotrain;

namespace {

const char *kConfig = R"({"_class_name": "CogVideoXTransformer3DModel", "attention_head_dim": 64,
  "num_attention_heads": 30, "num_layers": 2, "in_channels": 16, "out_channels": 16, "time_embed_dim": 512,
  "text_embed_dim": 4096, "max_text_seq_length": 226, "sample_frames": 49, "sample_height": 60, "sample_width": 90,
  "patch_size": 2, "use_rotary_positional_embeddings": false})";

// Model flops of one forward (one sample) by part: 2 flops per multiply-add. N = S video + L text
// tokens in one sequence, D = heads x head_dim, F = 4 D (the feed-forward): attention 4 N^2 D per
// layer (QK^T and PV), linears 2 N (4 D^2 q/k/v/o + 2 D F) per layer, plus patch and text
// embedding and the output projection (the per-sample adaLN and time linears are negligible).
std::vector<std::pair<std::string, double>> cogvideox_flops(const nlohmann::json &c, int64_t frames, int64_t height,
                                                            int64_t width) {
  const int64_t p = c.value("patch_size", 2);
  const int64_t pt = c["patch_size_t"].is_number() ? c["patch_size_t"].get<int64_t>() : 1;
  const double S = double((frames + pt - 1) / pt) * (height / p) * (width / p);
  const double L = c.value("max_text_seq_length", 226), N = S + L;
  const double D = c.value("num_attention_heads", 30) * c.value("attention_head_dim", 64);
  const double n = c.value("num_layers", 2), T = c.value("text_embed_dim", 4096);
  const double P = double(p * p * pt);
  return {{"attention", n * 4 * N * N * D},
          {"linears", n * 2 * N * (4 * D * D + 2 * D * 4 * D) +
                          2 * S * D * P * (c.value("in_channels", 16) + c.value("out_channels", 16)) + 2 * L * T * D}};
}

}  // namespace

int main(int argc, char **argv) {
  int64_t frames = 3, height = 30, width = 44;
  int threads = 2, repeat = 2, rounds = 3;
  bool memory = false, checkpointing = true;
  std::string profile;  // --profile FILE: one step under LibTorch's profiler, as a Chrome trace
  ditstep::Options step_opts;
  bool rounds_given = false, peer = true;
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
      taken = ditstep::parse_flag(argc, argv, i, step_opts, &frames, &height, &width, nullptr);
    } catch (const std::exception &e) {
      std::fprintf(stderr, "cogvideox-bench: %s\n", e.what());
      return 2;
    }
    if (taken) continue;
    if (a == "--no-peer") peer = false;
    else if (a == "--frames") frames = next();
    else if (a == "--height") height = next();
    else if (a == "--width") width = next();
    else if (a == "--threads") threads = static_cast<int>(next());
    else if (a == "--repeat") repeat = static_cast<int>(next());
    else if (a == "--rounds") rounds = std::max<int>(1, static_cast<int>(next())), rounds_given = true;
    else if (a == "--checkpointing") checkpointing = next() != 0;
    else if (a == "--memory") memory = true;
    else if (a == "--profile" && i + 1 < argc) profile = argv[++i];
    else {
      std::fprintf(stderr, "cogvideox-bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (step_opts.active || step_opts.peer != "plain") {
    step_opts.threads = threads;
    step_opts.rounds = rounds_given ? rounds : 1;
    if (!peer || step_opts.peer == "plain") step_opts.peer = "none";
    ditstep::Family fam;
    fam.name = "cogvideox-bench";
    fam.config = [](int layers) {
      auto j = nlohmann::json::parse(kConfig);
      j["num_layers"] = layers;
      return j.dump();
    };
    fam.inputs = [&](const nlohmann::json &c) {
      const int64_t cin = c.value("in_channels", 16), cout = c.value("out_channels", 16);
      return std::map<std::string, at::Tensor>{
          {"hidden_states", torch::randn({1, frames, cin, height, width})},
          {"timestep", torch::full({1}, 500, torch::kLong)},
          {"encoder_hidden_states", torch::randn({1, c.value("max_text_seq_length", 226), c.value("text_embed_dim", 4096)})},
          {"target", torch::randn({1, frames, cout, height, width})}};
    };
    fam.flops = [&](const nlohmann::json &c) { return cogvideox_flops(c, frames, height, width); };
    fam.tokens = [&](const nlohmann::json &c) {
      const int64_t p = c.value("patch_size", 2);
      const int64_t pt = c["patch_size_t"].is_number() ? c["patch_size_t"].get<int64_t>() : 1;
      return std::to_string((frames + pt - 1) / pt * (height / p) * (width / p)) + " video (latents " +
             std::to_string(frames) + "x" + std::to_string(height) + "x" + std::to_string(width) + ") + " +
             std::to_string(c.value("max_text_seq_length", 226)) + " text";
    };
    return ditstep::main(step_opts, fam, argv[0]);
  }
  if (memory && frames == 3 && height == 30 && width == 44) frames = 13, height = 60, width = 90;
  at::set_num_threads(threads);
  std::string why;
  if (!retain_cpu_heap(&why)) std::fprintf(stderr, "cogvideox-bench: tune-malloc: %s\n", why.c_str());
  torch::manual_seed(0);
  const double rss0 = benchutil::peak_rss_mb();
  auto m = models::build_dit(kConfig, torch::kCPU);
  const double rss_model = benchutil::peak_rss_mb();
  m->set_gradient_checkpointing(memory ? checkpointing : false);
  const auto x = torch::randn({1, frames, 16, height, width});
  const auto text = torch::randn({1, 226, 4096});
  const auto t = torch::full({1}, 500, torch::kLong);
  const int64_t tokens = frames * (height / 2) * (width / 2);
  auto step = [&] { m->forward(x, t, text).square().mean().backward(); };
  auto reset = [&] {
    for (auto &p : m->module().parameters()) p.mutable_grad() = at::Tensor();
  };
  if (!profile.empty()) {
    benchutil::profile_step(profile, step, reset);
    std::printf("{\"profile\": \"%s\", \"video_tokens\": %lld}\n", profile.c_str(), (long long)tokens);
    return 0;
  }
  if (memory) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("{\"what\": \"one training step, real width, 2 layers\", \"video_tokens\": %lld, \"text_tokens\": 226, "
                "\"checkpointing\": %s, \"seconds\": %.1f, \"peak_rss_mb\": %.0f, \"model_and_grads_mb\": %.0f, "
                "\"step_over_model_mb\": %.0f}\n",
                (long long)tokens, checkpointing ? "true" : "false", s, benchutil::peak_rss_mb(), (rss_model - rss0) * 2,
                benchutil::peak_rss_mb() - rss_model);
    return 0;
  }
  auto ours = [&] { return benchutil::best_of(repeat, step, reset); };
  const std::string cmd = benchutil::peer_command("cogvideox_dit_peer.py") + " --bench --frames " + std::to_string(frames) +
                          " --height " + std::to_string(height) + " --width " + std::to_string(width) +
                          " --threads " + std::to_string(threads) + " --repeat " + std::to_string(repeat);
  const std::string peer_name = std::string("plain PyTorch ") + TORCH_VERSION;
  const double median =
      benchutil::median_ratio(rounds, ours, [&] { return benchutil::peer_seconds(cmd); }, peer_name.c_str());
  std::printf("{\"threads\": %d, \"video_tokens\": %lld, \"text_tokens\": 226, \"median_ratio_ours_over_peer\": %.3f}  "
              "(<= 1: at least as fast)\n",
              threads, (long long)tokens, median);
  return 0;
}
