/* TorchScript models and the built-in models (torch::nn, no Python needed).
 *
 * builtin:tiny-unet3d  a small latent video diffusion model: a 3D conv UNet (two
 *                      levels, residual blocks conditioned by FiLM on a timestep and a
 *                      caption embedding), trained with a flow-matching loss (noise and
 *                      timesteps from torch's default generator, which the trainer seeds).
 * builtin:linear-test  a deterministic model for tests: a 1x1x1 conv plus a caption bias
 *                      regressed onto a fixed function of the input (no noise). */
#include "train_model.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <fstream>
#include <map>
#include <stdexcept>

#include "cpu_conv.h"
#include "first_line.h"
#include "jit_load.h"
#include "safetensors.h"

namespace videotrain {

namespace {

constexpr const char *kBuiltinPrefix = "builtin:";
constexpr int64_t kCaptionBuckets = 4096;

/* ---- TorchScript ---- */

class ScriptModel : public TrainModel {
 public:
  ScriptModel(const std::string &path, const c10::Device &device) : path_(path) {
    try {
      module_ = jit_load(path, device);
    } catch (const std::exception &e) {
      throw std::runtime_error("cannot load TorchScript model '" + path + "' (property model): " +
                               first_line(e.what()));
    }
    if (!module_.find_method("training_step"))
      throw std::runtime_error("TorchScript model '" + path +
                               "' has no method training_step(latents: Tensor, captions: List[str]) -> Tensor "
                               "(export it with @torch.jit.export)");
    module_.to(device);
    module_.train(true);
  }
  std::string spec() const override { return path_; }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (const auto &p : module_.named_parameters(true)) out.emplace_back(p.name, p.value);
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (const auto &b : module_.named_buffers(true)) out.emplace_back(b.name, b.value);
    return out;
  }
  at::Tensor training_step(const at::Tensor &latents, const std::vector<std::string> &captions) override {
    c10::List<std::string> caps;
    for (const auto &c : captions) caps.push_back(c);
    auto out = module_.get_method("training_step")({latents, caps});
    if (!out.isTensor()) throw std::runtime_error("training_step of '" + path_ + "' did not return a Tensor");
    return out.toTensor();
  }
  void train(bool on) override { module_.train(on); }
  // validation_step(latents, captions, seeds: Tensor[m] int64) -> Tensor ([m] or scalar mean), if exported.
  at::Tensor validation_step(const at::Tensor &latents, const std::vector<std::string> &captions,
                             const std::vector<int64_t> &seeds) override {
    if (!module_.find_method("validation_step")) return at::Tensor();
    c10::List<std::string> caps;
    for (const auto &c : captions) caps.push_back(c);
    auto out = module_.get_method("validation_step")({latents, caps, torch::tensor(seeds, torch::kLong)});
    if (!out.isTensor()) throw std::runtime_error("validation_step of '" + path_ + "' did not return a Tensor");
    auto t = out.toTensor().to(torch::kFloat);
    if (t.numel() == 1 && latents.size(0) != 1) return t.reshape({1}).expand({latents.size(0)}).clone();
    return t.reshape({-1});
  }
  std::string save(const std::string &dir) override {
    module_.save(dir + "/model.pt");
    return "model.pt";
  }
  void load(const std::string &dir) override {
    auto other = torch::jit::load(dir + "/model.pt", c10::Device(c10::kCPU));
    std::map<std::string, at::Tensor> src;
    for (const auto &p : other.named_parameters(true)) src[p.name] = p.value;
    for (const auto &b : other.named_buffers(true)) src[b.name] = b.value;
    torch::NoGradGuard ng;
    auto copy_all = [&](const NamedTensors &dst) {
      for (const auto &[name, t] : dst) {
        auto it = src.find(name);
        if (it == src.end() || it->second.sizes() != t.sizes())
          throw std::runtime_error("checkpoint '" + dir + "/model.pt' does not match model '" + path_ + "' at " +
                                   name);
        t.copy_(it->second);
      }
    };
    copy_all(named_parameters());
    copy_all(named_buffers());
  }

 private:
  std::string path_;
  torch::jit::Module module_;
};

/* ---- built-in models ---- */

// Sinusoidal embedding of t in [0, 1].
at::Tensor timestep_embedding(const at::Tensor &t, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = torch::exp(-std::log(10000.0) * torch::arange(half, t.options()) / half);
  auto args = (t * 1000.0).unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, 1);
}

at::Tensor caption_bag(torch::nn::EmbeddingBag &bag, const std::vector<std::string> &captions, int64_t batch,
                       const c10::Device &device) {
  std::vector<int64_t> ids, offsets;
  for (int64_t i = 0; i < batch; i++) {
    offsets.push_back(static_cast<int64_t>(ids.size()));
    auto t = caption_token_ids(i < static_cast<int64_t>(captions.size()) ? captions[i] : std::string(),
                               kCaptionBuckets);
    ids.insert(ids.end(), t.begin(), t.end());
  }
  auto opt = torch::TensorOptions().dtype(torch::kLong);
  auto idt = torch::tensor(ids, opt).to(device);
  auto off = torch::tensor(offsets, opt).to(device);
  return bag->forward(idt, off);
}

