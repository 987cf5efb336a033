#include "samplers.h"

#include <cmath>
#include <deque>
#include <stdexcept>

#include "expert_pair.h"
#include "native_model.h"

namespace videotrain::models {
namespace {

// Scalars are computed in float64 from the schedule's float32 values; diffusers computes them on
// float32 0-d tensors, a difference far below the reference tolerance.
class FlowEuler final : public Sampler {
 public:
  FlowEuler(int steps, double shift) { schedule_ = flowmatch_schedule(steps, shift); }
  at::Tensor step(int k, const at::Tensor &v, const at::Tensor &x, at::Generator &) override {
    const float dt = static_cast<float>(schedule_.sigmas[k + 1]) - static_cast<float>(schedule_.sigmas[k]);
    return x.to(at::kFloat) + dt * v;
  }
};

// UniPC (bh2, predict_x0, solver order 2, lower order at the last step) on flow sigmas: alpha = 1 - sigma.
class UniPC final : public Sampler {
 public:
  UniPC(int steps, double shift) { schedule_ = unipc_flow_schedule(steps, shift); }

  at::Tensor step(int k, const at::Tensor &v, const at::Tensor &x_in, at::Generator &) override {
    at::Tensor x = x_in;
    const at::Tensor m = x - schedule_.sigmas[k] * v;  // the x0 estimate
    if (k > 0 && last_sample_.defined()) x = corrector(k, m);
    outputs_.push_back(m);
    if (outputs_.size() > 2) outputs_.pop_front();
    const int n = steps();
    const int order = std::min({2, n - k, lower_order_nums_ + 1});
    last_sample_ = x;
    last_order_ = order;
    at::Tensor out = predictor(k, x, order);
    if (lower_order_nums_ < 2) ++lower_order_nums_;
    return out;
  }

 private:
  double lambda(int i) const {
    const double s = schedule_.sigmas[i];
    return std::log(1.0 - s) - std::log(s);
  }
  struct Coeffs {
    double h_phi_1, b_h, b1, b2;
  };
  static Coeffs coeffs(double h) {
    const double hh = -h;
    Coeffs c;
    c.h_phi_1 = std::expm1(hh);
    c.b_h = std::expm1(hh);
    double h_phi_k = c.h_phi_1 / hh - 1.0;
    c.b1 = h_phi_k * 1.0 / c.b_h;
    h_phi_k = h_phi_k / hh - 1.0 / 2.0;
    c.b2 = h_phi_k * 2.0 / c.b_h;
    return c;
  }

  at::Tensor predictor(int k, const at::Tensor &x, int order) {
    const double sigma_t = schedule_.sigmas[k + 1], sigma_s0 = schedule_.sigmas[k];
    const double alpha_t = 1.0 - sigma_t;
    const double h = lambda_or_inf(k + 1) - lambda(k);
    const Coeffs c = coeffs(h);
    const at::Tensor &m0 = outputs_.back();
    at::Tensor x_t = (sigma_t / sigma_s0) * x - (alpha_t * c.h_phi_1) * m0;
    if (order == 2) {
      const double rk = (lambda(k - 1) - lambda(k)) / h;
      const at::Tensor d1 = (outputs_.front() - m0) / rk;
      x_t = x_t - (alpha_t * c.b_h) * (0.5 * d1);
    }
    return x_t.to(x.scalar_type());
  }

  // Refines the previous step's result with this step's x0 estimate `mt`.
  at::Tensor corrector(int k, const at::Tensor &mt) {
    const double sigma_t = schedule_.sigmas[k], sigma_s0 = schedule_.sigmas[k - 1];
    const double alpha_t = 1.0 - sigma_t;
    const double h = lambda(k) - lambda(k - 1);
    const Coeffs c = coeffs(h);
    const at::Tensor &m0 = outputs_.back();
    const at::Tensor x_t_ = (sigma_t / sigma_s0) * last_sample_ - (alpha_t * c.h_phi_1) * m0;
    const at::Tensor d1_t = mt - m0;
    if (last_order_ == 1) return (x_t_ - (alpha_t * c.b_h) * (0.5 * d1_t)).to(mt.scalar_type());
    // order 2: solve [[1, 1], [rk, 1]] rho = [b1, b2]
    const double rk = (lambda(k - 2) - lambda(k - 1)) / h;
    // rho = (rho_d1, rho_t): rho_d1 + rho_t = b1, rk rho_d1 + rho_t = b2
    const double rho_d1 = (c.b1 - c.b2) / (1.0 - rk);
    const double rho_t = c.b1 - rho_d1;
    const at::Tensor d1 = (outputs_.front() - m0) / rk;
    return (x_t_ - (alpha_t * c.b_h) * (rho_d1 * d1 + rho_t * d1_t)).to(mt.scalar_type());
  }

  double lambda_or_inf(int i) const {
    return schedule_.sigmas[i] <= 0.0 ? INFINITY : lambda(i);
  }

