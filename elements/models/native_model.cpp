/* Native transformers from diffusers folders and their objectives: see native_model.h. */
#include "native_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "cogvideox_transformer.h"
#include "dit_precheck.h"
#include "image_condition.h"
#include "layers.h"
#include "lora.h"
#include "model_parts.h"
#include "schedules.h"
#include "seeded_hash.h"
#include "wan_transformer.h"
#include "weights_io.h"

namespace videotrain {

namespace models {

std::vector<std::string> DitModel::linear_names() {
  std::vector<std::string> out;
  for (const auto &[name, l] : linear_modules(module())) out.push_back(name);
  return out;
}

const ModelFamily &DitModel::descriptor() const {
  const ModelFamily *f = family_of_class(class_name());
  if (!f) throw std::logic_error(class_name() + " has no entry in model_family.cpp");
  return *f;
}

std::string DitModel::save(const std::string &dir, at::ScalarType dtype, uint64_t max_shard_bytes) {
  return save_folder(module(), dir, config_json(), "diffusion_pytorch_model", dtype, max_shard_bytes);
}

namespace {

class WanDit : public DitModel {
 public:
  explicit WanDit(const WanConfig &c) : net_(c) {}
  std::string class_name() const override { return "WanTransformer3DModel"; }
  torch::nn::Module &module() override { return *net_; }
  at::Tensor forward(const at::Tensor &x, const at::Tensor &t, const at::Tensor &text) override {
    return net_->forward(x, t, text);
  }
  at::Tensor forward_image(const at::Tensor &x, const at::Tensor &t, const at::Tensor &text,
                           const at::Tensor &image) override {
    return net_->forward(x, t, text, image);
  }
  int64_t image_dim() const override { return net_->cfg.image_dim; }
  int64_t images_per_sample() const override { return net_->cfg.image_dim ? (net_->cfg.pos_embed_seq_len ? 2 : 1) : 0; }
  std::vector<int64_t> patch_size() const override { return {net_->cfg.patch_size[0], net_->cfg.patch_size[1], net_->cfg.patch_size[2]}; }
  bool image_to_video() const override { return net_->cfg.image_dim || net_->cfg.in_channels != net_->cfg.out_channels; }
  int64_t condition_channels() const override { return net_->cfg.in_channels - net_->cfg.out_channels; }
  void set_checkpointing(Checkpointing c) override { net_->checkpointing = c; }
  Checkpointing checkpointing() const override { return net_->checkpointing; }
  void set_block_hooks(BlockHooks *h) override { net_->block_hooks = h; }
  std::string block_prefix() const override { return "blocks."; }
  void set_attention_backend(AttentionBackend b) override { net_->attention_backend = b; }
  std::string config_json() const override { return wan_transformer_config_json(net_->cfg); }
  int64_t latent_channels() const override { return net_->cfg.in_channels; }
  int64_t text_dim() const override { return net_->cfg.text_dim; }

 private:
  WanTransformer net_;
};

// CogVideoX: hidden_states [B, F, C, H, W] (frames before channels), as diffusers' class takes them.
class CogVideoXDit : public DitModel {
 public:
  explicit CogVideoXDit(const CogVideoXConfig &c) : net_(c) {}
  std::string class_name() const override { return "CogVideoXTransformer3DModel"; }
  torch::nn::Module &module() override { return *net_; }
  at::Tensor forward(const at::Tensor &x, const at::Tensor &t, const at::Tensor &text) override {
    return net_->forward(x, t, text);
  }
  int64_t temporal_patch() const override { return std::max<int64_t>(1, net_->cfg.patch_size_t); }
  // I2V (5b-I2V, 1.5-I2V): the image latents after the noisy ones on channels.
  bool image_to_video() const override { return net_->cfg.in_channels != net_->cfg.out_channels; }
  int64_t condition_channels() const override { return net_->cfg.in_channels - net_->cfg.out_channels; }
  void set_checkpointing(Checkpointing c) override { net_->checkpointing = c; }
  Checkpointing checkpointing() const override { return net_->checkpointing; }
  void set_block_hooks(BlockHooks *h) override { net_->block_hooks = h; }
  std::string block_prefix() const override { return "transformer_blocks."; }
  void set_attention_backend(AttentionBackend b) override { net_->attention_backend = b; }
  std::string config_json() const override { return cogvideox_transformer_config_json(net_->cfg); }
  int64_t latent_channels() const override { return net_->cfg.in_channels; }
  int64_t text_dim() const override { return net_->cfg.text_embed_dim; }

