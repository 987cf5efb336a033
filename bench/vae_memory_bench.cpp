/* vae-memory-bench: peak memory of the VAE encoder against clip length, chunked streaming
 * versus one whole-clip pass, and CPU throughput.
 *
 *   vae-memory-bench [--model DIR | --family cogvideox|wan21|wan22] [--size 256] [--frames 17,49,97]
 *                    [--threads N] [--device cpu|cuda:N] [--dtype float32|bfloat16|float16]
 *
 * Each case runs in a fresh process (fork) and reports its peak resident set (VmHWM), or
 * on CUDA the caching allocator's allocated bytes (current after loading, peak), so
 * cases do not see each other's allocations. Without --model, a seeded random tiny
 * CogVideoX-architecture VAE is written to a temporary folder (no downloads); --family wan21|wan22
 * takes the tiny Wan VAEs of ../shared/reference/wan_vae (VIDEOTRAIN_REFERENCE_DIR). The Wan
 * encoder always streams frame 0 then groups of 4, so its "single" case is the whole clip held as
 * one float tensor (as diffusers' encode gets it) against frames pushed one by one.
 * Target: the chunked peak grows by no more than the encoder output (within 10%) from the
 * shortest to the longest clip; the single pass grows with T. */
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "vaeencoder/vae_config.h"
#include "vaeencoder/vae_engine.h"
#include "vaeencoder/vae_engine_tensors.h"

#ifdef VIDEOTRAIN_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

using namespace videotrain::vae;

namespace {

long vm_kb(const char *key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  size_t n = strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0) return std::atol(line.c_str() + n + 1);
  return -1;
}

// Memory in KiB: the process's peak RSS on CPU; on CUDA the allocator's current or peak
// allocated bytes (index 0 is the aggregate over pools in every LibTorch version).
long mem_kb(const c10::Device &dev, bool peak) {
#ifdef VIDEOTRAIN_HAVE_CUDA
  if (dev.is_cuda()) {
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index());
    return static_cast<long>((peak ? st.allocated_bytes[0].peak : st.allocated_bytes[0].current) / 1024);
  }
#endif
  (void)peak;
  return dev.is_cuda() ? -1 : vm_kb("VmHWM:");
}

struct Result {
  long base_kb = 0, peak_kb = 0;
  double seconds = 0;
  long out_bytes = 0;
  int ok = 0;
};

// One case, in the child: load, then encode a T-frame clip; peak RSS before and after.
Result run_case(const std::string &model, int size, int T, bool chunked, int threads, const std::string &device,
               const std::string &dtype) {
  Result r;
  // Fixed malloc thresholds: large blocks go straight back to the system when freed, so the
  // high-water mark reflects what was live at once rather than allocator hysteresis.
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  mallopt(M_TRIM_THRESHOLD, 64 * 1024);
  at::set_num_threads(threads);
  EngineOptions o;
  o.model = model;
  o.device = device;
  o.dtype = dtype;
  const c10::Device dev(device);
  o.latent = LatentKind::Moments;
  o.allow_any_length = true;
  std::string err;
  auto eng = VaeEngine::create(o, &err);
  if (!eng) {
    fprintf(stderr, "vae-memory-bench: %s\n", err.c_str());
    return r;
  }
  r.base_kb = mem_kb(dev, false);
  std::vector<uint8_t> frame(size * size * 3);
  auto t0 = std::chrono::steady_clock::now();
  if (chunked) {
    if (!eng->begin_clip(0, T, size, size, &err)) return r;
    for (int t = 0; t < T; t++) {
      for (size_t i = 0; i < frame.size(); i++) frame[i] = static_cast<uint8_t>((i * 7 + t * 13) & 0xff);
      if (!eng->push_frame(frame.data(), size * 3, &err)) {
        fprintf(stderr, "vae-memory-bench: %s\n", err.c_str());
        return r;
      }
    }
    GstBuffer *buf = eng->finish_clip(&err);
    if (!buf) return r;
    r.out_bytes = static_cast<long>(gst_buffer_get_size(buf));
    gst_buffer_unref(buf);
  } else {
    at::Tensor u8 = at::empty({T, size, size, 3}, at::kByte);
    auto *p = u8.data_ptr<uint8_t>();
    for (int t = 0; t < T; t++)
      for (size_t i = 0; i < frame.size(); i++) p[t * frame.size() + i] = static_cast<uint8_t>((i * 7 + t * 13) & 0xff);
    at::Tensor raw = encode_raw(*eng, dequantize_frames(u8), T);
    r.out_bytes = raw.numel() * 4;
  }
  if (dev.is_cuda()) torch::cuda::synchronize();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.peak_kb = mem_kb(dev, true);
  r.ok = 1;
  return r;
}

Result in_child(const std::string &model, int size, int T, bool chunked, int threads, const std::string &device,
                const std::string &dtype) {
  int fds[2];
  Result r;
  if (pipe(fds) != 0) return r;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Result c = run_case(model, size, T, chunked, threads, device, dtype);
    if (write(fds[1], &c, sizeof c) != sizeof c) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  if (read(fds[0], &r, sizeof r) != sizeof r) r.ok = 0;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return r;
}

}  // namespace

