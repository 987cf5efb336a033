/* vae-memory-bench: peak memory of the VAE encoder against clip length, chunked streaming
 * (norm-scope=chunk), streaming with whole-clip statistics (norm-scope=clip) and one whole-clip
 * pass, and throughput; the time ratio clip / chunk per length.
 *
 *   vae-memory-bench [--model DIR | --config tiny|mid | --family wan21|wan22] [--size 256] [--frames 17,49,97]
 *                    [--threads N] [--device cpu|cuda:N] [--dtype float32|bfloat16|float16]
 *                    [--spill auto|memory|file] [--modes chunk,clip,single] [--repeat N]
 *                    [--tune-malloc true|false]
 *
 * Each case runs in a fresh process (fork) and reports its peak resident set (VmHWM), or
 * on CUDA the caching allocator's allocated bytes (current after loading, peak), so
 * cases do not see each other's allocations. Without --model, a seeded random
 * CogVideoX-architecture VAE is written to a temporary folder (no downloads): tiny (the
 * reference's shape, 16-32 channels) or mid (64-256 channels, 2 resnets per block, 32 groups);
 * --family wan21|wan22 takes the tiny Wan VAEs of tests/reference/wan_vae
 * (VIDEOTRAIN_REFERENCE_DIR), which stream frame 0 then groups of 4 (no clip scope: no GroupNorm),
 * and prints the encode time per frame.
 * A clip-scope case's activations go where --spill says (auto: a temporary file on CPU); a
 * file's pages are in the page cache, not in the process's resident set. --repeat N runs every
 * case N times, the modes of one length in turn, and keeps the shortest time (a busy machine)
 * and the median peak (where the C heap places blocks varies from run to run).
 * Targets: the chunked peak grows by no more than the encoder output (within 10%) from the
 * shortest to the longest clip (clip scope: plus the uint8 frames it keeps); the single pass
 * grows with T; clip scope takes at most 4x the chunked time. */
#include <ATen/ATen.h>
#include <algorithm>
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
#include <map>
#include <string>
#include <vector>

#include "models/vae/vae_config.h"
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
enum class Mode { Chunk, Clip, Single };
const char *mode_name(Mode m) { return m == Mode::Chunk ? "chunk" : m == Mode::Clip ? "clip" : "single"; }

struct Setup {
  std::string model, device = "cpu", dtype = "float32";
  int size = 256, threads = 2;
  ClipSpill spill = ClipSpill::Auto;
  bool tune_malloc = true;
};