 private:
  CogVideoXTransformer net_;
};

std::string class_of(const std::string &config_text) {
  const auto j = nlohmann::json::parse(config_text, nullptr, false);
  if (j.is_object() && j.contains("_class_name") && j["_class_name"].is_string()) return j["_class_name"].get<std::string>();
  return "";
}

std::unique_ptr<DitModel> build_from(const std::string &config_text, const std::string &where, const c10::Device &device) {
  const std::string cls = class_of(config_text);
  std::unique_ptr<DitModel> m;
  if (cls == "WanTransformer3DModel") {
    WanConfig c;
    std::string err;
    if (!parse_wan_transformer_config(config_text, &c, &err)) throw std::runtime_error("'" + where + "': " + err);
    m = std::make_unique<WanDit>(c);
  } else if (cls == "CogVideoXTransformer3DModel") {
    CogVideoXConfig c;
    std::string err;
    if (!parse_cogvideox_transformer_config(config_text, &c, &err))
      throw std::runtime_error("'" + where + "' (CogVideoXTransformer3DModel): " + err);
    m = std::make_unique<CogVideoXDit>(c);
  } else {
    throw std::runtime_error("'" + where + "' is a " + (cls.empty() ? std::string("folder without a _class_name") : cls) +
                             "; ddptrainsink trains WanTransformer3DModel and CogVideoXTransformer3DModel folders (a diffusers transformer/ "
                             "subfolder), TorchScript files or builtin: models");
  }
  m->module().to(device);
  return m;
}

}  // namespace

std::unique_ptr<DitModel> build_dit(const std::string &config_json, const c10::Device &device) {
  return build_from(config_json, "config.json", device);
}

std::unique_ptr<DitModel> open_dit(const std::string &dir, const c10::Device &device) {
  DiffusersFolder folder;
  std::string err;
  if (!open_diffusers_folder(dir, "diffusion_pytorch_model", &folder, &err)) throw std::runtime_error(err);
  if (std::string why = precheck_dit_folder(folder); !why.empty()) throw std::runtime_error(why);  // before allocating
  auto m = build_from(folder.config_text, dir + "/config.json", device);
  load_strict(m->module(), folder);
  return m;
}

void draw_flow(const at::Tensor &x0, const std::vector<uint64_t> &ids, unsigned epoch, const ModelOptions &o,
               at::Tensor *sigma, at::Tensor *noise, std::vector<FlowDraw> *draws) {
  const int64_t m = x0.size(0);
  const double shift = sample_shift(o, x0.size(-2), x0.size(-1));
  std::vector<double> sig(m);
  std::vector<at::Tensor> ns;
  const auto cpu = torch::TensorOptions().dtype(torch::kFloat), f64 = torch::TensorOptions().dtype(torch::kDouble);
  if (draws) draws->assign(m, FlowDraw{});
  for (int64_t i = 0; i < m; i++) {
    const uint64_t seed = sample_noise_seed(o.seed, ids.at(i), epoch);
    auto g = at::detail::createCPUGenerator(seed);
    // The first number as torch.randn / torch.rand of one float64 draws it (what diffusers' density
    // functions draw from a generator under torch.float64), then the noise.
    const double draw = (draws_normal(o) ? at::randn({1}, g, f64) : at::rand({1}, g, f64)).item<double>();
    const double u = timestep_density(o, draw);
    sig[i] = flow_sigma(o, u, shift);
    if (draws) (*draws)[i] = FlowDraw{seed, draw, u, shift, sig[i], flow_loss_weight(o.loss_weighting, sig[i])};
    ns.push_back(at::randn(x0[i].sizes(), g, cpu));
  }
  *sigma = torch::tensor(sig, torch::kDouble).to(x0.device(), torch::kFloat);
  *noise = torch::stack(ns).to(x0.device(), x0.scalar_type());
}

at::Tensor flow_loss_weights(const at::Tensor &sigma, const std::string &weighting) {
  const auto s = sigma.to(torch::kCPU, torch::kDouble).contiguous();
  std::vector<double> w(s.numel());
  for (int64_t i = 0; i < s.numel(); i++) w[i] = flow_loss_weight(weighting, s.data_ptr<double>()[i]);
  return torch::tensor(w, torch::kDouble).to(sigma.device(), torch::kFloat);
}

at::Tensor flow_loss(const at::Tensor &pred, const at::Tensor &target, const at::Tensor &weights) {
  const auto e = (pred.to(torch::kFloat) - target.to(torch::kFloat)).pow(2);
  std::vector<int64_t> shape(e.dim(), 1);
  shape[0] = e.size(0);
  return (weights.to(e.device(), torch::kFloat).view(shape) * e).flatten(1).mean(1).mean();
}

void flow_terms(const at::Tensor &x0, const at::Tensor &noise, const at::Tensor &sigma, at::Tensor *x_t,
                at::Tensor *timestep, at::Tensor *target) {
  std::vector<int64_t> shape(x0.dim(), 1);
  shape[0] = x0.size(0);
  const auto s = sigma.to(x0.scalar_type()).view(shape);
  *x_t = (1 - s) * x0 + s * noise;
  *timestep = sigma.to(torch::kFloat) * 1000.0;
  *target = noise - x0;
}

at::Tensor zero_text_padding(const at::Tensor &text_embeds, const at::Tensor &text_mask) {
  if (!text_mask.defined()) return text_embeds;
  return text_embeds * (text_mask != 0).unsqueeze(-1).to(text_embeds.scalar_type());
}


bool pipeline_expand_timesteps(const std::string &dir) {
  std::ifstream f(std::filesystem::path(dir) / ".." / "model_index.json");
  if (!f) return false;
  const auto j = nlohmann::json::parse(f, nullptr, false);
  return j.is_object() && j.contains("expand_timesteps") && j["expand_timesteps"].is_boolean() &&
         j["expand_timesteps"].get<bool>();
}

double cogvideox_snr_shift_scale(const std::string &dir, bool rotary) {
  const auto path = std::filesystem::path(dir) / ".." / "scheduler" / "scheduler_config.json";
  std::ifstream f(path);
  if (f) {
    const auto j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_object() && j.contains("snr_shift_scale") && j["snr_shift_scale"].is_number() &&
        j["snr_shift_scale"].get<double>() > 0)
      return j["snr_shift_scale"].get<double>();
  }
  return rotary ? 1.0 : 3.0;
}

at::Tensor seeded_noise(const at::Tensor &x0, const std::vector<int64_t> &seeds) {
  std::vector<at::Tensor> ns;
  for (int64_t i = 0; i < x0.size(0); i++) {
    auto g = at::detail::createCPUGenerator(static_cast<uint64_t>(seeds.at(i)));
    ns.push_back(at::randn(x0[i].sizes(), g, torch::TensorOptions().dtype(torch::kFloat)));
  }
  return torch::stack(ns).to(x0.device(), x0.scalar_type());
}

void draw_ddpm(const at::Tensor &x0, const std::vector<uint64_t> &ids, unsigned epoch, const ModelOptions &o,
               at::Tensor *timestep, at::Tensor *noise) {
  const int64_t m = x0.size(0);
  const double lo = std::max(0.0, o.timestep_lo), hi = std::min(1000.0, o.timestep_hi);
  std::vector<int64_t> ts(m);
  std::vector<at::Tensor> ns;
  for (int64_t i = 0; i < m; i++) {
    auto g = at::detail::createCPUGenerator(sample_noise_seed(o.seed, ids.at(i), epoch));
    const double u = at::rand({1}, g, torch::TensorOptions().dtype(torch::kDouble)).item<double>();
    ts[i] = std::clamp<int64_t>(static_cast<int64_t>(std::floor(lo + u * (hi - lo))), 0, 999);
    ns.push_back(at::randn(x0[i].sizes(), g, torch::TensorOptions().dtype(torch::kFloat)));
  }
  *timestep = torch::tensor(ts, torch::kLong).to(x0.device());
  *noise = torch::stack(ns).to(x0.device(), x0.scalar_type());
}

namespace {
at::Tensor per_sample(const at::Tensor &v, const at::Tensor &like) {
  std::vector<int64_t> shape(like.dim(), 1);
  shape[0] = like.size(0);
  return v.view(shape);
}
}  // namespace

void vpred_terms(const at::Tensor &x0, const at::Tensor &noise, const at::Tensor &t, const at::Tensor &alphas,
                 at::Tensor *x_t, at::Tensor *weight) {
  const auto a = alphas.to(x0.device()).index_select(0, t.to(x0.device(), torch::kLong));
  const auto af = a.to(x0.scalar_type());  // add_noise casts the schedule to the sample's dtype first
  *x_t = per_sample(af.sqrt(), x0) * x0 + per_sample((1 - af).sqrt(), x0) * noise;
  *weight = 1.0 / (1.0 - a);
}

at::Tensor vpred_x0(const at::Tensor &x_t, const at::Tensor &v, const at::Tensor &t, const at::Tensor &alphas) {
  const auto a = alphas.to(x_t.device()).index_select(0, t.to(x_t.device(), torch::kLong)).to(v.scalar_type());
  return per_sample(a.sqrt(), x_t) * x_t - per_sample((1 - a).sqrt(), x_t) * v;
}

at::Tensor vpred_loss(const at::Tensor &x0_pred, const at::Tensor &x0, const at::Tensor &w) {
  const auto e = (x0_pred.to(torch::kFloat) - x0.to(torch::kFloat)).pow(2);
  return (per_sample(w.to(torch::kFloat), e) * e).flatten(1).mean(1);
}

at::Tensor cogvideox_latents(const at::Tensor &latents, int64_t patch_t) {
  auto x = latents.permute({0, 2, 1, 3, 4});
  const int64_t extra = patch_t > 1 ? (patch_t - x.size(1) % patch_t) % patch_t : 0;
  if (extra) x = torch::cat({x.narrow(1, 0, 1).expand({-1, extra, -1, -1, -1}), x}, 1);
  return x.contiguous();
}

}  // namespace models