int main(int argc, char **argv) {
  gst_init(&argc, &argv);
  std::string model, family = "cogvideox";
  int size = 256, threads = 2;
  std::string device = "cpu", dtype = "float32";
  std::vector<int> lengths{17, 49, 97};
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--family" && i + 1 < argc) {
      family = argv[++i];
    } else if (a == "--size" && i + 1 < argc) {
      size = std::atoi(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--device" && i + 1 < argc) {
      device = argv[++i];
    } else if (a == "--dtype" && i + 1 < argc) {
      dtype = argv[++i];
    } else if (a == "--frames" && i + 1 < argc) {
      lengths.clear();
      for (char *s = strtok(argv[++i], ","); s; s = strtok(nullptr, ",")) lengths.push_back(std::atoi(s));
    } else {
      fprintf(stderr,
              "usage: %s [--model DIR | --family cogvideox|wan21|wan22] [--size 256] [--frames 17,49,97] [--threads N] [--device cpu|cuda:N] "
              "[--dtype float32|bfloat16|float16]\n",
              argv[0]);
      return 2;
    }
  }
  std::string tmp;
  if (model.empty() && (family == "wan21" || family == "wan22")) {
    const char *ref = std::getenv("VIDEOTRAIN_REFERENCE_DIR");
    model = std::string(ref ? ref : "../shared/reference") + "/wan_vae/tiny_" + family;
  } else if (model.empty() && family != "cogvideox") {
    fprintf(stderr, "vae-memory-bench: --family is cogvideox, wan21 or wan22, not '%s'\n", family.c_str());
    return 2;
  }
  if (model.empty()) {
    char tmpl[] = "/tmp/vae-bench-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    tmp = tmpl;
    model = tmp + "/vae";
    std::string err;
    if (!make_random_vae(model, tiny_config(), 1, "F32", &err)) {
      fprintf(stderr, "%s\n", err.c_str());
      return 1;
    }
  }
  printf("VAE encoder memory, %dx%d frames, model %s, %s %s, %d threads, a fresh process per case%s\n", size, size,
         tmp.empty() ? model.c_str() : "tiny random CogVideoX VAE", device.c_str(), dtype.c_str(), threads,
         device == "cpu" ? "" : " (GPU allocator bytes)");
  printf("%-8s %6s %12s %12s %12s %12s %10s\n", "mode", "frames", "base MiB", "peak MiB", "growth MiB", "output MiB",
         "frames/s");
  std::vector<Result> chunked, single;
  bool ok = true;
  for (int pass = 0; pass < 2; pass++) {
    for (int T : lengths) {
      Result r = in_child(model, size, T, pass == 0, threads, device, dtype);
      ok = ok && r.ok;
      (pass == 0 ? chunked : single).push_back(r);
      printf("%-8s %6d %12.1f %12.1f %12.1f %12.2f %10.1f\n", pass == 0 ? "chunked" : "single", T, r.base_kb / 1024.0,
             r.peak_kb / 1024.0, (r.peak_kb - r.base_kb) / 1024.0, r.out_bytes / 1048576.0,
             r.seconds > 0 ? T / r.seconds : 0.0);
      fflush(stdout);
    }
  }
  if (!tmp.empty()) {
    std::string cmd = "rm -rf '" + tmp + "'";
    if (std::system(cmd.c_str()) != 0) {
    }
  }
  if (!ok || lengths.size() < 2) return ok ? 0 : 1;
  const Result &c0 = chunked.front(), &c1 = chunked.back(), &s0 = single.front(), &s1 = single.back();
  double c_growth = (c1.peak_kb - c0.peak_kb) * 1024.0, out_growth = static_cast<double>(c1.out_bytes - c0.out_bytes);
  printf("\nratios (%d vs %d frames):\n", lengths.back(), lengths.front());
  printf("  chunked peak growth / output growth: %.2f (%.1f MiB vs %.1f MiB; target <= 1.10)\n",
         out_growth > 0 ? c_growth / out_growth : 0.0, c_growth / 1048576.0, out_growth / 1048576.0);
  double excess = (c_growth - out_growth) / (c0.peak_kb * 1024.0);
  printf("  chunked peak growth beyond the output, relative to the peak: %.2f%% (target <= 10%%): %s\n",
         100.0 * excess, excess <= 0.10 ? "ok" : "OVER");
  printf("  single-pass peak growth / chunked peak growth: %.1fx\n",
         (s1.peak_kb - s0.peak_kb) / std::max(1.0, static_cast<double>(c1.peak_kb - c0.peak_kb)));
  printf("  single-pass peak / chunked peak at %d frames: %.2fx\n", lengths.back(),
         static_cast<double>(s1.peak_kb) / std::max(1L, c1.peak_kb));
  printf("  chunked throughput at %d frames: %.1f frames/s; single pass %.1f frames/s\n", lengths.back(),
         lengths.back() / c1.seconds, lengths.back() / s1.seconds);
  printf("  chunked encode time per frame: %.1f ms at %d frames, %.1f ms at %d frames\n",
         1000.0 * c0.seconds / lengths.front(), lengths.front(), 1000.0 * c1.seconds / lengths.back(), lengths.back());
  return 0;
}
