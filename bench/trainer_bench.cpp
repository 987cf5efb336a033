/* Trainer overhead: the step time of TrainerEngine against a plain PyTorch loop in
 * Python (/usr/bin/python3) training the same TorchScript model on the same batch
 * with the same number of threads. Prints both and the ratio (target: <= 1).
 *
 *   trainer-bench [--steps N] [--threads N] [--shape B,C,T,H,W] [--device cpu|cuda:0] [--precision fp32|bf16]
 * On CUDA both sides wait for the device at the end of each step (the engine's loss read). 
 * Needs bench/trainer_bench.py (found through VIDEOTRAIN_SOURCE_DIR or beside the
 * source tree) and PYTHON (default /usr/bin/python3). */
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ddptrainsink/trainer_engine.h"

using namespace videotrain;

static std::string run(const std::string &cmd) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE *)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p.get())) out += buf;
  return out;
}

int main(int argc, char **argv) {
  int steps = 20, threads = 2;
  std::string device = "cpu", precision = "fp32";
  std::vector<int64_t> shape{2, 16, 4, 16, 16};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--device") device = argv[i + 1];
    else if (a == "--precision") precision = argv[i + 1];
    else if (a == "--shape") {
      shape.clear();
      std::stringstream s(argv[i + 1]);
      for (std::string v; std::getline(s, v, ',');) shape.push_back(std::atoll(v.c_str()));
    }
  }
  const char *src = std::getenv("VIDEOTRAIN_SOURCE_DIR");
  std::string script = std::string(src ? src : SOURCE_DIR) + "/bench/trainer_bench.py";
  const char *pyenv = std::getenv("PYTHON");
  std::string py = pyenv ? pyenv : "/usr/bin/python3";
  std::string model = (std::filesystem::temp_directory_path() / "videotrain-trainer-bench.pt").string();
  if (std::system((py + " " + script + " make " + model).c_str()) != 0) {
    std::fprintf(stderr, "cannot make the bench model with %s %s\n", py.c_str(), script.c_str());
    return 1;
  }
  at::set_num_threads(threads);

  TrainerConfig c;
  c.model = model;
  c.device = device;
  c.precision = precision;
  c.rank = 0;
  c.world_size = 1;
  c.log_every = 0;
  c.lr = 1e-4;
  TrainerEngine e(c);
  if (!e.start()) {
    std::fprintf(stderr, "engine: %s\n", e.error().c_str());
    return 1;
  }
  auto x = at::randn(shape, at::detail::createCPUGenerator(1)).to(at::Device(device));
  const bool cuda = x.is_cuda();
  BatchInfo info;
  info.step_samples = static_cast<unsigned>(shape[0]);
  info.captions.assign(shape[0], "a caption");
  std::vector<double> times;
  for (int s = 0; s < steps; s++) {
    auto t0 = std::chrono::steady_clock::now();
    if (e.process_tensor(x, info) != ProcessResult::kOk) {
      std::fprintf(stderr, "engine: %s\n", e.error().c_str());
      return 1;
    }
    if (cuda) torch::cuda::synchronize();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<double> warm(times.begin() + (times.size() > 4 ? 2 : 0), times.end());
  std::sort(warm.begin(), warm.end());
  const double engine_ms = warm[warm.size() / 2];

  // The Python loop as it comes, and with the heap settings the engine's tune-malloc
  // applies (glibc reads them from the environment): the second ratio is the engine's
  // own overhead, the first what a user sees.
  auto py_loop = [&](const std::string &env) -> double {
    std::ostringstream cmd;
    cmd << env << py << " " << script << " loop " << model << " " << steps << " " << threads;
    for (auto v : shape) cmd << " " << v;
    cmd << " " << device << " " << precision;
    std::string out = run(cmd.str());
    auto k = out.find("\"median_ms\":");
    if (k == std::string::npos) {
      std::fprintf(stderr, "python loop failed: %s\n", out.c_str());
      return -1;
    }
    return std::atof(out.c_str() + k + 12);
  };
  const double py_ms = py_loop("");
  const double py_tuned_ms = py_loop("MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728 ");
  if (py_ms < 0 || py_tuned_ms < 0) return 1;
  std::printf("trainer step, batch [");
  for (size_t i = 0; i < shape.size(); i++) std::printf("%s%lld", i ? "," : "", static_cast<long long>(shape[i]));
  std::printf("], %s %s, %d threads, %d steps (median)\n", device.c_str(), precision.c_str(), threads, steps);
  std::printf("  ddptrainsink engine : %8.2f ms\n", engine_ms);
  std::printf("  PyTorch loop (py)   : %8.2f ms\n", py_ms);
  std::printf("  ratio engine/python : %8.3f  (target <= 1)\n", engine_ms / py_ms);
  std::printf("  PyTorch loop, same malloc settings as tune-malloc : %8.2f ms (ratio %.3f)\n", py_tuned_ms,
              engine_ms / py_tuned_ms);
  std::filesystem::remove(model);
  return 0;
}