namespace {

// A diffusers folder's transformer as ddptrainsink's model: its family's objective, per-sample noise.
class NativeTrainModel : public TrainModel {
 public:
  NativeTrainModel(std::string dir, std::unique_ptr<models::DitModel> dit, const ModelOptions &o, bool expand_timesteps)
      : dir_(std::move(dir)), dit_(std::move(dit)), opt_(o), expand_timesteps_(expand_timesteps) {
    dit_->set_checkpointing(o.gradient_checkpointing);
    dit_->set_attention_backend(o.attention_backend);
    if (std::string why = models::check_family_timestep_options(dit_->class_name(), o); !why.empty())
      throw std::runtime_error(why);
    if (auto *cog = dynamic_cast<models::CogVideoXTransformerImpl *>(&dit_->module())) {
      const double s = o.snr_shift_scale > 0 ? o.snr_shift_scale
                                             : models::cogvideox_snr_shift_scale(dir_, cog->cfg.use_rotary_positional_embeddings);
      alphas_cumprod_ = torch::tensor(models::cogvideox_alphas_cumprod(s), torch::kDouble);  // schedules.h
    }
    if (o.base_dtype != "bf16" && (o.base_dtype != "fp8" || !o.lora()))
      throw std::runtime_error("base-dtype '" + o.base_dtype + "': fp8 is for LoRA runs (lora-rank or lora-init), else bf16");
    if (o.lora()) {
      attach_lora();
    } else if (!o.trainable.empty()) {
      std::regex re;
      try {
        re = std::regex(o.trainable);
      } catch (const std::regex_error &e) {
        throw std::runtime_error("trainable '" + o.trainable + "' is not a regular expression: " + e.what());
      }
      size_t n = 0;
      for (auto &p : dit_->module().named_parameters(true)) {
        const bool on = std::regex_search(p.key(), re);
        p.value().set_requires_grad(on);
        n += on;
      }
      if (n == 0) throw std::runtime_error("trainable '" + o.trainable + "' matches no parameter of " + dir_);
    }
  }
  std::string spec() const override { return dir_; }
  // What trains: every parameter, or the LoRA tensors (PEFT names), or the `trainable` ones. The frozen
  // base is not in the optimizer, the all-reduce, a checkpoint or a validator's snapshot.
  NamedTensors named_parameters() override {
    NamedTensors out;
    if (opt_.lora()) {
      for (auto &[n, t] : models::lora_parameters(dit_->module())) out.emplace_back(n, t);
      return out;
    }
    for (const auto &p : dit_->module().named_parameters(true))
      if (p.value().requires_grad()) out.emplace_back(p.key(), p.value());
    return out;
  }
  NamedTensors named_buffers() override { return {}; }
  bool takes_text() const override { return true; }
  void train(bool on) override { dit_->module().train(on); }
  models::DitModel *dit() override { return dit_.get(); }

