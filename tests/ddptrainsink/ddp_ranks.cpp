/* See ddp_ranks.h. */
#include "ddp_ranks.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "multirank.h"

using namespace videotrain;

namespace ddptest {

at::Tensor sample(int step, int k) {
  auto g = at::detail::createCPUGenerator(5000 + step * 31 + k);
  return at::randn({kC, 2, 4, 4}, g);
}

std::string caption(int k) { return k % 3 == 0 ? "waves on a beach" : (k % 3 == 1 ? "a dog runs" : ""); }

BatchInfo micro_info(int step, unsigned idx, unsigned count, unsigned step_samples) {
  BatchInfo info;
  info.step = step;
  info.micro_index = idx;
  info.micro_count = count;
  info.step_samples = step_samples;
  info.sync = idx + 1 == count;
  info.next_clip = (step + 1) * step_samples;
  return info;
}

ProcessResult feed_result(TrainerEngine &e, int step, int first, int m, unsigned idx, unsigned count,
                          unsigned step_samples, bool nan) {
  std::vector<at::Tensor> xs;
  BatchInfo info = micro_info(step, idx, count, step_samples);
  for (int k = first; k < first + m; k++) {
    xs.push_back(sample(step, k));
    info.captions.push_back(caption(k));
  }
  auto x = at::stack(xs);
  if (nan) x[0][0][0][0][0] = std::numeric_limits<float>::quiet_NaN();
  return e.process_tensor(x, info);
}

void feed(TrainerEngine &e, int step, int first, int m, unsigned idx, unsigned count, unsigned step_samples) {
  ASSERT_EQ(feed_result(e, step, first, m, idx, count, step_samples), ProcessResult::kOk) << e.error();
}

TrainerConfig config() {
  TrainerConfig c;
  c.model = "builtin:linear-test";
  c.device = "cpu";
  c.lr = 1e-2;
  c.seed = 3;
  c.backend = "gloo";
  c.log_every = 1;
  c.bucket_cap_mb = 0.01;  // several buckets even for this small model
  return c;
}

void write_params(const std::string &path, const Params &p) {
  std::ofstream out(path, std::ios::binary);
  for (const auto &[name, v] : p) {
    uint64_t n = v.size();
    out << name << '\n';
    out.write(reinterpret_cast<const char *>(&n), sizeof(n));
    out.write(reinterpret_cast<const char *>(v.data()), n * sizeof(float));
  }
}

Params read_params(const std::string &path) {
  Params p;
  std::ifstream in(path, std::ios::binary);
  std::string name;
  while (std::getline(in, name)) {
    uint64_t n = 0;
    in.read(reinterpret_cast<char *>(&n), sizeof(n));
    std::vector<float> v(n);
    in.read(reinterpret_cast<char *>(v.data()), n * sizeof(float));
    p[name] = std::move(v);
  }
  return p;
}

void expect_params_near(Params got, const Params &want, const std::string &who, double rel) {
  ASSERT_EQ(got.size(), want.size()) << who;
  for (const auto &[name, v] : want) {
    ASSERT_EQ(got[name].size(), v.size()) << who << " " << name;
    double d2 = 0, n2 = 0;
    for (size_t i = 0; i < v.size(); i++) {
      const double d = double(got[name][i]) - v[i];
      d2 += d * d;
      n2 += double(v[i]) * v[i];
    }
    EXPECT_LE(std::sqrt(d2 / std::max(n2, 1e-30)), rel) << who << " " << name;
  }
}

pid_t spawn_worker(const std::string &worker, const std::string &mode, int rank, int port, const std::string &out,
            std::vector<std::pair<std::string, std::string>> env) {
  env.emplace_back("VT_DDP_MODE", mode);
  env.emplace_back("VT_DDP_OUT", out);
  return vttest::spawn_rank(worker, rank, 2, port, env);
}

}  // namespace ddptest
