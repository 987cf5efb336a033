/* make_optimizer(), the settings' defaults and checks, the kind mark of optimizer.pt and the
 * state handling common to the optimizers written here. */
#include "train_optimizer.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "state_optimizer.h"

namespace videotrain {

std::unique_ptr<TrainOptimizer> make_torch_adamw(const OptimizerSettings &s, const std::vector<at::Tensor> &params);
std::unique_ptr<TrainOptimizer> make_torch_sgd(const OptimizerSettings &s, const std::vector<at::Tensor> &params);
std::unique_ptr<TrainOptimizer> make_adamw8bit(const OptimizerSettings &s, const std::vector<at::Tensor> &params);
std::unique_ptr<TrainOptimizer> make_adafactor(const OptimizerSettings &s, const std::vector<at::Tensor> &params);
std::unique_ptr<TrainOptimizer> make_prodigy(const OptimizerSettings &s, const std::vector<at::Tensor> &params);
std::unique_ptr<TrainOptimizer> make_came(const OptimizerSettings &s, const std::vector<at::Tensor> &params);

const char *optimizer_kinds() { return "adamw, adamw8bit, adafactor, prodigy, came, sgd"; }

std::string resolve_optimizer_settings(OptimizerSettings *s) {
  const std::string &k = s->kind;
  if (k != "adamw" && k != "adamw8bit" && k != "adafactor" && k != "prodigy" && k != "came" && k != "sgd")
    return "optimizer '" + k + "' is not one of " + optimizer_kinds();
  OptimizerExtras &x = s->x;
  if (s->eps < 0) s->eps = k == "adafactor" ? std::numeric_limits<float>::epsilon() : k == "came" ? 1e-30 : 1e-8;
  if (x.eps2 < 0) x.eps2 = k == "came" ? 1e-16 : 1e-3;
  if (x.beta3 < 0) x.beta3 = k == "came" ? 0.9999 : std::sqrt(s->beta2);
  const bool adam_like = k == "adamw" || k == "adamw8bit" || k == "prodigy" || k == "came";
  if (adam_like && !(s->beta1 < 1 && s->beta2 < 1))
    return "optimizer=" + k + " needs beta1 and beta2 below 1 (properties beta1, beta2)";
  if (k == "came" && !(x.beta3 < 1)) return "optimizer=came needs beta3 below 1 (property beta3)";
  if (k == "prodigy" && !(x.beta3 < 1)) return "optimizer=prodigy needs beta3 below 1 (property beta3)";
  if (k == "sgd" && x.nesterov && !(x.momentum > 0))
    return "optimizer=sgd with nesterov=true needs momentum > 0 (property momentum, e.g. 0.9)";
  if ((k == "adafactor" || k == "came") && !(x.clip_threshold > 0))
    return "optimizer=" + k + " needs clip-threshold > 0";
  if (k == "adafactor" && !(x.beta2_decay <= 0))
    return "beta2-decay must be 0 or below (adafactor's 1 - beta2 at step t is t^beta2-decay)";
  if (k == "prodigy" && !(x.d0 > 0 && x.d_coef > 0)) return "optimizer=prodigy needs d0 > 0 and d-coef > 0";
  return "";
}

std::unique_ptr<TrainOptimizer> make_optimizer(const OptimizerSettings &s, const std::vector<at::Tensor> &params) {
  if (s.kind == "adamw") return make_torch_adamw(s, params);
  if (s.kind == "sgd") return make_torch_sgd(s, params);
  if (s.kind == "adamw8bit") return make_adamw8bit(s, params);
  if (s.kind == "adafactor") return make_adafactor(s, params);
  if (s.kind == "prodigy") return make_prodigy(s, params);
  if (s.kind == "came") return make_came(s, params);
  throw std::invalid_argument("optimizer '" + s.kind + "' is not one of " + optimizer_kinds());
}

size_t state_bytes(const NamedTensors &tensors) {
  size_t n = 0;
  for (const auto &[name, t] : tensors)
    if (t.defined()) n += t.numel() * t.element_size();
  return n;
}

// optimizer.pt names the optimizer that wrote it; files without the mark are AdamW's (written
// before optimizer= existed).
static const char kKindKey[] = "videotrain_optimizer";

void TrainOptimizer::save(torch::serialize::OutputArchive &a) {
  save_state(a);
  a.write(kKindKey, c10::IValue(kind_));
}

void TrainOptimizer::load(torch::serialize::InputArchive &a) {
  c10::IValue v;
  const std::string was = a.try_read(kKindKey, v) && v.isString() ? v.toStringRef() : std::string("adamw");
  if (was != kind_)
    throw std::runtime_error("its optimizer state is optimizer=" + was + "'s and this run has optimizer=" + kind_ +
                             " (resume with optimizer=" + was + ", or start a new checkpoint-dir)");
  load_state(a);
}

void StateOptimizer::step() {
  torch::NoGradGuard ng;
  if (steps_ == 0 && !state_.empty() && state_[0].empty())
    for (size_t i = 0; i < params_.size(); i++) state_[i] = initial_state(params_[i]);
  steps_++;
  update();
}

NamedTensors StateOptimizer::state(const std::vector<std::string> &param_names) {
  NamedTensors out;
  for (size_t i = 0; i < state_.size(); i++)
    for (const auto &[name, t] : state_[i])
      out.emplace_back(name + " of " + (i < param_names.size() ? param_names[i] : "parameter " + std::to_string(i)),
                       t);
  return out;
}

// Archive keys cannot hold dots: "p<index>_<state>".
void StateOptimizer::save_state(torch::serialize::OutputArchive &a) {
  a.write("steps", c10::IValue(steps_));
  for (const auto &[name, v] : scalars_) a.write(name, c10::IValue(*v));
  for (size_t i = 0; i < state_.size(); i++)
    for (const auto &[name, t] : state_[i]) a.write("p" + std::to_string(i) + "_" + name, t, /*is_buffer=*/true);
}

void StateOptimizer::load_state(torch::serialize::InputArchive &a) {
  torch::NoGradGuard ng;
  c10::IValue v;
  a.read("steps", v);
  const int64_t steps = v.toInt();
  std::vector<double> values;
  for (const auto &[name, ptr] : scalars_) {
    a.read(name, v);
    values.push_back(v.toDouble());
  }
  std::vector<NamedTensors> state(params_.size());
  if (steps > 0)
    for (size_t i = 0; i < params_.size(); i++) {
      state[i] = initial_state(params_[i]);
      for (auto &[name, t] : state[i]) {
        const std::string key = "p" + std::to_string(i) + "_" + name;
        at::Tensor read;
        if (!a.try_read(key, read, /*is_buffer=*/true))
          throw std::runtime_error("its " + kind() + " state has no " + name + " of parameter " + std::to_string(i) +
                                   " (another model?)");
        if (read.sizes() != t.sizes() || read.scalar_type() != t.scalar_type())
          throw std::runtime_error("its " + kind() + " state's " + name + " of parameter " + std::to_string(i) +
                                   " has shape " + c10::str(read.sizes()) + ", this model's needs " +
                                   c10::str(t.sizes()) + " (another model?)");
        t.copy_(read);
      }
    }
  // Only a state that fits replaces this one.
  steps_ = steps;
  for (size_t k = 0; k < scalars_.size(); k++) *scalars_[k].second = values[k];
  state_ = std::move(state);
}

}  // namespace videotrain
