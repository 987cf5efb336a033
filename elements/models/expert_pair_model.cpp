/* Wan 2.2 A14B's two experts trained as one model: each sample's sigma is drawn over the full range
 * (draw_flow) and the sample trains the expert WanPipeline calls at that timestep; one loss over the
 * step's samples. The experts are the native models of their folders (LoRA, trainable as asked);
 * expert 2's parameters are renamed (expert_pair.h) so one optimizer, reducer and checkpoint hold both. */
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <filesystem>

#include "expert_pair.h"
#include "image_condition.h"
#include "model_parts.h"
#include "native_model.h"

namespace videotrain {

namespace {

class ExpertPairModel : public TrainModel {
 public:
  ExpertPairModel(std::unique_ptr<TrainModel> high, std::unique_ptr<TrainModel> low, const ModelOptions &o)
      : high_(std::move(high)), low_(std::move(low)), opt_(o) {
    if (high_->dit()->family() != "wan" || low_->dit()->family() != "wan")
      throw std::runtime_error("model-2 pairs two Wan experts (Wan 2.2 A14B's transformer and transformer_2); " +
                               high_->spec() + " is " + high_->dit()->class_name() + ", " + low_->spec() + " is " +
                               low_->dit()->class_name());
    if (high_->dit()->latent_channels() != low_->dit()->latent_channels() ||
        high_->dit()->condition_channels() != low_->dit()->condition_channels() ||
        high_->dit()->text_dim() != low_->dit()->text_dim())
      throw std::runtime_error("model " + high_->spec() + " and model-2 " + low_->spec() +
                               " differ in latent channels or text width: both experts must come from one pipeline");
    if (!(o.boundary_ratio > 0 && o.boundary_ratio < 1))
      throw std::runtime_error("boundary-ratio " + std::to_string(o.boundary_ratio) + " is not in (0, 1)");
  }
  std::string spec() const override { return high_->spec(); }
  NamedTensors named_parameters() override {
    NamedTensors out = high_->named_parameters();
    for (auto &[n, t] : low_->named_parameters()) out.emplace_back(models::expert2_name(n), t);
    return out;
  }
  NamedTensors named_buffers() override { return {}; }
  bool takes_text() const override { return true; }
  void train(bool on) override {
    high_->train(on);
    low_->train(on);
  }
  models::DitModel *dit() override { return high_->dit(); }
  models::DitModel *dit_2() override { return low_->dit(); }
  double boundary_ratio() const override { return opt_.boundary_ratio; }

  at::Tensor training_step(const ModelInputs &in) override {
    const auto x0 = checked_latents(in);
    std::vector<uint64_t> ids = in.sample_ids;
    unsigned epoch = in.epoch;
    if (ids.size() != static_cast<size_t>(x0.size(0))) {  // no sample ids: the step's default generator, as one model
      ids.assign(x0.size(0), 0);
      for (auto &id : ids) id = static_cast<uint64_t>(torch::randint(INT64_MAX, {1}, torch::kLong).item<int64_t>());
      epoch = 0;
    }
    at::Tensor sigma, noise, x_t, t, target;
    models::draw_flow(x0, ids, epoch, opt_, &sigma, &noise);
    models::flow_terms(x0, noise, sigma, &x_t, &t, &target);
    const auto text = models::zero_text_padding(in.text_embeds, in.text_mask);
    const auto w = models::flow_loss_weights(sigma, opt_.loss_weighting);
    const auto input = model_input(x_t, in);
    // mean_i w_i mse_i over all m samples = sum over experts of (n_e / m) * that expert's mean.
    const double m = static_cast<double>(x0.size(0));
    at::Tensor loss;
    bool used_high = false, used_low = false;
    for (const auto &[idx, dit] : split(t)) {
      const auto pred = dit->forward(input.index_select(0, idx), t.index_select(0, idx), text.index_select(0, idx));
      const auto l = models::flow_loss(pred, target.index_select(0, idx), w.index_select(0, idx)) *
                     (static_cast<double>(idx.numel()) / m);
      loss = loss.defined() ? loss + l : l;
      (dit == high_->dit() ? used_high : used_low) = true;
    }
    // An expert without samples here gets zero gradients, not none: the optimizer then steps both
    // experts at every step on one rank as on several (where the reducer fills zeros, as DDP does for
    // unused parameters), so runs agree whatever the rank count.
    for (auto *e : {used_high ? nullptr : high_.get(), used_low ? nullptr : low_.get()})
      if (e)
        for (auto &[n, p] : e->named_parameters())
          if (p.requires_grad()) loss = loss + 0.0 * p.reshape(-1)[0].to(loss.scalar_type());
    return loss;
  }