  at::Tensor training_step(const ModelInputs &in) override {
    const auto x0 = checked_latents(in);
    std::vector<uint64_t> ids = in.sample_ids;
    unsigned epoch = in.epoch;
    if (ids.size() != static_cast<size_t>(x0.size(0))) {  // no sample ids (an app's own stream): the step's default generator
      ids.assign(x0.size(0), 0);
      for (auto &id : ids) id = static_cast<uint64_t>(torch::randint(INT64_MAX, {1}, torch::kLong).item<int64_t>());
      epoch = 0;
    }
    if (vpred()) {
      // CogVideoX: v-prediction on its DDPM schedule, the loss on the x0 estimate weighted 1 / (1 - a_t);
      // the T5 output as the pipelines pass it (no mask).
      const auto x = models::cogvideox_latents(x0, dit_->temporal_patch());
      at::Tensor t, noise, x_t, w;
      models::draw_ddpm(x, ids, epoch, opt_, &t, &noise);
      models::vpred_terms(x, noise, t, alphas_cumprod_, &x_t, &w);
      const auto v = dit_->forward(vpred_input(x_t, in), t, in.text_embeds);
      return models::vpred_loss(models::vpred_x0(x_t, v, t, alphas_cumprod_), x, w).mean();
    }
    at::Tensor sigma, noise, x_t, t, target;
    models::draw_flow(x0, ids, epoch, opt_, &sigma, &noise);
    models::flow_terms(x0, noise, sigma, &x_t, &t, &target);
    auto pred = predict(x_t, t, models::zero_text_padding(in.text_embeds, in.text_mask), in);
    if (first_frame_clean(in)) {  // TI2V: the given first frame is no target
      pred = pred.narrow(2, 1, pred.size(2) - 1);
      target = target.narrow(2, 1, target.size(2) - 1);
    }
    if (opt_.loss_weighting == "none") return torch::mse_loss(pred.to(torch::kFloat), target.to(torch::kFloat));
    return models::flow_loss(pred, target, models::flow_loss_weights(sigma, opt_.loss_weighting));
  }

