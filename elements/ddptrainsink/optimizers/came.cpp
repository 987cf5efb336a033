/* optimizer=came: CAME (Luo et al., ACL 2023, "Confidence-guided Adaptive Memory Efficient
 * Optimization"), as its authors' reference implementation steps: Adafactor's factored second
 * moment (eps added to g^2), the update clipped to RMS clip-threshold, a first moment of the
 * update, and a factored moment of the instability (update - first moment)^2 + eps2 (beta3)
 * that scales the first moment into the step; vectors keep whole moments and step by the first
 * moment alone. Decoupled weight decay lr * weight-decay. */
#include <cmath>

#include "state_optimizer.h"

namespace videotrain {

namespace {

// The factored moment's approximation: rsqrt(row / mean(row)) x rsqrt(col).
at::Tensor approx_sq(const at::Tensor &row, const at::Tensor &col) {
  at::Tensor r = (row / row.mean({-1}, true)).rsqrt_().unsqueeze(-1);
  at::Tensor c = col.unsqueeze(-2).rsqrt();
  return at::mul(r, c);
}

at::Tensor rms(const at::Tensor &t) { return t.norm() / std::sqrt(static_cast<double>(t.numel())); }

class Came : public StateOptimizer {
 public:
  Came(const OptimizerSettings &s, const std::vector<at::Tensor> &params) : StateOptimizer("came", s, params) {}

 protected:
  NamedTensors initial_state(const at::Tensor &p) override {
    NamedTensors s{{"exp_avg", at::zeros_like(p)}};
    if (p.dim() >= 2) {
      auto row = p.sizes().vec(), col = p.sizes().vec();
      row.pop_back();
      col.erase(col.end() - 2);
      s.emplace_back("exp_avg_sq_row", at::zeros(row, p.options()));
      s.emplace_back("exp_avg_sq_col", at::zeros(col, p.options()));
      s.emplace_back("exp_avg_res_row", at::zeros(row, p.options()));
      s.emplace_back("exp_avg_res_col", at::zeros(col, p.options()));
    } else {
      s.emplace_back("exp_avg_sq", at::zeros_like(p));
    }
    return s;
  }

  void update() override {
    const double b1 = s_.beta1, b2 = s_.beta2, b3 = s_.x.beta3;
    for (size_t i = 0; i < params_.size(); i++) {
      at::Tensor &p = params_[i];
      const at::Tensor &g = p.grad();
      if (!g.defined()) continue;
      const bool factored = g.dim() >= 2;
      at::Tensor u = at::pow(g, 2) + s_.eps;
      if (factored) {
        st(i, 1).mul_(b2).add_(u.mean({-1}), 1 - b2);
        st(i, 2).mul_(b2).add_(u.mean({-2}), 1 - b2);
        u = approx_sq(st(i, 1), st(i, 2));
        u.mul_(g);
      } else {
        st(i, 1).mul_(b2).add_(u, 1 - b2);
        u = st(i, 1).rsqrt().mul_(g);
      }
      u.div_((rms(u) / s_.x.clip_threshold).clamp_(1.0));
      at::Tensor &m = st(i, 0);
      m.mul_(b1).add_(u, 1 - b1);
      if (factored) {
        at::Tensor res = at::pow(u - m, 2) + s_.x.eps2;
        st(i, 3).mul_(b3).add_(res.mean({-1}), 1 - b3);
        st(i, 4).mul_(b3).add_(res.mean({-2}), 1 - b3);
        u = approx_sq(st(i, 3), st(i, 4)).mul_(m);
      } else {
        u = m.clone();
      }
      if (s_.weight_decay != 0) p.add_(p, -s_.weight_decay * lr_);
      u.mul_(lr_);
      p.add_(-u);
    }
  }
};

}  // namespace

std::unique_ptr<TrainOptimizer> make_came(const OptimizerSettings &s, const std::vector<at::Tensor> &params) {
  return std::make_unique<Came>(s, params);
}

}  // namespace videotrain
