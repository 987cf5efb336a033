/* vae-decode-bench: vaedecoder's decoder (models/vae/vae_decoder.h) on CPU: peak memory against clip
 * length (it should stay flat: frames leave chunk by chunk) and decode time against a plain PyTorch
 * decoder (bench/vae_decode_peer.py, checked first against diffusers' decode cases in
 * tests/reference), with the ratio printed.
 *
 *   vae-decode-bench [--model DIR] [--latent 8x12] [--frames 17,97] [--time-frames 17] [--repeat 3]
 *                    [--threads N] [--tune-malloc 1|0] [--time 1|0]
 *
 * Without --model a seeded random CogVideoX VAE of the bench size (64-256 channels, 2 resnets per
 * block, 32 groups; encoder and decoder) is written to a temporary folder. Each memory case runs in
 * a fresh process (fork) and reports its peak resident set (VmHWM) above the loaded decoder's, with
 * the frames themselves dropped as they come (a sink's share is not the decoder's), with the C heap
 * tuned as vaedecoder's tune-malloc does (--tune-malloc 0: glibc's defaults). Times are the
 * median of --repeat decodes of one clip (after one warm-up), in this process and in the peer with
 * the same thread count. */
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cpu_heap.h"
#include "models/vae/vae_config.h"
#include "models/vae/vae_decoder.h"

using namespace videotrain::vae;

namespace {

long vm_kb(const char *key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::atol(line.c_str() + strlen(key));
  return -1;
}

int64_t latent_frames(int frames) { return (frames - 1) / 4 + 1; }

// Peak resident memory (kB) of decoding a clip of `frames` frames in a child process, above the
// resident set once the decoder is loaded.
long peak_in_child(const std::string &model, int frames, int h, int w, int threads, bool tune_malloc,
                   long *base_out) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    at::set_num_threads(threads);
    if (tune_malloc) videotrain::retain_large_cpu_blocks();  // as vaedecoder's tune-malloc does
    long out[2] = {-1, -1};
    try {
      auto dec = VaeDecoder::load(model, c10::Device(c10::kCPU), at::kFloat);
      at::Tensor z = at::randn({1, dec->latent_channels(), latent_frames(frames), h, w});
      out[0] = vm_kb("VmRSS:");
      int64_t got = 0;
      dec->decode(z, {}, [&](const at::Tensor &f) { got += f.size(2); });
      out[1] = got == frames ? vm_kb("VmHWM:") : -1;
    } catch (const std::exception &e) {
      fprintf(stderr, "vae-decode-bench: %s\n", e.what());
    }
    if (write(fds[1], out, sizeof out) != sizeof out) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  long r[2] = {-1, -1};
  if (read(fds[0], r, sizeof r) != sizeof r) r[0] = r[1] = -1;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  *base_out = r[0];
  return r[1] < 0 ? -1 : r[1] - r[0];
}


}  // namespace

