/* Helpers of the single-rank TrainerEngine tests: deterministic micro-batches,
 * a CPU configuration, feeding steps and comparing parameters. */
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "ddptrainsink/trainer_engine.h"

namespace enginetest {

using namespace videotrain;

// Deterministic data: sample k of step s.
inline at::Tensor sample(uint64_t step, int k, int64_t c = 4, int64_t t = 2, int64_t hw = 8) {
  auto g = at::detail::createCPUGenerator(1000 + step * 97 + k);
  return at::randn({c, t, hw, hw}, g);
}

inline BatchInfo info_for(uint64_t step, unsigned idx, unsigned count, unsigned m) {
  BatchInfo i;
  i.step = step;
  i.micro_index = idx;
  i.micro_count = count;
  i.step_samples = m * count;
  i.sync = idx + 1 == count;
  i.epoch = 0;
  i.next_clip = (step + 1) * m * count;
  for (unsigned k = 0; k < m; k++) i.captions.push_back(k % 2 ? "a red car" : "a cat on a mat");
  return i;
}

// Feeds `steps` steps of `count` micro-batches of `m` samples; returns the losses.
inline std::vector<double> train(TrainerEngine &e, uint64_t first, uint64_t steps, unsigned count, unsigned m,
                          int64_t c = 4) {
  std::vector<double> losses;
  for (uint64_t s = first; s < first + steps; s++) {
    for (unsigned i = 0; i < count; i++) {
      std::vector<at::Tensor> xs;
      for (unsigned k = 0; k < m; k++) xs.push_back(sample(s, static_cast<int>(i * m + k), c));
      auto r = e.process_tensor(at::stack(xs), info_for(s, i, count, m));
      EXPECT_NE(r, ProcessResult::kError) << e.error();
      if (r == ProcessResult::kError) return losses;
    }
    losses.push_back(e.last_loss());
  }
  return losses;
}

inline TrainerConfig cpu_config(const std::string &model) {
  TrainerConfig c;
  c.model = model;
  c.device = "cpu";
  c.lr = 1e-3;
  c.seed = 7;
  c.world_size = 1;
  c.rank = 0;
  return c;
}

inline double max_rel_diff(const std::map<std::string, std::vector<float>> &a,
                    const std::map<std::string, std::vector<float>> &b) {
  double worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (const auto &[name, va] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    const auto &vb = it->second;
    EXPECT_EQ(va.size(), vb.size()) << name;
    for (size_t i = 0; i < std::min(va.size(), vb.size()); i++) {
      double d = std::abs(double(va[i]) - vb[i]) / std::max(1e-3, std::abs(double(va[i])));
      worst = std::max(worst, d);
    }
  }
  return worst;
}

}  // namespace enginetest
