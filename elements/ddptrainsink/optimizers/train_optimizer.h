/* The optimizers of ddptrainsink behind one small interface: AdamW and SGD are LibTorch's
 * (torch_optimizers.cpp), 8-bit AdamW, Adafactor, Prodigy and CAME are ours (one file each,
 * over state_optimizer.h). The engine sets the scheduled lr, steps, saves/loads the state of
 * a checkpoint and checks it for NaN/Inf through this interface alone. */
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optimizer_settings.h"

namespace videotrain {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class TrainOptimizer {
 public:
  virtual ~TrainOptimizer() = default;
  const std::string &kind() const { return kind_; }
  // The learning rate of the next step (the lr schedule's).
  virtual void set_lr(double lr) = 0;
  // One update of the parameters from their .grad() (a parameter without one is left alone).
  virtual void step() = 0;
  // The state in an archive (optimizer.pt), marked with kind(); load() refuses another kind's
  // state or state that does not fit the parameters, naming what differs.
  void save(torch::serialize::OutputArchive &a);
  void load(torch::serialize::InputArchive &a);
  // Every state tensor, named "<state> of <parameter name>" (non-finite checks, memory).
  virtual NamedTensors state(const std::vector<std::string> &param_names) = 0;
  // Optimizers whose state is elementwise (tensors of the parameter's shape and a step count:
  // adamw, sgd) can have it read and set per parameter, which sharded training needs to move it
  // between layouts; the others say false.
  virtual bool elementwise() const { return false; }
  // Parameter i's state by name (empty before its first update) and its step count.
  virtual NamedTensors param_state(size_t i, int64_t *step) {
    (void)i;
    *step = 0;
    return {};
  }
  // Sets parameter i's state: the names param_state() gives, tensors of the parameter's shape.
  virtual void set_param_state(size_t i, const NamedTensors &state, int64_t step) { (void)i, (void)state, (void)step; }

 protected:
  explicit TrainOptimizer(std::string kind) : kind_(std::move(kind)) {}
  virtual void save_state(torch::serialize::OutputArchive &a) = 0;
  virtual void load_state(torch::serialize::InputArchive &a) = 0;

 private:
  std::string kind_;
};

// The optimizer `s` names over `params` (resolved settings: see resolve_optimizer_settings()).
// Throws std::invalid_argument for an unknown kind.
std::unique_ptr<TrainOptimizer> make_optimizer(const OptimizerSettings &s, const std::vector<at::Tensor> &params);

// Bytes the tensors hold (the optimizer's state memory).
size_t state_bytes(const NamedTensors &tensors);

}  // namespace videotrain