  // As one model's (same noise per seed), each val sigma evaluated by its expert.
  at::Tensor validation_step(const ModelInputs &in, const std::vector<int64_t> &seeds) override {
    const auto x0 = checked_latents(in);
    const int64_t m = x0.size(0);
    const auto noise = models::seeded_noise(x0, seeds);
    const auto text = models::zero_text_padding(in.text_embeds, in.text_mask);
    at::Tensor total;
    for (double s : opt_.val_sigmas) {
      at::Tensor x_t, t, target;
      models::flow_terms(x0, noise, torch::full({m}, s, x0.options().dtype(torch::kFloat)), &x_t, &t, &target);
      auto *dit = expert_of(t[0].item<float>());
      const auto pred = dit->forward(model_input(x_t, in), t, text);
      const auto l = (pred.to(torch::kFloat) - target.to(torch::kFloat)).pow(2).flatten(1).mean(1);
      total = total.defined() ? total + l : l;
    }
    return total / static_cast<double>(opt_.val_sigmas.size());
  }

  // A checkpoint: expert 1's files as one model's, expert 2's in the subfolder transformer_2/.
  std::string save(const std::string &dir) override {
    const std::string file = high_->save(dir);
    const std::string sub = dir + "/" + models::kExpert2Prefix;
    std::filesystem::create_directories(sub);
    low_->save(sub);
    return file;
  }
  void load(const std::string &dir) override {
    high_->load(dir);
    const std::string sub = dir + "/" + models::kExpert2Prefix;
    if (!std::filesystem::is_directory(sub))
      throw std::runtime_error("'" + dir + "' holds one model, not two experts (no " + models::kExpert2Prefix +
                               "/): it was written by a run without model-2");
    low_->load(sub);
  }
  std::string export_name() const override { return high_->export_name(); }
  // transformer/ and transformer_2/ (lora/ and lora_2/), as the pipeline folder holds them.
  bool export_folder(const std::string &dir, const std::string &dtype) override {
    std::filesystem::create_directories(dir);
    return high_->export_folder(dir, dtype) && low_->export_folder(models::expert2_dir(dir), dtype);
  }

 private:
  models::DitModel *expert_of(double timestep) {
    return models::high_noise_timestep(timestep, opt_.boundary_ratio) ? high_->dit() : low_->dit();
  }
  // Each expert's sample indices (int64 on t's device), experts without samples left out.
  std::vector<std::pair<at::Tensor, models::DitModel *>> split(const at::Tensor &t) {
    const auto tc = t.to(torch::kCPU, torch::kFloat).contiguous();
    std::vector<int64_t> hi, lo;
    for (int64_t i = 0; i < tc.numel(); i++)
      (models::high_noise_timestep(tc.data_ptr<float>()[i], opt_.boundary_ratio) ? hi : lo).push_back(i);
    std::vector<std::pair<at::Tensor, models::DitModel *>> out;
    const auto opts = torch::TensorOptions().dtype(torch::kLong);
    if (!hi.empty()) out.emplace_back(torch::tensor(hi, opts).to(t.device()), high_->dit());
    if (!lo.empty()) out.emplace_back(torch::tensor(lo, opts).to(t.device()), low_->dit());
    return out;
  }
  // x_t with the samples' condition after it for Wan 2.2 I2V A14B's experts (image_condition.h).
  at::Tensor model_input(const at::Tensor &x_t, const ModelInputs &in) const {
    return models::with_condition(x_t, in.condition, high_->dit()->condition_channels(), high_->spec());
  }
  at::Tensor checked_latents(const ModelInputs &in) const {
    auto *dit = high_->dit();
    const int64_t noisy = dit->latent_channels() - dit->condition_channels();
    if (in.latents.size(1) != noisy)
      throw std::runtime_error("micro-batch has " + std::to_string(in.latents.size(1)) + " latent channels; " +
                               high_->spec() + " takes " + std::to_string(noisy) +
                               ": use the VAE of the same model family");
    if (!in.has_text())
      throw std::runtime_error(high_->spec() + " (" + dit->class_name() +
                               ") needs text embeddings: put a textencoder after vaeencoder");
    if (in.text_embeds.size(2) != dit->text_dim())
      throw std::runtime_error("text embeddings have " + std::to_string(in.text_embeds.size(2)) + " dimensions; " +
                               high_->spec() + " takes " + std::to_string(dit->text_dim()) + " (umT5-XXL for Wan)");
    return in.latents;
  }
  std::unique_ptr<TrainModel> high_, low_;
  ModelOptions opt_;
};

}  // namespace

std::unique_ptr<TrainModel> make_expert_pair_model(const std::string &dir, const c10::Device &device,
                                                   const ModelOptions &options) {
  if (!is_model_folder(options.model_2))
    throw std::runtime_error("model-2 '" + options.model_2 + "' is not a diffusers transformer folder (no config.json)");
  ModelOptions one = options;
  one.model_2.clear();
  auto high = make_native_model(dir, device, one);
  auto low = make_native_model(options.model_2, device, one);
  return std::make_unique<ExpertPairModel>(std::move(high), std::move(low), options);
}

}  // namespace videotrain
