/* The common part of the optimizers written here (8-bit AdamW, Adafactor, Prodigy, CAME):
 * per-parameter named state tensors created at the first step (as torch.optim does, so that
 * Prodigy's starting point is the weights after rank 0's broadcast), a step count and named
 * scalars, saved and loaded by name. */
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train_optimizer.h"

namespace videotrain {

class StateOptimizer : public TrainOptimizer {
 public:
  void set_lr(double lr) override { lr_ = lr; }
  void step() override;
  NamedTensors state(const std::vector<std::string> &param_names) override;

 protected:
  StateOptimizer(std::string kind, const OptimizerSettings &s, std::vector<at::Tensor> params)
      : TrainOptimizer(std::move(kind)), s_(s), lr_(s.lr), params_(std::move(params)), state_(params_.size()) {}
  // The state of parameter `p` before its first step, named.
  virtual NamedTensors initial_state(const at::Tensor &p) = 0;
  // One update (steps_ already counts it), under NoGradGuard.
  virtual void update() = 0;
  // Scalars saved with the state (Prodigy's d); pointers into the subclass.
  std::vector<std::pair<std::string, double *>> scalars_;

  // Parameter i's state tensor k (in initial_state()'s order).
  at::Tensor &st(size_t i, size_t k) { return state_[i][k].second; }

  OptimizerSettings s_;
  double lr_;
  int64_t steps_ = 0;
  std::vector<at::Tensor> params_;
  std::vector<NamedTensors> state_;  // empty until the first step

 private:
  void save_state(torch::serialize::OutputArchive &a) override;
  void load_state(torch::serialize::InputArchive &a) override;
};

}  // namespace videotrain
