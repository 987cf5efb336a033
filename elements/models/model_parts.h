/* What the model sources share (elements/models only, torch TUs): the built-in models' common
 * layers and their TrainModel wrapper, and the factories make_model() dispatches to. */
#pragma once

#include <torch/torch.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "safetensors.h"
#include "train_model.h"
#include "weights_io.h"

namespace videotrain {

constexpr const char *kBuiltinPrefix = "builtin:";
constexpr int64_t kCaptionBuckets = 4096;

// A TorchScript file (script_model.cpp). Throws naming the file.
std::unique_ptr<TrainModel> make_script_model(const std::string &path, const c10::Device &device);
// A diffusers transformer folder (native_model.cpp). Throws naming the folder and what is wrong.
std::unique_ptr<TrainModel> make_native_model(const std::string &dir, const c10::Device &device,
                                              const ModelOptions &options);
// Two native Wan experts as one model (options.model_2, options.boundary_ratio > 0): expert_pair_model.cpp.
std::unique_ptr<TrainModel> make_expert_pair_model(const std::string &dir, const c10::Device &device,
                                                   const ModelOptions &options);
// builtin:tiny-unet3d and builtin:tiny-t2v (builtin_models.cpp); null for another name.
std::unique_ptr<TrainModel> make_public_builtin(const std::string &name, const ModelDims &dims,
                                                const c10::Device &device);
// builtin:linear-test, a fixture for tests (linear_test_model.cpp); null for another name.
std::unique_ptr<TrainModel> make_test_builtin(const std::string &name, const ModelDims &dims,
                                              const c10::Device &device);

// Mean embedding of each caption's words (caption_token_ids) for a batch of `batch` samples.
at::Tensor caption_bag(torch::nn::EmbeddingBag &bag, const std::vector<std::string> &captions, int64_t batch,
                       const c10::Device &device);
// A Conv3d module's forward through conv3d_fast (oneDNN on CPU even for one sample). Every conv
// here has odd kernels and "same" padding, so the padding is kernel / 2; it is not read from the
// options because its type is a variant that differs between LibTorch versions.
at::Tensor conv(const torch::nn::Conv3d &m, const at::Tensor &x);

// A built-in torch::nn model M (with kTakesText, training_step, validation_step) as a TrainModel;
// its weights saved as safetensors.
template <typename M>
class BuiltinModel : public TrainModel {
 public:
  BuiltinModel(std::string name, const ModelDims &dims, const c10::Device &device)
      : name_(std::move(name)), dims_(dims), net_(dims) {
    net_->to(device);
    net_->train(true);
  }
  std::string spec() const override { return kBuiltinPrefix + name_; }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (const auto &p : net_->named_parameters(true)) out.emplace_back(p.key(), p.value());
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (const auto &b : net_->named_buffers(true)) out.emplace_back(b.key(), b.value());
    return out;
  }
  bool takes_text() const override { return M::ContainedType::kTakesText; }
  at::Tensor training_step(const ModelInputs &in) override { return net_->training_step(in); }
  at::Tensor validation_step(const ModelInputs &in, const std::vector<int64_t> &seeds) override {
    return net_->validation_step(in, seeds);
  }
  void train(bool on) override { net_->train(on); }
  std::string save(const std::string &dir) override {
    std::vector<SafetensorsOutTensor> out;
    auto add = [&](const NamedTensors &ts) {
      for (const auto &[name, t] : ts) out.push_back(models::out_tensor(name, t));
    };
    add(named_parameters());
    add(named_buffers());
    std::string err;
    std::map<std::string, std::string> meta{{"model", spec()},
                                            {"latent_channels", std::to_string(dims_.latent_channels)},
                                            {"text_dim", std::to_string(dims_.text_dim)}};
    if (!write_safetensors(dir + "/model.safetensors", out, meta, &err)) throw std::runtime_error(err);
    return "model.safetensors";
  }
  void load(const std::string &dir) override {
    std::string err;
    auto f = SafetensorsFile::open(dir + "/model.safetensors", &err);
    if (!f) throw std::runtime_error(err);
    torch::NoGradGuard ng;
    auto copy_all = [&](const NamedTensors &ts) {
      for (const auto &[name, t] : ts) {
        const auto *e = f->find(name);
        if (!e || e->dtype != "F32" || e->shape != t.sizes().vec())
          throw std::runtime_error("checkpoint '" + f->path() + "' does not match " + spec() + " at " + name);
        auto src = torch::from_blob(const_cast<uint8_t *>(e->data), e->shape, torch::kFloat);
        t.copy_(src);
      }
    };
    copy_all(named_parameters());
    copy_all(named_buffers());
  }

 private:
  std::string name_;
  ModelDims dims_;
  M net_;
};

}  // namespace videotrain