int main(int argc, char **argv) {
  std::string model, latent = "8x12";
  std::vector<int> lengths{17, 97};
  int time_frames = 17, repeat = 3, threads = std::max(1, at::get_num_threads());
  bool tune_malloc = true, timing = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") model = v;
    else if (a == "--latent") latent = v;
    else if (a == "--frames") {
      lengths.clear();
      for (char *s = strtok(argv[i + 1], ","); s; s = strtok(nullptr, ",")) lengths.push_back(std::atoi(s));
    } else if (a == "--time-frames") time_frames = std::atoi(v.c_str());
    else if (a == "--repeat") repeat = std::max(1, std::atoi(v.c_str()));
    else if (a == "--threads") threads = std::max(1, std::atoi(v.c_str()));
    else if (a == "--tune-malloc") tune_malloc = v != "0";
    else if (a == "--time") timing = v != "0";
    else {
      fprintf(stderr, "usage: see the comment at the top of bench/vae_decode_bench.cpp\n");
      return 2;
    }
  }
  int h = 0, w = 0;
  if (sscanf(latent.c_str(), "%dx%d", &h, &w) != 2 || h < 1 || w < 1) {
    fprintf(stderr, "vae-decode-bench: --latent HxW (latent pixels)\n");
    return 2;
  }
  std::string tmp;
  if (model.empty()) {
    char templ[] = "/tmp/vae-decode-bench-XXXXXX";
    if (!mkdtemp(templ)) return 1;
    tmp = model = templ;
    VaeConfig cfg = mid_config();
    auto table = encoder_tensor_table(cfg);
    for (auto &e : decoder_tensor_table(cfg)) table.push_back(e);
    std::string err;
    std::ofstream(model + "/config.json") << vae_config_to_json(cfg) << "\n";
    if (!write_random_weights(model + "/diffusion_pytorch_model.safetensors", table, 7, "F32", &err)) {
      fprintf(stderr, "vae-decode-bench: %s\n", err.c_str());
      return 1;
    }
  }
  const std::string source = SOURCE_DIR;
  const char *ref_env = getenv("VIDEOTRAIN_REFERENCE_DIR");
  const std::string ref = ref_env ? ref_env : source + "/tests/reference";
  const std::string py = "OMP_NUM_THREADS=" + std::to_string(threads) + " /usr/bin/python3 " + source +
                         "/bench/vae_decode_peer.py ";
  printf("model %s, latent %dx%d, %d threads\n", model.c_str(), h, w, threads);

  // Memory: flat in the clip length.
  for (int frames : lengths) {
    long base = 0;
    long peak = peak_in_child(model, frames, h, w, threads, tune_malloc, &base);
    printf("memory frames=%d latent_frames=%ld peak_above_loaded_kb=%ld (loaded %ld kB)\n", frames,
           static_cast<long>(latent_frames(frames)), peak, base);
  }

  if (!timing) {
    if (!tmp.empty()) std::system(("rm -rf " + tmp).c_str());
    return 0;
  }
  // The peer must match diffusers before its time means anything.
  bool peer_ok = true;
  for (const char *v : {"cogvideox_vae/tiny_a", "wan_vae/tiny_wan21", "wan_vae/tiny_wan22"}) {
    int rc = 0;
    std::string out = benchutil::run(py + "check " + ref + "/" + v + " 2>&1", &rc);
    if (rc != 0) {
      peer_ok = false;
      printf("peer check failed on %s:\n%s", v, out.c_str());
    }
  }
  printf("peer matches decode_cases: %s\n", peer_ok ? "yes" : "NO");

  // Time: one clip, median of `repeat`.
  at::set_num_threads(threads);
  auto dec = VaeDecoder::load(model, c10::Device(c10::kCPU), at::kFloat);
  at::Tensor z = at::randn({1, dec->latent_channels(), latent_frames(time_frames), h, w});
  std::vector<double> ms;
  for (int r = 0; r <= repeat; r++) {
    auto t0 = std::chrono::steady_clock::now();
    dec->decode(dec->denormalize(z), {}, [](const at::Tensor &) {});
    if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double native = ms[ms.size() / 2];
  double peer = -1;
  if (peer_ok) {
    int rc = 0;
    std::string out = benchutil::run(py + "time " + model + " " + std::to_string(latent_frames(time_frames)) + " " +
                              std::to_string(h) + " " + std::to_string(w) + " " + std::to_string(repeat),
                          &rc);
    const char *p = strstr(out.c_str(), "peer_ms ");
    if (rc == 0 && p) peer = std::atof(p + 8);
    else printf("peer timing failed:\n%s", out.c_str());
  }
  printf("time frames=%d native_ms=%.1f peer_ms=%.1f ratio_peer_over_native=%.2f\n", time_frames, native, peer,
         peer > 0 ? peer / native : 0.0);
  if (!tmp.empty()) std::system(("rm -rf " + tmp).c_str());
  return 0;
}