// A Conv3d module's forward through conv3d_fast (oneDNN on CPU even for one sample). Every conv
// here has odd kernels and "same" padding, so the padding is kernel / 2; it is not read from the
// options because its type is a variant that differs between LibTorch versions.
at::Tensor conv(const torch::nn::Conv3d &m, const at::Tensor &x) {
  const auto k = m->weight.sizes();
  const std::array<int64_t, 3> padding{k[2] / 2, k[3] / 2, k[4] / 2};
  return conv3d_fast(x, m->weight, m->bias, m->options.stride(), padding);
}

struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t ch, int64_t cond_dim)
      : n1(torch::nn::GroupNormOptions(std::min<int64_t>(8, ch), ch)),
        n2(torch::nn::GroupNormOptions(std::min<int64_t>(8, ch), ch)),
        c1(torch::nn::Conv3dOptions(ch, ch, 3).padding(1)),
        c2(torch::nn::Conv3dOptions(ch, ch, 3).padding(1)),
        film(cond_dim, 2 * ch) {
    register_module("n1", n1);
    register_module("n2", n2);
    register_module("c1", c1);
    register_module("c2", c2);
    register_module("film", film);
  }
  at::Tensor forward(const at::Tensor &x, const at::Tensor &cond) {
    auto h = conv(c1, torch::silu(n1(x)));
    auto ss = film(torch::silu(cond)).view({x.size(0), -1, 1, 1, 1}).chunk(2, 1);
    h = n2(h) * (1 + ss[0]) + ss[1];
    return x + conv(c2, torch::silu(h));
  }
  torch::nn::GroupNorm n1, n2;
  torch::nn::Conv3d c1, c2;
  torch::nn::Linear film;
};
TORCH_MODULE(ResBlock);

struct TinyUNet3DImpl : torch::nn::Module {
  static constexpr int64_t kCh = 32, kCond = 128, kTime = 64;
  explicit TinyUNet3DImpl(int64_t c)
      : in_conv(torch::nn::Conv3dOptions(c, kCh, 3).padding(1)),
        r1(kCh, kCond),
        down(torch::nn::Conv3dOptions(kCh, 2 * kCh, {1, 3, 3}).stride({1, 2, 2}).padding({0, 1, 1})),
        r2(2 * kCh, kCond),
        mid(2 * kCh, kCond),
        up(torch::nn::Conv3dOptions(2 * kCh, kCh, 3).padding(1)),
        r3(kCh, kCond),
        out_norm(torch::nn::GroupNormOptions(8, kCh)),
        out_conv(torch::nn::Conv3dOptions(kCh, c, 3).padding(1)),
        t1(kTime, kCond),
        t2(kCond, kCond),
        caption(torch::nn::EmbeddingBagOptions(kCaptionBuckets, kCond).mode(torch::kMean)) {
    register_module("in_conv", in_conv);
    register_module("r1", r1);
    register_module("down", down);
    register_module("r2", r2);
    register_module("mid", mid);
    register_module("up", up);
    register_module("r3", r3);
    register_module("out_norm", out_norm);
    register_module("out_conv", out_conv);
    register_module("t1", t1);
    register_module("t2", t2);
    register_module("caption", caption);
    torch::NoGradGuard ng;
    caption->weight.normal_(0.0, 0.02);
  }
  at::Tensor forward(const at::Tensor &x, const at::Tensor &t, const std::vector<std::string> &captions) {
    auto cond = t2(torch::silu(t1(timestep_embedding(t, kTime)))) + caption_bag(caption, captions, x.size(0), x.device());
    auto h0 = r1(conv(in_conv, x), cond);
    auto h = mid(r2(conv(down, h0), cond), cond);
    h = torch::nn::functional::interpolate(
        h, torch::nn::functional::InterpolateFuncOptions()
                .size(std::vector<int64_t>{h0.size(2), h0.size(3), h0.size(4)})
                .mode(torch::kNearest));
    h = r3(conv(up, h) + h0, cond);
    return conv(out_conv, torch::silu(out_norm(h)));
  }
  // Rectified flow: x_t = (1 - t) x0 + t n, predict v = n - x0; t logit-normal.
  at::Tensor training_step(const at::Tensor &x0, const std::vector<std::string> &captions) {
    auto noise = torch::randn_like(x0);
    auto t = torch::sigmoid(torch::randn({x0.size(0)}, x0.options()));
    auto tb = t.view({-1, 1, 1, 1, 1});
    auto xt = (1 - tb) * x0 + tb * noise;
    auto pred = forward(xt, t, captions);
    return torch::mse_loss(pred.to(torch::kFloat), (noise - x0).to(torch::kFloat));
  }
  // Same loss per sample, noise and t from a CPU generator per seed (same numbers on any device).
  at::Tensor validation_step(const at::Tensor &x0, const std::vector<std::string> &captions,
                             const std::vector<int64_t> &seeds) {
    std::vector<at::Tensor> ns, ts;
    const auto cpu = torch::TensorOptions().dtype(torch::kFloat);
    for (int64_t i = 0; i < x0.size(0); i++) {
      auto g = at::detail::createCPUGenerator(static_cast<uint64_t>(seeds.at(i)));
      ns.push_back(at::randn(x0[i].sizes(), g, cpu));
      ts.push_back(at::randn({1}, g, cpu));
    }
    auto noise = torch::stack(ns).to(x0.device(), x0.scalar_type());
    auto t = torch::sigmoid(torch::cat(ts)).to(x0.device(), x0.scalar_type());
    auto tb = t.view({-1, 1, 1, 1, 1});
    auto pred = forward((1 - tb) * x0 + tb * noise, t, captions);
    return (pred.to(torch::kFloat) - (noise - x0).to(torch::kFloat)).pow(2).mean({1, 2, 3, 4});
  }
  torch::nn::Conv3d in_conv;
  ResBlock r1;
  torch::nn::Conv3d down;
  ResBlock r2, mid;
  torch::nn::Conv3d up;
  ResBlock r3;
  torch::nn::GroupNorm out_norm;
  torch::nn::Conv3d out_conv;
  torch::nn::Linear t1, t2;
  torch::nn::EmbeddingBag caption;
};
TORCH_MODULE(TinyUNet3D);

