/* What the C++ benchmarks share: running a Python peer (PYTHON, default /usr/bin/python3, over a
 * script of bench/ in VIDEOTRAIN_SOURCE_DIR or the tree this was built from), peak memory, timing a
 * step (best of repeats after a warm-up), rounds against the peer in alternating order, and one
 * step under LibTorch's profiler. */
#pragma once

#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace benchutil {

// stdout of `cmd`; *rc its status when asked.
inline std::string run(const std::string &cmd, int *rc = nullptr) {
  std::string out;
  FILE *p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  if (rc) *rc = status;
  return out;
}

// "PYTHON SOURCE/bench/SCRIPT".
inline std::string peer_command(const std::string &script) {
  const char *py = std::getenv("PYTHON");
  const char *src = std::getenv("VIDEOTRAIN_SOURCE_DIR");
  return std::string(py ? py : "/usr/bin/python3") + " " + (src ? src : SOURCE_DIR) + "/bench/" + script;
}

// Peak resident memory of this process so far, MiB.
inline double peak_rss_mb() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;
}

// The "seconds_per_step" a peer printed; throws naming the command when it printed none.
inline double peer_seconds(const std::string &cmd) {
  const std::string out = run(cmd);
  const char *key = "\"seconds_per_step\": ";
  const auto at = out.find(key);
  if (at == std::string::npos) throw std::runtime_error("the peer printed no timing (" + cmd + "): " + out);
  return std::atof(out.c_str() + at + std::string(key).size());
}

// `rounds` of ours and the peer in alternating order (whichever runs second on a shared machine
// tends to gain a few percent), each printed; the median ratio ours / peer.
inline double median_ratio(int rounds, const std::function<double()> &ours, const std::function<double()> &peer,
                           const char *peer_name) {
  std::vector<double> ratios;
  for (int round = 0; round < rounds; round++) {
    double o, p;
    if (round % 2 == 0) o = ours(), p = peer();
    else p = peer(), o = ours();
    ratios.push_back(o / p);
    std::printf("round %d: ours %.3f s, peer (%s) %.3f s, ratio %.3f\n", round + 1, o, peer_name, p, o / p);
  }
  std::sort(ratios.begin(), ratios.end());
  return ratios[ratios.size() / 2];
}

// The fastest of `repeat` runs of `step` after one warm-up, seconds; `reset` before each.
inline double best_of(int repeat, const std::function<void()> &step, const std::function<void()> &reset) {
  double best = 1e30;
  for (int r = 0; r <= repeat; r++) {
    reset();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  return best;
}

// One `step` after a warm-up one under LibTorch's profiler, as a Chrome trace at `path` (where the
// time goes: chrome://tracing, or summed by op name).
inline void profile_step(const std::string &path, const std::function<void()> &step,
                         const std::function<void()> &reset) {
  step();
  reset();
  torch::autograd::profiler::RecordProfile rp(path);
  step();
}

}  // namespace benchutil
