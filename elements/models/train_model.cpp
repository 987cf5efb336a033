/* TrainModel: the model-independent parts (input checks, non-finite scan, caption hashing). The
 * models themselves are made in make_model.cpp, above every kind of model. */
#include "train_model.h"

#include <torch/torch.h>

#include <cctype>
#include <stdexcept>

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
  if (image_embeds.defined()) out.image_embeds = image_embeds.narrow(0, start, n);
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

}  // namespace videotrain
