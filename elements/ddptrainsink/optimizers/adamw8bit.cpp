/* optimizer=adamw8bit: AdamW with both moments kept 8-bit blockwise (blockwise_quant.h), as
 * bitsandbytes' AdamW8bit keeps them: each step dequantises the moments, updates them in float32,
 * steps the weights with these float32 values (bias-corrected, eps scaled as in bitsandbytes'
 * kernel: lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps * sqrt(1 - beta2^t))), then
 * stores them quantised: the first moment on the signed map, the second on the unsigned one.
 * State: 2 bytes per value and 8 per block of 256 (AdamW: 8 per value). Unlike bitsandbytes,
 * small tensors (< 4096 values) are quantised too. */
#include <cmath>

#include "blockwise_quant.h"
#include "state_optimizer.h"

namespace videotrain {

namespace {

class AdamW8bit : public StateOptimizer {
 public:
  AdamW8bit(const OptimizerSettings &s, const std::vector<at::Tensor> &params) : StateOptimizer("adamw8bit", s, params) {}

 protected:
  NamedTensors initial_state(const at::Tensor &p) override {
    if (!signed_map_.defined()) {
      signed_map_ = dynamic_map(true).to(p.device());
      unsigned_map_ = dynamic_map(false).to(p.device());
    }
    const at::Tensor zero = at::zeros({p.numel()}, p.options().dtype(at::kFloat));
    Quantized m = quantize_blockwise(zero, signed_map_), v = quantize_blockwise(zero, unsigned_map_);
    return {{"exp_avg_codes", m.codes}, {"exp_avg_absmax", m.absmax}, {"exp_avg_sq_codes", v.codes},
            {"exp_avg_sq_absmax", v.absmax}};
  }

  void update() override {
    const double b1 = s_.beta1, b2 = s_.beta2, t = static_cast<double>(steps_);
    const double c1 = 1 - std::pow(b1, t), c2 = std::sqrt(1 - std::pow(b2, t));
    for (size_t i = 0; i < params_.size(); i++) {
      at::Tensor &p = params_[i];
      const at::Tensor &grad = p.grad();
      if (!grad.defined()) continue;
      const int64_t n = p.numel();
      at::Tensor g = grad.to(at::kFloat).reshape({-1});
      at::Tensor m = dequantize_blocks({st(i, 0), st(i, 1)}, signed_map_).reshape({-1}).slice(0, 0, n);
      at::Tensor v = dequantize_blocks({st(i, 2), st(i, 3)}, unsigned_map_).reshape({-1}).slice(0, 0, n);
      m.mul_(b1).add_(g, 1 - b1);
      v.mul_(b2).addcmul_(g, g, 1 - b2);
      if (s_.weight_decay != 0) p.mul_(1 - lr_ * s_.weight_decay);
      at::Tensor den = v.sqrt().add_(s_.eps * c2);
      p.addcdiv_(m.view_as(p), den.view_as(p), -lr_ * c2 / c1);
      const Quantized qm = quantize_blockwise(m, signed_map_), qv = quantize_blockwise(v, unsigned_map_);
      st(i, 0) = qm.codes;
      st(i, 1) = qm.absmax;
      st(i, 2) = qv.codes;
      st(i, 3) = qv.absmax;
    }
  }

 private:
  at::Tensor signed_map_, unsigned_map_;
};

}  // namespace

std::unique_ptr<TrainOptimizer> make_adamw8bit(const OptimizerSettings &s, const std::vector<at::Tensor> &params) {
  return std::make_unique<AdamW8bit>(s, params);
}

}  // namespace videotrain