  std::deque<at::Tensor> outputs_;  // the last two x0 estimates, oldest first
  at::Tensor last_sample_;
  int last_order_ = 1;
  int lower_order_nums_ = 0;
};

// CogVideoX's schedulers: v-prediction on alphas_cumprod, "trailing" timesteps.
class CogVideoXBase : public Sampler {
 protected:
  CogVideoXBase(int steps, double snr) : alphas_(cogvideox_alphas_cumprod(snr)) {
    schedule_ = trailing_schedule(steps);
  }
  double alpha_at(int k) const { return alphas_[static_cast<size_t>(schedule_.timesteps[k])]; }
  // ᾱ at the step after k (1 past the end, as set_alpha_to_one says).
  double alpha_prev(int k) const {
    const int64_t t = static_cast<int64_t>(schedule_.timesteps[k]) - 1000 / steps();
    return t >= 0 ? alphas_[t] : 1.0;
  }
  std::vector<double> alphas_;
};

class CogVideoXDDIM final : public CogVideoXBase {
 public:
  CogVideoXDDIM(int steps, double snr) : CogVideoXBase(steps, snr) {}
  at::Tensor step(int k, const at::Tensor &v, const at::Tensor &x, at::Generator &) override {
    const double a = alpha_at(k), ap = alpha_prev(k);
    const at::Tensor x0 = std::sqrt(a) * x - std::sqrt(1.0 - a) * v;
    const double a_t = std::sqrt((1.0 - ap) / (1.0 - a));
    const double b_t = std::sqrt(ap) - std::sqrt(a) * a_t;
    return a_t * x + b_t * x0;
  }
};

// Stochastic whatever eta is: each step draws N(0,1) for its first-order update, and a second draw
// for the second-order update when a previous x0 estimate exists and the step is not the last.
class CogVideoXDPM final : public CogVideoXBase {
 public:
  CogVideoXDPM(int steps, double snr) : CogVideoXBase(steps, snr) {}
  at::Tensor step(int k, const at::Tensor &v, const at::Tensor &x, at::Generator &gen) override {
    const double a = alpha_at(k), ap = alpha_prev(k);
    const bool last = static_cast<int64_t>(schedule_.timesteps[k]) - 1000 / steps() < 0;
    const at::Tensor x0 = std::sqrt(a) * x - std::sqrt(1.0 - a) * v;
    const auto lam = [](double al) { return std::log(std::sqrt(al / (1.0 - al))); };
    const double h = lam(ap) - lam(a);
    const double mult1 = std::sqrt((1.0 - ap) / (1.0 - a)) * std::exp(-h);
    const double mult2 = std::expm1(-2.0 * h) * std::sqrt(ap);
    const double mult_noise = std::sqrt(1.0 - ap) * std::sqrt(1.0 - std::exp(-2.0 * h));
    // Drawn on the CPU generator, as diffusers' randn_tensor does for a CPU generator on any device.
    const auto draw = [&] { return at::randn(x.sizes(), gen, x.options().device(at::kCPU)).to(x.device()); };
    at::Tensor out = mult1 * x - mult2 * x0 + mult_noise * draw();
    if (k > 0 && old_x0_.defined() && !last) {
      const double a_back = alphas_[static_cast<size_t>(schedule_.timesteps[k - 1])];
      const double r = (lam(a) - lam(a_back)) / h;
      const at::Tensor d = (1.0 + 1.0 / (2.0 * r)) * x0 - (1.0 / (2.0 * r)) * old_x0_;
      out = mult1 * x - mult2 * d + mult_noise * draw();
    }
    old_x0_ = x0;
    return out;
  }