  at::Tensor validation_step(const ModelInputs &in, const std::vector<int64_t> &seeds) override {
    const auto x0 = checked_latents(in);
    const int64_t m = x0.size(0);
    const auto noise = models::seeded_noise(x0, seeds);
    at::Tensor total;
    if (vpred()) {  // CogVideoX: timesteps 1000 sigma, noise in its frames-first layout
      const auto x = models::cogvideox_latents(x0, dit_->temporal_patch());
      const auto nx = models::cogvideox_latents(noise, dit_->temporal_patch());
      for (double s : opt_.val_sigmas) {
        const auto t = torch::full({m}, std::clamp<int64_t>(static_cast<int64_t>(s * 1000), 0, 999),
                                   x0.options().dtype(torch::kLong));
        at::Tensor x_t, w;
        models::vpred_terms(x, nx, t, alphas_cumprod_, &x_t, &w);
        const auto v = dit_->forward(vpred_input(x_t, in), t, in.text_embeds);
        const auto l = models::vpred_loss(models::vpred_x0(x_t, v, t, alphas_cumprod_), x, w);
        total = total.defined() ? total + l : l;
      }
      return total / static_cast<double>(opt_.val_sigmas.size());
    }
    const auto text = models::zero_text_padding(in.text_embeds, in.text_mask);
    for (double s : opt_.val_sigmas) {
      at::Tensor x_t, t, target;
      models::flow_terms(x0, noise, torch::full({m}, s, x0.options().dtype(torch::kFloat)), &x_t, &t, &target);
      auto pred = predict(x_t, t, text, in);
      if (first_frame_clean(in)) {
        pred = pred.narrow(2, 1, pred.size(2) - 1);
        target = target.narrow(2, 1, target.size(2) - 1);
      }
      const auto l = (pred.to(torch::kFloat) - target.to(torch::kFloat)).pow(2).flatten(1).mean(1);
      total = total.defined() ? total + l : l;
    }
    return total / static_cast<double>(opt_.val_sigmas.size());
  }

  std::string save(const std::string &dir) override {
    if (opt_.lora()) {  // LoRA-sized: the base is the folder of `model`
      models::write_lora_file(dir + "/pytorch_lora_weights.safetensors", models::lora_of(dit_->module()), "diffusers");
      return "pytorch_lora_weights.safetensors";
    }
    if (!opt_.trainable.empty()) return save_trained(dir + "/trained_parameters.safetensors");
    // float32 and one file up to 4 GiB a shard: a checkpoint resumes bit for bit.
    return dit_->save(dir, torch::kFloat, uint64_t(4) << 30);
  }
  std::string export_name() const override { return opt_.lora() ? "lora" : "transformer"; }
  bool export_folder(const std::string &dir, const std::string &dtype) override {
    if (opt_.lora()) {
      std::filesystem::create_directories(dir);
      const auto lora = models::lora_of(dit_->module());
      const std::string f = opt_.lora_format;
      if (f == "diffusers" || f == "all") models::write_lora_file(dir + "/pytorch_lora_weights.safetensors", lora, "diffusers");
      if (f == "comfyui" || f == "all") models::write_lora_file(dir + "/lora_comfyui.safetensors", lora, "comfyui");
      if (f == "kohya" || f == "all") models::write_lora_file(dir + "/lora_kohya.safetensors", lora, "kohya");
      return true;
    }
    at::ScalarType t;
    if (!models::parse_save_dtype(dtype, &t)) throw std::runtime_error("save dtype '" + dtype + "' is not bf16, fp16 or fp32");
    dit_->save(dir, t, uint64_t(5) << 30);  // 5 GB shards, as the published checkpoints
    return true;
  }
  void load(const std::string &dir) override {
    if (opt_.lora()) {
      const auto file = models::read_lora(dir + "/pytorch_lora_weights.safetensors", dit_->module());
      copy_lora(file);
      return;
    }
    if (!opt_.trainable.empty()) return load_trained(dir + "/trained_parameters.safetensors");
    models::DiffusersFolder folder;
    std::string err;
    if (!models::open_diffusers_folder(dir, "diffusion_pytorch_model", &folder, &err)) throw std::runtime_error(err);
    models::load_strict(dit_->module(), folder);
  }

 private:
  // Wan 2.2 TI2V 5B (expand_timesteps) trained image-to-video: the micro-batches carry a condition.
  bool first_frame_clean(const ModelInputs &in) const { return expand_timesteps_ && in.condition.defined(); }

