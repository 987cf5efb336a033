/* make_model(): the one place that knows every kind of TrainModel (declared in train_model.h) and
 * picks the TorchScript adapter (script_model.cpp), a diffusers folder's native transformer
 * (native_model.cpp, expert_pair_model.cpp), a built-in model users can pick (builtin_models.cpp) or
 * the test fixture builtin:linear-test (linear_test_model.cpp). */
#include <stdexcept>

#include "model_parts.h"
#include "train_model.h"

namespace videotrain {

std::vector<std::string> builtin_model_names() { return {"tiny-unet3d", "tiny-t2v"}; }

bool model_dims_known(const std::string &spec, const ModelDims &dims) {
  if (!is_builtin_spec(spec)) return true;
  if (dims.latent_channels <= 0) return false;
  return spec != std::string(kBuiltinPrefix) + "tiny-t2v" || dims.text_dim > 0;
}

bool is_builtin_spec(const std::string &spec) { return spec.rfind(kBuiltinPrefix, 0) == 0; }

std::unique_ptr<TrainModel> make_model(const std::string &spec, const ModelDims &dims, const c10::Device &device,
                                       const ModelOptions &options) {
  if (is_model_folder(spec) && !options.model_2.empty()) return make_expert_pair_model(spec, device, options);
  if (is_model_folder(spec)) return make_native_model(spec, device, options);
  if (!is_builtin_spec(spec)) return make_script_model(spec, device);
  const std::string name = spec.substr(std::string(kBuiltinPrefix).size());
  if (dims.latent_channels <= 0)
    throw std::runtime_error("model " + spec + " needs the latent channel count (property latent-channels)");
  if (auto m = make_public_builtin(name, dims, device)) return m;
  if (auto m = make_test_builtin(name, dims, device)) return m;
  std::string known;
  for (const auto &n : builtin_model_names()) known += (known.empty() ? "" : ", ") + std::string(kBuiltinPrefix) + n;
  throw std::runtime_error("unknown built-in model '" + spec + "' (property model; known: " + known +
                           ", or a TorchScript file)");
}

}  // namespace videotrain
