/* optimizer=prodigy: Prodigy (Mishchenko & Defazio 2023, "Prodigy: An Expeditiously Adaptive
 * Parameter-Free Learner"), stepping as its authors' prodigyopt 1.0 does with decoupled weight
 * decay: Adam moments scaled by the step-size estimate d, and d grown from d0 to
 * d-coef * sum_k d_k lr_k <g_k, x_0 - x_k> / |s| (the numerator decayed by beta3, s an EMA of
 * d-weighted gradients). lr multiplies d (lr=1 is the usual setting); use-bias-correction
 * scales it by Adam's bias correction; safeguard-warmup leaves lr out of s. */
#include <algorithm>
#include <cmath>
#include <vector>

#include "state_optimizer.h"

namespace videotrain {

namespace {

class Prodigy : public StateOptimizer {
 public:
  Prodigy(const OptimizerSettings &s, const std::vector<at::Tensor> &params)
      : StateOptimizer("prodigy", s, params), d_(s.x.d0), d_max_(s.x.d0) {
    scalars_ = {{"d", &d_}, {"d_max", &d_max_}, {"d_numerator", &d_numerator_}, {"k", &k_}};
  }

 protected:
  NamedTensors initial_state(const at::Tensor &p) override {
    NamedTensors s{{"s", at::zeros_like(p)}, {"p0", p.detach().clone()}, {"exp_avg_sq", at::zeros_like(p)}};
    if (s_.beta1 > 0) s.emplace_back("exp_avg", at::zeros_like(p));
    return s;
  }

  void update() override {
    const double b1 = s_.beta1, b2 = s_.beta2, b3 = s_.x.beta3, d0 = s_.x.d0;
    const double k = k_;
    const double bias = s_.x.use_bias_correction ? std::sqrt(1 - std::pow(b2, k + 1)) / (1 - std::pow(b1, k + 1)) : 1;
    double d = d_;
    const double dlr = d * lr_ * bias;
    // Each parameter's <g, x0 - x> and |s| in one transfer, summed in double in parameter order as
    // prodigyopt sums its .item()s.
    std::vector<at::Tensor> dots, sums;
    for (size_t i = 0; i < params_.size(); i++) {
      at::Tensor &p = params_[i];
      const at::Tensor &g = p.grad();
      if (!g.defined() || !(lr_ > 0)) continue;
      dots.push_back(at::dot(g.flatten(), (st(i, 1) - p).flatten()));
      if (b1 > 0) st(i, 3).mul_(b1).add_(g, d * (1 - b1));
      st(i, 2).mul_(b2).addcmul_(g, g, d * d * (1 - b2));
      at::Tensor &s = st(i, 0);
      s.mul_(b3).add_(g, s_.x.safeguard_warmup ? (d / d0) * d : (d / d0) * dlr);
      sums.push_back(s.abs().sum());
    }
    double numerator = d_numerator_ * b3, denom = 0;
    if (!dots.empty()) {
      const at::Tensor both = at::stack({at::stack(dots), at::stack(sums)}).to(at::kCPU, at::kDouble);
      const double *v = both.data_ptr<double>();
      for (size_t k = 0; k < dots.size(); k++) {
        numerator += (d / d0) * dlr * v[k];
        denom += v[dots.size() + k];
      }
    }
    if (denom == 0) return;  // no gradient yet: no step (prodigyopt's early return)
    if (lr_ > 0) {
      const double d_hat = s_.x.d_coef * numerator / denom;
      if (d == d0) d = std::max(d, d_hat);
      d_max_ = std::max(d_max_, d_hat);
      d = d_max_;  // min(d_max, d * growth_rate) with prodigyopt's default growth_rate=inf
    }
    d_numerator_ = numerator;
    d_ = d;
    for (size_t i = 0; i < params_.size(); i++) {
      at::Tensor &p = params_[i];
      const at::Tensor &g = p.grad();
      if (!g.defined()) continue;
      at::Tensor den = st(i, 2).sqrt().add_(d * s_.eps);
      if (s_.weight_decay != 0) p.add_(p, -s_.weight_decay * dlr);
      if (b1 > 0)
        p.addcdiv_(st(i, 3), den, -dlr);
      else
        p.addcdiv_(g, den, -dlr * d);
    }
    k_ += 1;
  }

 private:
  double d_, d_max_, d_numerator_ = 0, k_ = 0;  // k: the steps taken (its bias correction)
};

}  // namespace

std::unique_ptr<TrainOptimizer> make_prodigy(const OptimizerSettings &s, const std::vector<at::Tensor> &params) {
  return std::make_unique<Prodigy>(s, params);
}

}  // namespace videotrain
