/* TrainModel: the model-independent parts (input checks, non-finite scan, caption hashing) and
 * make_model(), which picks the TorchScript adapter (script_model.cpp), a built-in model users can
 * pick (builtin_models.cpp) or the test fixture builtin:linear-test (linear_test_model.cpp). */
#include "train_model.h"

#include <torch/torch.h>

#include <cctype>
#include <map>
#include <stdexcept>

#include "model_parts.h"
#include "param_snapshot.h"

namespace videotrain {

std::string first_non_finite(const NamedTensors &tensors) {
  std::vector<at::Tensor> flags;
  std::vector<const std::string *> names;
  for (const auto &[n, t] : tensors)
    if (t.defined() && t.is_floating_point()) {
      flags.push_back(t.detach().isfinite().logical_not().any().reshape({1}));
      names.push_back(&n);
    }
  if (flags.empty()) return "";
  const auto f = at::cat(flags).to(at::kCPU);
  const auto *bad = f.data_ptr<bool>();
  for (size_t i = 0; i < names.size(); i++)
    if (bad[i]) return *names[i];
  return "";
}

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

std::string first_non_finite(TrainModel &model) {
  NamedTensors all = model.named_parameters();
  for (auto &b : model.named_buffers()) all.push_back(std::move(b));
  return first_non_finite(all);
}

ModelInputs ModelInputs::narrow(int64_t start, int64_t n) const {
  ModelInputs out;
  out.latents = latents.narrow(0, start, n);
  for (int64_t i = start; i < start + n && i < static_cast<int64_t>(sample_ids.size()); i++) out.sample_ids.push_back(sample_ids[i]);
  out.epoch = epoch;
  for (int64_t i = start; i < start + n && i < static_cast<int64_t>(captions.size()); i++) out.captions.push_back(captions[i]);
  if (text_embeds.defined()) out.text_embeds = text_embeds.narrow(0, start, n);
  if (text_mask.defined()) out.text_mask = text_mask.narrow(0, start, n);
  if (condition.defined()) out.condition = condition.narrow(0, start, n);
  return out;
}

std::string check_model_inputs(const TrainModel &model, bool stream_has_text) {
  if (model.takes_text() == stream_has_text) return "";
  if (stream_has_text)
    return "model " + model.spec() +
           " takes captions (training_step(latents, captions)) but the stream carries text embeddings from a "
           "textencoder: use a model with training_step(latents, text_embeds, text_mask) (e.g. builtin:tiny-t2v), "
           "or remove the textencoder";
  return "model " + model.spec() +
         " takes text embeddings (training_step(latents, text_embeds, text_mask)) but the stream carries none: put a "
         "textencoder after vaeencoder (tokenizer=..., model=...)";
}

std::vector<std::string> builtin_model_names() { return {"tiny-unet3d", "tiny-t2v"}; }

bool model_dims_known(const std::string &spec, const ModelDims &dims) {
  if (!is_builtin_spec(spec)) return true;
  if (dims.latent_channels <= 0) return false;
  return spec != std::string(kBuiltinPrefix) + "tiny-t2v" || dims.text_dim > 0;
}

bool is_builtin_spec(const std::string &spec) { return spec.rfind(kBuiltinPrefix, 0) == 0; }

std::vector<int64_t> caption_token_ids(const std::string &caption, int64_t buckets) {
  // FNV-1a of each lower-cased alphanumeric word; id 0 stands for "no words".
  std::vector<int64_t> ids;
  uint64_t h = 1469598103934665603ull;
  bool in_word = false;
  auto flush = [&]() {
    if (in_word) ids.push_back(1 + static_cast<int64_t>(h % static_cast<uint64_t>(buckets - 1)));
    h = 1469598103934665603ull;
    in_word = false;
  };
  for (unsigned char ch : caption) {
    if (std::isalnum(ch)) {
      h = (h ^ static_cast<uint64_t>(std::tolower(ch))) * 1099511628211ull;
      in_word = true;
    } else {
      flush();
    }
  }
  flush();
  if (ids.empty()) ids.push_back(0);
  return ids;
}

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

