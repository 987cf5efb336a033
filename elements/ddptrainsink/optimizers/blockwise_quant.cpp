/* Blockwise 8-bit quantisation (blockwise_quant.h). */
#include "blockwise_quant.h"

#include <cmath>
#include <vector>

namespace videotrain {

at::Tensor dynamic_map(bool is_signed) {
  // In double, rounded once to float32: the same values whatever linspace's float32 rounding.
  std::vector<float> v;
  for (int i = 0; i < 7; i++) {
    const int parts = 1 << (is_signed ? i : i + 1);
    for (int j = 0; j < parts; j++) {
      const double x = (0.1 + 0.9 * (j + 0.5) / parts) * std::pow(10.0, i - 6);
      v.push_back(static_cast<float>(x));
      if (is_signed) v.push_back(static_cast<float>(-x));
    }
  }
  v.push_back(0.0f);
  v.push_back(1.0f);
  return std::get<0>(at::tensor(v).sort());
}

// Block-major view of the flattened `x`, zero-padded to whole blocks.
static at::Tensor blocks(const at::Tensor &x) {
  const int64_t n = x.numel(), nb = (n + kQuantBlock - 1) / kQuantBlock;
  at::Tensor f = x.reshape({-1});
  if (nb * kQuantBlock != n) f = at::constant_pad_nd(f, {0, nb * kQuantBlock - n});
  return f.view({nb, kQuantBlock});
}

Quantized quantize_blockwise(const at::Tensor &x, const at::Tensor &map) {
  at::Tensor b = blocks(x);
  at::Tensor absmax = b.abs().amax({1});
  at::Tensor scale = at::where(absmax > 0, absmax, at::ones_like(absmax));
  at::Tensor norm = b / scale.unsqueeze(1);
  // Nearest map value: the first midpoint at or above the value is its code's upper bound.
  at::Tensor mids = (map.slice(0, 0, map.size(0) - 1) + map.slice(0, 1)) / 2.0;
  at::Tensor idx = at::searchsorted(mids, norm.reshape({-1}));
  return {idx.slice(0, 0, x.numel()).to(at::kByte), absmax};
}

at::Tensor dequantize_blocks(const Quantized &q, const at::Tensor &map) {
  at::Tensor v = map.index_select(0, q.codes.to(at::kLong));
  return blocks(v) * q.absmax.unsqueeze(1);
}

}  // namespace videotrain
