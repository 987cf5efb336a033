/* load_snapshot: see param_snapshot.h. */
#include "param_snapshot.h"

#include <torch/torch.h>

#include <map>
#include <stdexcept>

namespace videotrain {

void load_snapshot(TrainModel &model, const ParamSnapshot &snap) {
  torch::NoGradGuard ng;
  auto copy = [&](NamedTensors dst, const NamedTensors &src) {
    std::map<std::string, const at::Tensor *> by;
    for (const auto &[name, t] : src) by[name] = &t;
    for (auto &[name, t] : dst) {
      auto it = by.find(name);
      if (it == by.end() || it->second->sizes() != t.sizes())
        throw std::runtime_error("snapshot of model '" + snap.model + "' does not match at '" + name + "'");
      t.copy_(*it->second);
    }
  };
  copy(model.named_parameters(), snap.parameters);
  copy(model.named_buffers(), snap.buffers);
  model.train(false);
}

}  // namespace videotrain
