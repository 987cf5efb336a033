#include "script_encoder.h"

#include <ATen/ATen.h>
#include <torch/script.h>

#include <algorithm>
#include <stdexcept>

#include "jit_load.h"
#include "models/vae/vae_config.h"

namespace videotrain::vae {

namespace {

class ScriptEncoder final : public VaeEncoder {
 public:
  ScriptEncoder(torch::jit::Module module, bool per_frame, int micro_batch)
      : module_(std::move(module)), per_frame_(per_frame), micro_batch_(micro_batch) {
    name_ = "TorchScript";
    cache_name_ = "torchscript";
    native_ = false;
  }

  at::Tensor forward(const at::Tensor &x, StreamCache &) const override {
    if (!per_frame_) return call(x, 5);
    at::Tensor frames = x.select(0, 0).transpose(0, 1);  // [n, 3, H, W]
    std::vector<at::Tensor> outs;
    for (int64_t s = 0; s < frames.size(0); s += micro_batch_)
      outs.push_back(call(frames.narrow(0, s, std::min<int64_t>(micro_batch_, frames.size(0) - s)).contiguous(), 4));
    return at::cat(outs, 0).transpose(0, 1).unsqueeze(0);  // [1, C, n, h, w]
  }

 private:
  at::Tensor call(const at::Tensor &x, int64_t want_dim) const {
    // get_method is not const; the module itself is not changed by a call.
    c10::IValue out = const_cast<torch::jit::Module &>(module_).get_method("encode")({x});
    if (out.isTuple()) out = out.toTupleRef().elements().at(0);
    if (!out.isTensor()) throw std::runtime_error("the TorchScript encode method did not return a tensor");
    at::Tensor t = out.toTensor();
    if (t.dim() != want_dim || t.size(0) != x.size(0))
      throw std::runtime_error("the TorchScript encode method returned shape " + shape_str(t.sizes().vec()) +
                               " for input " + shape_str(x.sizes().vec()) + "; expected " + std::to_string(want_dim) +
                               " dimensions with the same batch");
    return t;
  }

  torch::jit::Module module_;
  bool per_frame_;
  int micro_batch_;
};

}  // namespace

std::unique_ptr<VaeEncoder> load_script_encoder(const std::string &path, c10::Device device, c10::ScalarType dtype,
                                                bool per_frame, int micro_batch) {
  torch::jit::Module module;
  try {
    module = jit_load(path, device);
    module.eval();
    module.to(dtype);
  } catch (const std::exception &e) {
    const std::string w = e.what();
    throw std::runtime_error("model '" + path + "' is neither a VAE folder nor a loadable TorchScript file: " +
                             w.substr(0, w.find('\n')));
  }
  if (!module.find_method("encode")) throw std::runtime_error("TorchScript model '" + path + "' has no 'encode' method");
  return std::make_unique<ScriptEncoder>(std::move(module), per_frame, micro_batch);
}

}  // namespace videotrain::vae
