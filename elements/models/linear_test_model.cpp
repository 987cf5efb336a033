/* builtin:linear-test, a fixture for tests: a deterministic model, a 1x1x1 conv plus a caption
 * bias regressed onto a fixed function of the input (no noise), so that tests can predict its
 * losses and weights. It builds like the other built-ins but is left out of
 * builtin_model_names() and of the messages and blurbs that list the models users can pick. */
#include "model_parts.h"

namespace videotrain {

namespace {

struct LinearTestImpl : torch::nn::Module {
  static constexpr bool kTakesText = false;
  explicit LinearTestImpl(const ModelDims &dims) : LinearTestImpl(dims.latent_channels) {}
  explicit LinearTestImpl(int64_t c)
      : proj(torch::nn::Conv3dOptions(c, c, 1)),
        caption(torch::nn::EmbeddingBagOptions(kCaptionBuckets, c).mode(torch::kMean)) {
    register_module("proj", proj);
    register_module("caption", caption);
  }
  at::Tensor training_step(const ModelInputs &in) { return per_sample_error(in.latents, in.captions).mean(); }
  at::Tensor validation_step(const ModelInputs &in, const std::vector<int64_t> &) {
    return per_sample_error(in.latents, in.captions);
  }
  // Squared error against a fixed target, averaged per sample; draws no noise.
  at::Tensor per_sample_error(const at::Tensor &x, const std::vector<std::string> &captions) {
    auto pred = conv(proj, x) + caption_bag(caption, captions, x.size(0), x.device()).view({x.size(0), -1, 1, 1, 1});
    auto target = 0.5 * x.flip({1}) + 0.25;
    return (pred.to(torch::kFloat) - target.to(torch::kFloat)).pow(2).mean({1, 2, 3, 4});
  }
  torch::nn::Conv3d proj;
  torch::nn::EmbeddingBag caption;
};
TORCH_MODULE(LinearTest);

}  // namespace

std::unique_ptr<TrainModel> make_test_builtin(const std::string &name, const ModelDims &dims,
                                              const c10::Device &device) {
  if (name == "linear-test") return std::make_unique<BuiltinModel<LinearTest>>(name, dims, device);
  return nullptr;
}

}  // namespace videotrain
