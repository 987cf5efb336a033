/* optimizer=adamw and optimizer=sgd: LibTorch's torch::optim::AdamW and SGD behind
 * TrainOptimizer, their optimizer.pt LibTorch's own format (AdamW's is the one checkpoints
 * had before optimizer= existed, so those resume). */
#include <sstream>
#include <type_traits>

#include "train_optimizer.h"

namespace videotrain {

namespace {

template <class Key>
Key state_key(const at::Tensor &p) {
  // LibTorch 1.x keys the state by the printed TensorImpl address, 2.x by the address.
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

template <class Opt, class Options, class ParamState>
class TorchOptimizer : public TrainOptimizer {
 public:
  TorchOptimizer(const std::string &kind, const std::vector<at::Tensor> &params, const Options &o)
      : TrainOptimizer(kind), params_(params), opt_(params, o) {}
  void set_lr(double lr) override {
    for (auto &g : opt_.param_groups()) static_cast<Options &>(g.options()).lr(lr);
  }
  void step() override { opt_.step(); }
  NamedTensors state(const std::vector<std::string> &names) override {
    using Key = typename std::decay_t<decltype(opt_.state())>::key_type;
    NamedTensors out;
    auto &state = opt_.state();
    for (size_t i = 0; i < params_.size(); i++) {
      auto it = state.find(state_key<Key>(params_[i]));
      if (it == state.end()) continue;
      const std::string of = " of " + (i < names.size() ? names[i] : "parameter " + std::to_string(i));
      auto *s = dynamic_cast<ParamState *>(it->second.get());
      if (!s) continue;
      if constexpr (std::is_same_v<ParamState, torch::optim::AdamWParamState>) {
        out.emplace_back("exp_avg" + of, s->exp_avg());
        out.emplace_back("exp_avg_sq" + of, s->exp_avg_sq());
        out.emplace_back("max_exp_avg_sq" + of, s->max_exp_avg_sq());
      } else {
        out.emplace_back("momentum_buffer" + of, s->momentum_buffer());
      }
    }
    return out;
  }
  bool elementwise() const override { return true; }
  NamedTensors param_state(size_t i, int64_t *step) override {
    using Key = typename std::decay_t<decltype(opt_.state())>::key_type;
    *step = 0;
    auto &state = opt_.state();
    auto it = state.find(state_key<Key>(params_.at(i)));
    if (it == state.end()) return {};
    auto *s = dynamic_cast<ParamState *>(it->second.get());
    if (!s) return {};
    if constexpr (std::is_same_v<ParamState, torch::optim::AdamWParamState>) {
      *step = s->step();
      return {{"exp_avg", s->exp_avg()}, {"exp_avg_sq", s->exp_avg_sq()}};
    } else {
      if (!s->momentum_buffer().defined()) return {};
      return {{"momentum_buffer", s->momentum_buffer()}};
    }
  }
  void set_param_state(size_t i, const NamedTensors &named, int64_t step) override {
    using Key = typename std::decay_t<decltype(opt_.state())>::key_type;
    if (named.empty()) return;
    auto s = std::make_unique<ParamState>();
    for (const auto &[n, t] : named) {
      if constexpr (std::is_same_v<ParamState, torch::optim::AdamWParamState>) {
        if (n == "exp_avg") s->exp_avg(t);
        else if (n == "exp_avg_sq") s->exp_avg_sq(t);
        else throw std::runtime_error("adamw has no state '" + n + "'");
      } else {
        if (n == "momentum_buffer") s->momentum_buffer(t);
        else throw std::runtime_error("sgd has no state '" + n + "'");
      }
    }
    if constexpr (std::is_same_v<ParamState, torch::optim::AdamWParamState>) s->step(step);
    opt_.state()[state_key<Key>(params_.at(i))] = std::move(s);
  }

 private:
  void save_state(torch::serialize::OutputArchive &a) override { opt_.save(a); }
  void load_state(torch::serialize::InputArchive &a) override { opt_.load(a); }
  std::vector<at::Tensor> params_;
  Opt opt_;
};

}  // namespace

std::unique_ptr<TrainOptimizer> make_torch_adamw(const OptimizerSettings &s, const std::vector<at::Tensor> &params) {
  auto o = torch::optim::AdamWOptions(s.lr)
               .betas(std::make_tuple(s.beta1, s.beta2))
               .eps(s.eps)
               .weight_decay(s.weight_decay);
  return std::make_unique<TorchOptimizer<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>>(
      "adamw", params, o);
}

std::unique_ptr<TrainOptimizer> make_torch_sgd(const OptimizerSettings &s, const std::vector<at::Tensor> &params) {
  // weight-decay is torch.optim.SGD's: added to the gradient (L2), not decoupled.
  auto o = torch::optim::SGDOptions(s.lr).momentum(s.x.momentum).nesterov(s.x.nesterov).weight_decay(s.weight_decay);
  return std::make_unique<TorchOptimizer<torch::optim::SGD, torch::optim::SGDOptions, torch::optim::SGDParamState>>(
      "sgd", params, o);
}

}  // namespace videotrain
