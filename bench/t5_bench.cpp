/* Native T5 / umT5 encoder: captions per second of a real-width umT5-XXL cut to 2 layers (d_model
 * 4096, 64 heads, d_kv 64, d_ff 10240, vocabulary 1024) at max-length 512, against bench/t5_peer.py
 * (plain PyTorch, checked against tests/reference/text_encoder first) on the same weights and threads;
 * and the peak memory of loading the sharded bf16 folder in bf16 against the weights' size.
 *
 *   t5-bench [--layers 2] [--length 512] [--batch 4] [--threads 2] [--repeat 3] [--folder DIR] [--no-peer]
 * Without --folder the peer writes the folder (t5_peer.py --write) into a temporary directory. The peer
 * runs through PYTHON (default /usr/bin/python3) from VIDEOTRAIN_SOURCE_DIR or this source tree. */
#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "bench_util.h"
#include "models/t5_encoder.h"

namespace {

// Resident memory now (VmRSS) and at most so far (VmHWM), MiB.
double status_mb(const char *key) {
  FILE *f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double v = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, std::strlen(key)) == 0) v = std::atof(line + std::strlen(key)) / 1024.0;
  std::fclose(f);
  return v;
}

void reset_peak() {
  // Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
  if (FILE *f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

}  // namespace

int main(int argc, char **argv) {
  int64_t layers = 2, length = 512, batch = 4;
  int threads = 2, repeat = 3;
  bool peer = true;
  std::string folder;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (a == "--layers") layers = next();
    else if (a == "--length") length = next();
    else if (a == "--batch") batch = next();
    else if (a == "--threads") threads = static_cast<int>(next());
    else if (a == "--repeat") repeat = std::max<int>(1, static_cast<int>(next()));
    else if (a == "--folder" && i + 1 < argc) folder = argv[++i];
    else if (a == "--no-peer") peer = false;
    else {
      std::fprintf(stderr, "t5-bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  namespace fs = std::filesystem;
  const std::string py = benchutil::peer_command("t5_peer.py");
  std::string tmp;
  if (folder.empty()) {
    char templ[] = "/tmp/t5-bench-XXXXXX";
    if (!mkdtemp(templ)) return 1;
    tmp = folder = templ;
    if (std::system((py + " --write " + folder + " --layers " + std::to_string(layers)).c_str()) != 0) {
      std::fprintf(stderr, "t5-bench: t5_peer.py --write failed\n");
      return 1;
    }
  }
  uint64_t weight_bytes = 0;
  for (const auto &e : fs::directory_iterator(folder))
    if (e.path().extension() == ".safetensors") weight_bytes += fs::file_size(e.path());
  at::set_num_threads(threads);
  {  // Loading in the stored dtype: the peak over the resident memory before.
    const double before = status_mb("VmRSS:");
    reset_peak();
    auto enc = videotrain::models::T5Encoder::open(folder, torch::kCPU, torch::kBFloat16);
    const double peak = status_mb("VmHWM:") - before, after = status_mb("VmRSS:") - before;
    std::printf("load bf16: weights %.0f MiB, peak RSS growth %.0f MiB (%.2fx), resident after %.0f MiB\n",
                weight_bytes / 1048576.0, peak, peak / (weight_bytes / 1048576.0), after);
  }
  auto enc = videotrain::models::T5Encoder::open(folder, torch::kCPU, torch::kFloat);
  const auto ids = torch::randint(3, enc->config().vocab_size, {batch, length}, torch::kLong);
  auto mask = torch::ones({batch, length}, torch::kLong);
  mask.slice(1, length / 2).zero_();
  enc->forward(ids, mask);  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeat; r++) {
    const auto t0 = std::chrono::steady_clock::now();
    enc->forward(ids, mask);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double ours = batch / best;
  std::printf("native: %.3f captions/s (%lld layers, length %lld, batch %lld, %d threads)\n", ours,
              static_cast<long long>(layers), static_cast<long long>(length), static_cast<long long>(batch), threads);
  if (peer) {
    if (std::system((py + " --check >/dev/null").c_str()) != 0) {
      std::fprintf(stderr, "t5-bench: the peer does not match the reference (t5_peer.py --check)\n");
      return 1;
    }
    const std::string out = benchutil::run(py + " --bench --folder " + folder + " --length " + std::to_string(length) +
                                " --batch " + std::to_string(batch) + " --threads " + std::to_string(threads) +
                                " --repeat " + std::to_string(repeat));
    const auto at = out.find("\"captions_per_s\": ");
    if (at == std::string::npos) {
      std::fprintf(stderr, "t5-bench: the peer failed: %s\n", out.c_str());
      return 1;
    }
    const double theirs = std::atof(out.c_str() + at + 18);
    std::printf("peer (plain PyTorch): %.3f captions/s; native/peer %.2f\n", theirs, ours / theirs);
  }
  if (!tmp.empty()) fs::remove_all(tmp);
  return 0;
}