Result run_case(const Setup &su, int T, Mode mode) {
  const std::string &model = su.model, &device = su.device, &dtype = su.dtype;
  const int size = su.size, threads = su.threads;
  const bool chunked = mode != Mode::Single;
  Result r;
  // tune-malloc=false: fixed malloc thresholds, large blocks go straight back to the system
  // when freed. true (the element's default): the engine keeps them in the heap.
  if (!su.tune_malloc) {
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    mallopt(M_TRIM_THRESHOLD, 64 * 1024);
  }
  at::set_num_threads(threads);
  EngineOptions o;
  o.tune_malloc = su.tune_malloc;
  o.model = model;
  o.device = device;
  o.dtype = dtype;
  const c10::Device dev(device);
  o.latent = LatentKind::Moments;
  o.allow_any_length = true;
  o.norm_scope = mode == Mode::Clip ? NormScope::Clip : NormScope::Chunk;
  o.clip_spill = su.spill;
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

Result in_child(const Setup &su, int T, Mode mode) {
  int fds[2];
  Result r;
  if (pipe(fds) != 0) return r;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Result c = run_case(su, T, mode);
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

std::vector<std::string> split(char *arg) {
  std::vector<std::string> out;
  for (char *s = strtok(arg, ","); s; s = strtok(nullptr, ",")) out.push_back(s);
  return out;
}

}  // namespace

int main(int argc, char **argv) {
  gst_init(&argc, &argv);
  Setup su;
  std::string config = "tiny", spill = "auto", family = "cogvideox";
  std::vector<int> lengths{17, 49, 97};
  std::vector<Mode> modes{Mode::Chunk, Mode::Clip, Mode::Single};
  bool bad = false;
  int repeat = 1;
  for (int i = 1; i < argc && !bad; i++) {
    std::string a = argv[i];
    bool has = i + 1 < argc;
    if (a == "--model" && has) {
      su.model = argv[++i];
    } else if (a == "--family" && has) {
      family = argv[++i];
      bad = family != "cogvideox" && family != "wan21" && family != "wan22";
    } else if (a == "--config" && has) {
      config = argv[++i];
      bad = config != "tiny" && config != "mid";
    } else if (a == "--size" && has) {
      su.size = std::atoi(argv[++i]);
    } else if (a == "--threads" && has) {
      su.threads = std::atoi(argv[++i]);
    } else if (a == "--device" && has) {
      su.device = argv[++i];
    } else if (a == "--dtype" && has) {
      su.dtype = argv[++i];
    } else if (a == "--spill" && has) {
      spill = argv[++i];
      su.spill = spill == "file" ? ClipSpill::File : spill == "memory" ? ClipSpill::Memory : ClipSpill::Auto;
      bad = spill != "file" && spill != "memory" && spill != "auto";
    } else if (a == "--frames" && has) {
      lengths.clear();
      for (const auto &f : split(argv[++i])) lengths.push_back(std::atoi(f.c_str()));
    } else if (a == "--tune-malloc" && has) {
      const std::string v = argv[++i];
      su.tune_malloc = v == "true";
      bad = v != "true" && v != "false";
    } else if (a == "--repeat" && has) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--modes" && has) {
      modes.clear();
      for (const auto &m : split(argv[++i])) {
        if (m == "chunk") modes.push_back(Mode::Chunk);
        else if (m == "clip") modes.push_back(Mode::Clip);
        else if (m == "single") modes.push_back(Mode::Single);
        else bad = true;
      }
    } else {
      bad = true;
    }
  }
  if (bad) {
    fprintf(stderr,
            "usage: %s [--model DIR | --config tiny|mid | --family wan21|wan22] [--size 256] [--frames 17,49,97] [--threads N] "
            "[--device cpu|cuda:N] [--dtype float32|bfloat16|float16] [--spill auto|memory|file] "
            "[--modes chunk,clip,single] [--repeat N] [--tune-malloc true|false]\n",
            argv[0]);
    return 2;
  }
  std::string tmp;
  if (su.model.empty() && family != "cogvideox") {
    const char *ref = std::getenv("VIDEOTRAIN_REFERENCE_DIR");
    su.model = std::string(ref ? ref : "tests/reference") + "/wan_vae/tiny_" + family;
    modes.erase(std::remove(modes.begin(), modes.end(), Mode::Clip), modes.end());
  }
  if (su.model.empty()) {
    char tmpl[] = "/tmp/vae-bench-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    tmp = tmpl;
    su.model = tmp + "/vae";
    std::string err;
    if (!make_random_vae(su.model, config == "mid" ? mid_config() : tiny_config(), 1, "F32", &err)) {
      fprintf(stderr, "%s\n", err.c_str());
      return 1;
    }
  }
  printf("VAE encoder memory and time, %dx%d frames, model %s, %s %s, %d threads, clip-scope spill %s, "
         "tune-malloc %s, a fresh process per case%s\n",
         su.size, su.size, tmp.empty() ? su.model.c_str() : (config + " random CogVideoX VAE").c_str(),
         su.device.c_str(), su.dtype.c_str(), su.threads, spill.c_str(), su.tune_malloc ? "true" : "false",
         su.device == "cpu" ? "" : " (GPU allocator bytes)");
  printf("%-8s %6s %12s %12s %12s %12s %10s %10s\n", "mode", "frames", "base MiB", "peak MiB", "growth MiB",
         "output MiB", "seconds", "frames/s");
  std::map<Mode, std::vector<Result>> res;
  bool ok = true;
  for (int T : lengths) {
    std::map<Mode, Result> best;
    std::map<Mode, std::vector<long>> peaks, bases;
    for (int rep = 0; rep < repeat; rep++)
      for (Mode m : modes) {
        Result r = in_child(su, T, m);
        ok = ok && r.ok;
        peaks[m].push_back(r.peak_kb);
        bases[m].push_back(r.base_kb);
        if (rep == 0 || r.seconds < best[m].seconds) best[m] = r;
      }
    for (Mode m : modes) {
      Result &r = best[m];
      // Memory: the median run (allocator placement varies from run to run); time: the fastest.
      std::sort(peaks[m].begin(), peaks[m].end());
      std::sort(bases[m].begin(), bases[m].end());
      r.peak_kb = peaks[m][peaks[m].size() / 2];
      r.base_kb = bases[m][bases[m].size() / 2];
      if (repeat > 1) {
        printf("%-8s %6d peak MiB of each run:", mode_name(m), T);
        for (long p : peaks[m]) printf(" %.1f", p / 1024.0);
        printf("\n");
      }
      res[m].push_back(r);
      printf("%-8s %6d %12.1f %12.1f %12.1f %12.2f %10.2f %10.1f\n", mode_name(m), T, r.base_kb / 1024.0,
             r.peak_kb / 1024.0, (r.peak_kb - r.base_kb) / 1024.0, r.out_bytes / 1048576.0, r.seconds,
             r.seconds > 0 ? T / r.seconds : 0.0);
      fflush(stdout);
    }
  }
  if (!tmp.empty()) {
    std::string cmd = "rm -rf '" + tmp + "'";
    if (std::system(cmd.c_str()) != 0) {
    }
  }
  if (!ok) return 1;
  if (res.count(Mode::Chunk) && res.count(Mode::Clip)) {
    printf("\nnorm-scope=clip against norm-scope=chunk (target: time ratio <= 4):\n");
    for (size_t i = 0; i < lengths.size(); i++) {
      const Result &c = res[Mode::Chunk][i], &k = res[Mode::Clip][i];
      printf("  %3d frames: time ratio clip/chunk %.2f (%.2f s vs %.2f s); peak %.1f MiB vs %.1f MiB "
             "(uint8 frames kept: %.1f MiB)\n",
             lengths[i], k.seconds / c.seconds, k.seconds, c.seconds, k.peak_kb / 1024.0, c.peak_kb / 1024.0,
             lengths[i] * 3.0 * su.size * su.size / 1048576.0);
    }
  }
  if (lengths.size() < 2 || !res.count(Mode::Chunk)) return 0;
  const Result &c0 = res[Mode::Chunk].front(), &c1 = res[Mode::Chunk].back();
  double c_growth = (c1.peak_kb - c0.peak_kb) * 1024.0, out_growth = static_cast<double>(c1.out_bytes - c0.out_bytes);
  printf("\nratios (%d vs %d frames):\n", lengths.back(), lengths.front());
  printf("  chunked peak growth / output growth: %.2f (%.1f MiB vs %.1f MiB; target <= 1.10)\n",
         out_growth > 0 ? c_growth / out_growth : 0.0, c_growth / 1048576.0, out_growth / 1048576.0);
  double excess = (c_growth - out_growth) / (c0.peak_kb * 1024.0);
  printf("  chunked peak growth beyond the output, relative to the peak: %.2f%% (target <= 10%%): %s\n",
         100.0 * excess, excess <= 0.10 ? "ok" : "OVER");
  if (res.count(Mode::Clip)) {
    const Result &k0 = res[Mode::Clip].front(), &k1 = res[Mode::Clip].back();
    double frames = (lengths.back() - lengths.front()) * 3.0 * su.size * su.size;
    double k_excess = ((k1.peak_kb - k0.peak_kb) * 1024.0 - out_growth - frames) / (k0.peak_kb * 1024.0);
    printf("  clip-scope peak growth beyond the output and the kept uint8 frames, relative to the peak: %.2f%% "
           "(target <= 10%%): %s\n",
           100.0 * k_excess, k_excess <= 0.10 ? "ok" : "OVER");
  }
  if (res.count(Mode::Single)) {
    const Result &s0 = res[Mode::Single].front(), &s1 = res[Mode::Single].back();
    printf("  single-pass peak growth / chunked peak growth: %.1fx\n",
           (s1.peak_kb - s0.peak_kb) / std::max(1.0, static_cast<double>(c1.peak_kb - c0.peak_kb)));
    printf("  single-pass peak / chunked peak at %d frames: %.2fx\n", lengths.back(),
           static_cast<double>(s1.peak_kb) / std::max(1L, c1.peak_kb));
    printf("  chunked throughput at %d frames: %.1f frames/s; single pass %.1f frames/s\n", lengths.back(),
           lengths.back() / c1.seconds, lengths.back() / s1.seconds);
  }
  printf("  chunked encode time per frame: %.1f ms at %d frames, %.1f ms at %d frames\n",
         1000.0 * c0.seconds / lengths.front(), lengths.front(), 1000.0 * c1.seconds / lengths.back(), lengths.back());
  return 0;
}