  // The flow model's prediction at x_t [m, C, t, h, w], timestep t [m]: with the sample's condition after
  // x_t for a layout with condition channels (image_condition.h), the image states for Wan 2.1 I2V /
  // FLF2V, and for TI2V (as WanImageToVideoPipeline with expand_timesteps) the clean first latent frame
  // in x_t, its tokens at timestep 0.
  at::Tensor predict(const at::Tensor &x_t, const at::Tensor &t, const at::Tensor &text, const ModelInputs &in) {
    if (first_frame_clean(in)) {
      // The sample's own first latent frame: the causal VAE encodes the clip's first frame alone into it.
      const auto x = torch::cat({in.latents.narrow(2, 0, 1).to(x_t.device(), x_t.scalar_type()),
                                 x_t.narrow(2, 1, x_t.size(2) - 1)}, 2);
      const auto p = dit_->patch_size();
      const int64_t per_frame = (x.size(3) / p[1]) * (x.size(4) / p[2]), tokens = per_frame * (x.size(2) / p[0]);
      auto tt = t.to(torch::kFloat).unsqueeze(1).repeat({1, tokens});
      tt.narrow(1, 0, per_frame).zero_();
      return dit_->forward(x, tt, text);
    }
    const auto x = models::with_condition(x_t, in.condition, dit_->condition_channels(), dir_);
    if (dit_->image_dim() == 0) return dit_->forward(x, t, text);
    // [m, n, N, D] -> [m n, N, D]: each sample's images in turn (FLF2V: first, last), as diffusers'
    // pipelines repeat them over the batch.
    const auto &e = in.image_embeds;
    return dit_->forward_image(x, t, text, e.reshape({-1, e.size(2), e.size(3)}).to(x.device(), torch::kFloat));
  }
  void check_image_inputs(const ModelInputs &in) const {
    const int64_t dim = dit_->image_dim(), n = dit_->images_per_sample();
    const std::string what = dir_ + " (" + dit_->class_name() + ")";
    if (dim == 0) {
      if (in.image_embeds.defined())
        throw std::runtime_error("the micro-batches carry image_embeds (imageencoder) but " + what +
                                 " has no image path (no image_dim in its config.json: Wan 2.2 I2V / TI2V and "
                                 "text-to-video models take none): remove the imageencoder");
      return;
    }
    if (!in.image_embeds.defined())
      throw std::runtime_error(what + " is a Wan 2.1 " + (n == 2 ? "FLF2V" : "I2V") +
                               " transformer: its image path takes each sample's image encoder states; put an "
                               "imageencoder (the checkpoint's image_encoder/ folder" +
                               (n == 2 ? ", first and last frame" : "") +
                               ") before microbatcher so that the micro-batches carry image_embeds");
    const auto &e = in.image_embeds;
    if (e.dim() != 4 || e.size(0) != in.latents.size(0) || e.size(1) != n || e.size(3) != dim) {
      std::ostringstream s;
      s << "the micro-batch's image_embeds have shape " << e.sizes() << " beside " << in.latents.size(0)
        << " samples; " << what << " takes [" << in.latents.size(0) << ", " << n << ", N, " << dim << "] ("
        << (n == 2 ? "FLF2V: first and last frame per sample" : "one image per sample") << ", image_dim " << dim
        << ": the image encoder of the same checkpoint)";
      throw std::runtime_error(s.str());
    }
    // With fewer text rows the image tokens would be read as text and the image attention left empty.
    if (in.text_embeds.defined() && in.text_embeds.size(1) != models::kWanImageModelTextRows)
      throw std::runtime_error(what + " takes its text padded to " + std::to_string(models::kWanImageModelTextRows) +
                               " rows (the image tokens are the rows before the last " +
                               std::to_string(models::kWanImageModelTextRows) + "); the micro-batches' text has " +
                               std::to_string(in.text_embeds.size(1)) + ": set textencoder max-length=" +
                               std::to_string(models::kWanImageModelTextRows));
  }
  // TI2V's condition says "train image-to-video"; its first latent frame must be the only one given.
  void check_first_frame_condition(const ModelInputs &in) const {
    const auto &c = in.condition;
    const int64_t C = in.latents.size(1);
    if (c.dim() != 5 || c.size(0) != in.latents.size(0) || c.size(1) <= C || c.sizes().slice(2) != in.latents.sizes().slice(2)) {
      std::ostringstream s;
      s << "the micro-batch's condition has shape " << c.sizes() << " beside latents " << in.latents.sizes()
        << "; vaeencoder condition=first-frame with the same VAE gives [m, tc + " << C << ", t, h, w]";
      throw std::runtime_error(s.str());
    }
    const auto mask = c.narrow(1, 0, c.size(1) - C);
    if (c.size(2) > 1 && mask.narrow(2, 1, c.size(2) - 1).ne(0).any().item<bool>())
      throw std::runtime_error(dir_ + " is Wan 2.2 TI2V (expand_timesteps): it takes the first frame only; the "
                               "micro-batches' condition gives later frames too (condition=first-last-frame): set "
                               "vaeencoder condition=first-frame");
  }
  // CogVideoX I2V: x_t [m, F, C, h, w] with the image latents after it on channels, frames first and padded
  // as the pipeline pads them (image_condition.h). Noise goes to x_t only: the pipeline's and its authors'
  // fine-tuning take the image latents clean (their pixel-space image noise is not applied here).
  at::Tensor vpred_input(const at::Tensor &x_t, const ModelInputs &in) const {
    if (dit_->condition_channels() == 0) return x_t;
    const auto c = models::cogvideox_condition_frames(in.condition, dit_->temporal_patch());
    return torch::cat({x_t, c.to(x_t.device(), x_t.scalar_type())}, 2);
  }
  void check_cogvideox_condition(const ModelInputs &in) const {
    const std::string what = dir_ + " (" + dit_->class_name() + ")";
    if (dit_->condition_channels() == 0 && in.condition.defined())
      throw std::runtime_error("the micro-batches carry an image condition (vaeencoder condition=) but " + what +
                               " is a text-to-video transformer: set vaeencoder condition=none, or train an "
                               "image-to-video folder (CogVideoX-5b-I2V, CogVideoX1.5-5B-I2V)");
    if (dit_->condition_channels() > 0 && !in.condition.defined())
      throw std::runtime_error(what + " is a CogVideoX image-to-video transformer (the first frame's " +
                               std::to_string(dit_->condition_channels()) + " latent channels beside the noisy ones): "
                               "set vaeencoder condition=first-frame so that each sample carries them");
    if (in.condition.defined() && in.condition.sizes() != in.latents.sizes()) {
      std::ostringstream s;
      s << "the micro-batch's condition has shape " << in.condition.sizes() << " beside latents " << in.latents.sizes()
        << "; " << what << " takes the first frame's latents of the same VAE, zero-padded, [m, C, t, h, w] "
        << "(vaeencoder condition=first-frame with the CogVideoX VAE)";
      throw std::runtime_error(s.str());
    }
  }
  at::Tensor checked_latents(const ModelInputs &in) const {
    const int64_t noisy = dit_->latent_channels() - dit_->condition_channels();
    if (in.latents.size(1) != noisy)
      throw std::runtime_error("micro-batch has " + std::to_string(in.latents.size(1)) + " latent channels; " + dir_ +
                               " (" + dit_->class_name() + ") takes " + std::to_string(noisy) +
                               ": use the VAE of the same model family");
    if (vpred()) check_cogvideox_condition(in);
    if (in.condition.defined() && dit_->condition_channels() == 0 && !expand_timesteps_)
      throw std::runtime_error("the micro-batches carry an image condition (vaeencoder condition=) but " + dir_ +
                               " is a text-to-video transformer: set vaeencoder condition=none, or train an "
                               "image-to-video folder (Wan 2.2 TI2V 5B: the folder's ../model_index.json says "
                               "\"expand_timesteps\": true, as the published one does)");
    if (first_frame_clean(in)) check_first_frame_condition(in);
    check_image_inputs(in);
    if (!in.has_text())
      throw std::runtime_error(dir_ + " (" + dit_->class_name() + ") needs text embeddings: put a textencoder after vaeencoder");
    if (in.text_embeds.size(2) != dit_->text_dim())
      throw std::runtime_error("text embeddings have " + std::to_string(in.text_embeds.size(2)) + " dimensions; " +
                               dir_ + " takes " + std::to_string(dit_->text_dim()) +
                               " (the family's text encoder: umT5-XXL for Wan, T5-XXL for CogVideoX)");
    return in.latents;
  }
  void attach_lora() {
    for (auto &p : dit_->module().parameters()) p.set_requires_grad(false);
    if (!opt_.lora_init.empty()) {
      const auto file = models::read_lora(opt_.lora_init, dit_->module());
      if (opt_.lora_rank > 0 && file.rank != opt_.lora_rank)
        throw std::runtime_error("lora-init '" + opt_.lora_init + "' has rank " + std::to_string(file.rank) +
                                 ", lora-rank is " + std::to_string(opt_.lora_rank) + " (set lora-rank=0 or " +
                                 std::to_string(file.rank) + ")");
      models::apply_lora(dit_->module(), file, true);
      for (auto &[name, l] : models::linear_modules(dit_->module())) l->lora_dropout = opt_.lora_dropout;
    } else {
      const double alpha = opt_.lora_alpha > 0 ? opt_.lora_alpha : static_cast<double>(opt_.lora_rank);
      const bool regex = opt_.lora_targets.find_first_of("^$*+?()[]|\\") != std::string::npos;
      std::regex re;
      std::vector<std::string> suffixes;
      if (regex) {
        try {
          re = std::regex(opt_.lora_targets);
        } catch (const std::regex_error &e) {
          throw std::runtime_error("lora-targets '" + opt_.lora_targets + "' is not a regular expression: " + e.what());
        }
      } else {
        std::stringstream ss(opt_.lora_targets);
        for (std::string t; std::getline(ss, t, ',');)
          if (!t.empty()) suffixes.push_back(t);
      }
      std::set<std::string> used;
      size_t n = 0;
      for (auto &[name, l] : models::linear_modules(dit_->module())) {
        bool hit = false;
        if (regex) hit = std::regex_search(name, re);
        for (const auto &s : suffixes)
          if (name == s || (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
                            name[name.size() - s.size() - 1] == '.')) {
            hit = true;
            used.insert(s);
          }
        if (!hit) continue;
        l->add_lora(opt_.lora_rank, alpha / static_cast<double>(opt_.lora_rank), opt_.lora_dropout);
        n++;
      }
      for (const auto &s : suffixes)
        if (!used.count(s))
          throw std::runtime_error("lora-targets entry '" + s + "' names no Linear module of " + dir_ +
                                   " (videotrain-model info lists them)");
      if (n == 0) throw std::runtime_error("lora-targets '" + opt_.lora_targets + "' names no Linear module of " + dir_);
    }
    models::check_lora_format(dit_->module(), opt_.lora_format);  // at start, not after the run
    dit_->module().to(device_of());
    if (opt_.base_dtype == "fp8") models::frozen_linears_to_fp8(dit_->module());  // the base only: the LoRA stays float32
  }
  void copy_lora(const models::LoraFile &file) {
    torch::NoGradGuard ng;
    for (auto &[name, l] : models::linear_modules(dit_->module())) {
      if (!l->has_lora()) continue;
      auto it = file.modules.find(name);
      if (it == file.modules.end()) throw std::runtime_error("the checkpoint's LoRA has no module '" + name + "'");
      l->lora_a.copy_(it->second.a);
      l->lora_b.copy_(it->second.b);
    }
  }
  std::string save_trained(const std::string &path) {
    std::vector<SafetensorsOutTensor> out;
    for (auto &[n, t] : named_parameters()) out.push_back(models::out_tensor(n, t));
    std::string err;
    if (!write_safetensors(path, out, {{"format", "pt"}, {"base_model", dir_}, {"trainable", opt_.trainable}}, &err))
      throw std::runtime_error(err);
    return std::filesystem::path(path).filename().string();
  }
  void load_trained(const std::string &path) {
    std::string err;
    auto f = SafetensorsFile::open(path, &err);
    if (!f) throw std::runtime_error(err);
    torch::NoGradGuard ng;
    for (auto &[n, t] : named_parameters()) {
      const auto *e = f->find(n);
      if (!e || e->dtype != "F32" || e->shape != t.sizes().vec())
        throw std::runtime_error("'" + path + "' does not hold '" + n + "' as the model has it");
      t.copy_(models::tensor_of(*e));
    }
  }
  bool vpred() const { return dit_->descriptor().objective == models::Objective::kVPrediction; }
  c10::Device device_of() { return dit_->module().parameters().front().device(); }
  std::string dir_;
  std::unique_ptr<models::DitModel> dit_;
  ModelOptions opt_;
  bool expand_timesteps_;  // Wan 2.2 TI2V 5B (the pipeline's config): a condition means the clean first frame
  at::Tensor alphas_cumprod_;  // CogVideoX's schedule (float64); undefined for flow-matching families
};

}  // namespace

bool is_model_folder(const std::string &spec) {
  std::error_code ec;
  return std::filesystem::is_directory(spec, ec) && std::filesystem::exists(spec + "/config.json", ec);
}

std::string model_folder_class(const std::string &dir) {
  std::ifstream f(dir + "/config.json");
  std::stringstream text;
  text << f.rdbuf();
  return models::class_of(text.str());
}

std::unique_ptr<TrainModel> make_native_model(const std::string &dir, const c10::Device &device,
                                              const ModelOptions &options) {
  auto dit = models::open_dit(dir, device);
  if (dit->condition_channels() < 0)
    throw std::runtime_error(dir + ": in_channels is less than out_channels; a transformer's input holds the noisy "
                             "latents (out_channels) and any condition channels");
  const bool expand = models::pipeline_expand_timesteps(dir);
  if (expand && (dit->condition_channels() != 0 || dit->image_dim() > 0 || dit->family() != "wan"))
    throw std::runtime_error(dir + "/../model_index.json says expand_timesteps (Wan 2.2 TI2V 5B), but " + dir +
                             " is not that layout (it has condition channels or an image path, or is no Wan model)");
  return std::make_unique<NativeTrainModel>(dir, std::move(dit), options, expand);
}

}  // namespace videotrain
