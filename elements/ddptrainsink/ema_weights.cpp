/* EMA of the trainable parameters: see ema_weights.h. */
#include "ema_weights.h"

#include <torch/torch.h>

#include <sstream>

#include "models/weights_io.h"
#include "safetensors.h"

namespace videotrain {

EmaSchedule::Action EmaSchedule::action(uint64_t step) const {
  if (!on()) return Action::kNone;
  if (step <= start_step) return Action::kCopy;
  return (step - start_step) % (every ? every : 1) == 0 ? Action::kAverage : Action::kNone;
}

std::string EmaSchedule::check() const {
  if (!(decay >= 0 && decay < 1))
    return "ema-decay " + std::to_string(decay) + " is not in [0, 1) (0: no EMA; 0.999 averages over ~1000 updates)";
  if (every == 0) return "ema-every is 0: give 1 or more optimizer steps";
  return "";
}

EmaWeights::EmaWeights(const EmaSchedule &schedule, const NamedTensors &params) : schedule_(schedule) {
  torch::NoGradGuard ng;
  for (const auto &[name, p] : params) ema_.emplace_back(name, p.detach().to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true));
}

void EmaWeights::reset(const std::vector<at::Tensor> &params) {
  torch::NoGradGuard ng;
  for (size_t i = 0; i < ema_.size(); i++) ema_[i].second.copy_(params.at(i).detach());
}

void EmaWeights::update(uint64_t step, const std::vector<at::Tensor> &params) {
  const auto a = schedule_.action(step);
  if (a == EmaSchedule::Action::kNone) return;
  if (a == EmaSchedule::Action::kCopy) return reset(params);
  torch::NoGradGuard ng;
  const double d = schedule_.decay;
  for (size_t i = 0; i < ema_.size(); i++) {
    auto &e = ema_[i].second;
    e.mul_(d).add_(params.at(i).detach().to(torch::kFloat), 1.0 - d);
  }
}

void EmaWeights::save(const std::string &path, uint64_t step) const {
  std::vector<SafetensorsOutTensor> out;
  for (const auto &[name, t] : ema_) out.push_back(models::out_tensor(name, t));
  std::ostringstream d;
  d.precision(17);
  d << schedule_.decay;
  const std::map<std::string, std::string> meta{{"format", "pt"},
                                                {"videotrain.ema_decay", d.str()},
                                                {"videotrain.ema_start_step", std::to_string(schedule_.start_step)},
                                                {"videotrain.ema_every", std::to_string(schedule_.every)},
                                                {"videotrain.step", std::to_string(step)}};
  std::string err;
  if (!write_safetensors(path, out, meta, &err)) throw std::runtime_error(err);
}

std::map<std::string, at::Tensor> read_ema_file(const std::string &path) {
  std::string err;
  auto f = SafetensorsFile::open(path, &err);
  if (!f) throw std::runtime_error(err);
  std::map<std::string, at::Tensor> out;
  for (const auto &[name, e] : f->entries()) {
    if (e.dtype != "F32") throw std::runtime_error("'" + path + "' holds '" + name + "' as " + e.dtype + ", not F32");
    out[name] = models::tensor_of(e);
  }
  return out;
}

void EmaWeights::load(const std::string &path) {
  auto file = read_ema_file(path);
  torch::NoGradGuard ng;
  for (auto &[name, t] : ema_) {
    const auto it = file.find(name);
    if (it == file.end())
      throw std::runtime_error("EMA file '" + path + "' has no '" + name + "', which this run trains");
    if (it->second.sizes() != t.sizes()) {
      std::ostringstream s;
      s << "EMA file '" << path << "' holds '" << name << "' as " << it->second.sizes() << ", this run trains "
        << t.sizes();
      throw std::runtime_error(s.str());
    }
    t.copy_(it->second);
    file.erase(it);
  }
  if (!file.empty())
    throw std::runtime_error("EMA file '" + path + "' holds '" + file.begin()->first + "', which this run does not train");
}

// The parameters' data is swapped, not copied: float32 parameters read the average's own storage,
// so that exporting a 14B model's EMA needs no third copy of it.
EmaWeights::Applied::Applied(const EmaWeights &ema, const std::vector<at::Tensor> &params) : params_(params) {
  torch::NoGradGuard ng;
  for (size_t i = 0; i < params_.size(); i++) {
    kept_.push_back(params_[i].variable_data());
    params_[i].set_data(ema.ema_.at(i).second.to(params_[i].scalar_type()));
  }
}

EmaWeights::Applied::~Applied() {
  torch::NoGradGuard ng;
  for (size_t i = 0; i < kept_.size(); i++) params_[i].set_data(kept_[i]);
}

}  // namespace videotrain