 private:
  at::Tensor old_x0_;
};

}  // namespace

SamplerKind parse_sampler(const std::string &name) {
  if (name == "euler") return SamplerKind::FlowEuler;
  if (name == "unipc") return SamplerKind::UniPC;
  if (name == "ddim") return SamplerKind::CogVideoXDDIM;
  if (name == "dpm") return SamplerKind::CogVideoXDPM;
  throw std::invalid_argument("unknown sampler '" + name + "' (euler, unipc for Wan; ddim, dpm for CogVideoX)");
}

const char *sampler_name(SamplerKind kind) {
  switch (kind) {
    case SamplerKind::FlowEuler: return "euler";
    case SamplerKind::UniPC: return "unipc";
    case SamplerKind::CogVideoXDDIM: return "ddim";
    case SamplerKind::CogVideoXDPM: return "dpm";
  }
  return "?";
}

const char *sampler_family(SamplerKind kind) {
  return kind == SamplerKind::FlowEuler || kind == SamplerKind::UniPC ? "wan" : "cogvideox";
}

std::unique_ptr<Sampler> Sampler::make(const SamplerOptions &o) {
  if (!(o.flow_shift > 0.0)) throw std::invalid_argument("flow-shift must be > 0");
  switch (o.kind) {
    case SamplerKind::FlowEuler: return std::make_unique<FlowEuler>(o.steps, o.flow_shift);
    case SamplerKind::UniPC: return std::make_unique<UniPC>(o.steps, o.flow_shift);
    case SamplerKind::CogVideoXDDIM: return std::make_unique<CogVideoXDDIM>(o.steps, o.snr_shift_scale);
    case SamplerKind::CogVideoXDPM: return std::make_unique<CogVideoXDPM>(o.steps, o.snr_shift_scale);
  }
  throw std::invalid_argument("unknown sampler");
}

at::Tensor Sampler::timestep(int k, int64_t b) const {
  const double t = schedule_.timesteps.at(k);
  return schedule_.integer_timesteps ? at::full({b}, static_cast<int64_t>(t), at::kLong)
                                     : at::full({b}, static_cast<float>(t), at::kFloat);
}

namespace {

// The channels of the model's input: 2 where frames come first (CogVideoX [B, F, C, h, w]).
int64_t channel_dim(const DitModel &model) {
  return model.descriptor().layout == LatentLayout::kFramesFirst ? 2 : 1;
}

// The pipelines' loop; pick(k) gives step k's model and guidance scale. Guidance runs when `cfg`
// (WanPipeline's do_classifier_free_guidance: the first guidance scale > 1).
at::Tensor guided_loop(Sampler &sampler, at::Tensor latents, const at::Tensor &prompt_embeds,
                       const at::Tensor &negative_embeds, bool cfg,
                       const std::function<std::pair<DitModel *, double>(int)> &pick, at::Generator &gen,
                       const std::function<void(int, const at::Tensor &)> &after_step, const ImageInputs &image) {
  torch::NoGradGuard no_grad;
  const auto device = latents.device();
  const at::Tensor condition =
      image.condition.defined() ? image.condition.to(device, latents.scalar_type()) : image.condition;
  const at::Tensor first = image.first_frame.defined() ? image.first_frame.to(device, latents.scalar_type())
                                                       : image.first_frame;
  // TI2V: (1 - mask) * condition + mask * latents with the pipeline's first-frame mask is this cat.
  const auto with_first = [&](const at::Tensor &x) {
    return at::cat({first, x.narrow(2, 1, x.size(2) - 1)}, 2);
  };
  for (int k = 0; k < sampler.steps(); ++k) {
    at::Tensor t = sampler.timestep(k, latents.size(0)).to(device);
    const auto [model, guidance] = pick(k);
    at::Tensor input = condition.defined() ? at::cat({latents, condition}, channel_dim(*model)) : latents;
    if (first.defined()) {
      // The pipeline's per-token timesteps: t everywhere but the first frame's tokens, at 0.
      input = with_first(latents);
      const auto p = model->patch_size();
      const int64_t per_frame = (input.size(3) / p[1]) * (input.size(4) / p[2]), tokens = per_frame * (input.size(2) / p[0]);
      t = t.to(at::kFloat).unsqueeze(1).repeat({1, tokens});
      t.narrow(1, 0, per_frame).zero_();
    }
    at::Tensor pred = model->forward_image(input, t, prompt_embeds, image.image_embeds);
    if (cfg) {
      const at::Tensor uncond = model->forward_image(input, t, negative_embeds, image.image_embeds);
      pred = uncond + guidance * (pred - uncond);
    }
    latents = sampler.step(k, pred, latents, gen);
    if (after_step) after_step(k, latents);
  }
  return first.defined() ? with_first(latents) : latents;
}

}  // namespace

at::Tensor sample_latents(DitModel &model, Sampler &sampler, at::Tensor latents, const at::Tensor &prompt_embeds,
                          const at::Tensor &negative_embeds, double guidance, at::Generator &gen,
                          const std::function<void(int, const at::Tensor &)> &after_step, const ImageInputs &image) {
  return guided_loop(
      sampler, std::move(latents), prompt_embeds, negative_embeds, guidance > 1.0,
      [&](int) { return std::make_pair(&model, guidance); }, gen, after_step, image);
}

at::Tensor sample_latents_2(DitModel &high, DitModel &low, double boundary_ratio, Sampler &sampler, at::Tensor latents,
                            const at::Tensor &prompt_embeds, const at::Tensor &negative_embeds, double guidance,
                            double guidance_2, at::Generator &gen,
                            const std::function<void(int, const at::Tensor &)> &after_step,
                            const ImageInputs &image) {
  return guided_loop(
      sampler, std::move(latents), prompt_embeds, negative_embeds, guidance > 1.0,
      [&](int k) {
        return high_noise_timestep(sampler.schedule().timesteps.at(k), boundary_ratio) ? std::make_pair(&high, guidance)
                                                                                      : std::make_pair(&low, guidance_2);
      },
      gen, after_step, image);
}

}  // namespace videotrain::models