struct LinearTestImpl : torch::nn::Module {
  explicit LinearTestImpl(int64_t c)
      : proj(torch::nn::Conv3dOptions(c, c, 1)),
        caption(torch::nn::EmbeddingBagOptions(kCaptionBuckets, c).mode(torch::kMean)) {
    register_module("proj", proj);
    register_module("caption", caption);
  }
  at::Tensor training_step(const at::Tensor &x, const std::vector<std::string> &captions) {
    return per_sample_error(x, captions).mean();
  }
  at::Tensor validation_step(const at::Tensor &x, const std::vector<std::string> &captions,
                             const std::vector<int64_t> &) {
    return per_sample_error(x, captions);
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

template <typename M>
class BuiltinModel : public TrainModel {
 public:
  BuiltinModel(std::string name, int channels, const c10::Device &device)
      : name_(std::move(name)), channels_(channels), net_(channels) {
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
  at::Tensor training_step(const at::Tensor &latents, const std::vector<std::string> &captions) override {
    return net_->training_step(latents, captions);
  }
  at::Tensor validation_step(const at::Tensor &latents, const std::vector<std::string> &captions,
                             const std::vector<int64_t> &seeds) override {
    return net_->validation_step(latents, captions, seeds);
  }
  void train(bool on) override { net_->train(on); }
  std::string save(const std::string &dir) override {
    std::vector<SafetensorsOutTensor> out;
    auto add = [&](const NamedTensors &ts) {
      for (const auto &[name, t] : ts) {
        auto c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
        SafetensorsOutTensor o;
        o.name = name;
        o.dtype = "F32";
        o.shape = c.sizes().vec();
        o.bytes.resize(c.numel() * sizeof(float));
        std::memcpy(o.bytes.data(), c.template data_ptr<float>(), o.bytes.size());
        out.push_back(std::move(o));
      }
    };
    add(named_parameters());
    add(named_buffers());
    std::string err;
    std::map<std::string, std::string> meta{{"model", spec()}, {"latent_channels", std::to_string(channels_)}};
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
  int channels_;
  M net_;
};

}  // namespace

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

std::vector<std::string> builtin_model_names() { return {"tiny-unet3d", "linear-test"}; }

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

std::unique_ptr<TrainModel> make_model(const std::string &spec, int latent_channels, const c10::Device &device) {
  if (!is_builtin_spec(spec)) return std::make_unique<ScriptModel>(spec, device);
  const std::string name = spec.substr(std::string(kBuiltinPrefix).size());
  if (latent_channels <= 0)
    throw std::runtime_error("model " + spec + " needs the latent channel count (property latent-channels)");
  if (name == "tiny-unet3d") return std::make_unique<BuiltinModel<TinyUNet3D>>(name, latent_channels, device);
  if (name == "linear-test") return std::make_unique<BuiltinModel<LinearTest>>(name, latent_channels, device);
  std::string known;
  for (const auto &n : builtin_model_names()) known += (known.empty() ? "" : ", ") + std::string(kBuiltinPrefix) + n;
  throw std::runtime_error("unknown built-in model '" + spec + "' (property model; known: " + known +
                           ", or a TorchScript file)");
}

}  // namespace videotrain
