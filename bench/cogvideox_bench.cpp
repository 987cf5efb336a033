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
 * tree this was built from. */
#include <ATen/Parallel.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cpu_heap.h"
#include "models/native_model.h"

using namespace videotrain;

namespace {

const char *kConfig = R"({"_class_name": "CogVideoXTransformer3DModel", "attention_head_dim": 64,
  "num_attention_heads": 30, "num_layers": 2, "in_channels": 16, "out_channels": 16, "time_embed_dim": 512,
  "text_embed_dim": 4096, "max_text_seq_length": 226, "sample_frames": 49, "sample_height": 60, "sample_width": 90,
  "patch_size": 2, "use_rotary_positional_embeddings": false})";

}  // namespace

int main(int argc, char **argv) {
  int64_t frames = 3, height = 30, width = 44;
  int threads = 2, repeat = 2, rounds = 3;
  bool memory = false, checkpointing = true;
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
    else if (a == "--memory") memory = true;
    else if (a == "--profile" && i + 1 < argc) profile = argv[++i];
    else {
      std::fprintf(stderr, "cogvideox-bench: unknown argument %s\n", a.c_str());
      return 2;
    }
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
