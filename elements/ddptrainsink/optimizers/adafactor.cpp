/* optimizer=adafactor: torch.optim.Adafactor's algorithm (Shazeer & Stern 2018 as torch 2.5+
 * has it): no first moment; a matrix's (the last two dimensions') second moment factored into
 * row and column means, a vector's kept whole; 1 - beta2_t = t^beta2-decay; the step
 * min(lr, 1/sqrt(t)) scaled by max(eps2, RMS(weights)) and divided by max(1, RMS(update) /
 * clip-threshold); decoupled weight decay lr * weight-decay. eps is torch's eps1. */
#include <algorithm>
#include <cmath>
#include <vector>

#include "state_optimizer.h"

namespace videotrain {

namespace {

class Adafactor : public StateOptimizer {
 public:
  Adafactor(const OptimizerSettings &s, const std::vector<at::Tensor> &params) : StateOptimizer("adafactor", s, params) {}

 protected:
  NamedTensors initial_state(const at::Tensor &p) override {
    if (p.dim() > 1) {
      auto row = p.sizes().vec(), col = p.sizes().vec();
      row.back() = 1;
      col[col.size() - 2] = 1;
      return {{"row_var", at::zeros(row, p.options())}, {"col_var", at::zeros(col, p.options())}};
    }
    return {{"variance", at::zeros_like(p)}};
  }

  void update() override {
    const double t = static_cast<double>(steps_);
    const double one_minus_beta2 = std::pow(t, s_.x.beta2_decay);
    const double rho = std::min(lr_, 1 / std::sqrt(t));
    const double eps1 = s_.eps, eps2 = s_.x.eps2;
    // Every weight's norm before any update, in one transfer (each depends on its own weights only).
    std::vector<at::Tensor> norms;
    for (const auto &p : params_) norms.push_back(p.norm());
    const at::Tensor norm = at::stack(norms).to(at::kCPU, at::kDouble);
    for (size_t i = 0; i < params_.size(); i++) {
      at::Tensor &p = params_[i];
      const at::Tensor &g = p.grad();
      if (!g.defined()) continue;
      const double n = static_cast<double>(p.numel());
      const double alpha = std::max(eps2, norm.data_ptr<double>()[i] / std::sqrt(n)) * rho;
      if (s_.weight_decay != 0) p.mul_(1 - lr_ * s_.weight_decay);
      at::Tensor var;
      if (g.dim() > 1) {
        at::Tensor &row = st(i, 0), &col = st(i, 1);
        row.lerp_(at::linalg_vector_norm(g, 2, {-1}, true).square_().div_(g.size(-1)), one_minus_beta2);
        col.lerp_(at::linalg_vector_norm(g, 2, {-2}, true).square_().div_(g.size(-2)), one_minus_beta2);
        var = at::matmul(row, col);
        var.div_(row.mean({-2}, true).clamp_(eps1));
      } else {
        at::Tensor &v = st(i, 0);
        v.lerp_(g * g, one_minus_beta2);
        var = v.clone();
      }
      at::Tensor u = var.clamp_(eps1 * eps1).rsqrt_();
      u.mul_(g);
      const double denom = std::max(1.0, u.norm().item<double>() / (std::sqrt(n) * s_.x.clip_threshold));
      p.add_(u, -alpha / denom);
    }
  }
};

}  // namespace

std::unique_ptr<TrainOptimizer> make_adafactor(const OptimizerSettings &s, const std::vector<at::Tensor> &params) {
  return std::make_unique<Adafactor>(s, params);
}

}  // namespace videotrain
