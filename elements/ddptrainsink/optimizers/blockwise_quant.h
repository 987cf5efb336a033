/* Blockwise 8-bit quantisation of optimizer state, as bitsandbytes' 8-bit optimizers keep it:
 * blocks of 256 values, each scaled by its absolute maximum and rounded to the nearest of 256
 * values of a dynamic (exponent + fraction) map, signed for values of either sign, unsigned for
 * non-negative ones. */
#pragma once

#include <ATen/ATen.h>

namespace videotrain {

constexpr int64_t kQuantBlock = 256;

// The dynamic map of bitsandbytes' create_dynamic_map(signed, 7, 8): 256 sorted float32
// values in [-1, 1] (signed) or [0, 1]: for i in 0..6 the midpoints of an even split of
// [0.1, 1] into 2^i (signed) or 2^(i+1) (unsigned) parts times 10^(i-6), their negatives when
// signed, and 0 and 1 (bitsandbytes rounds its float32 linspace: values may differ by an ulp).
at::Tensor dynamic_map(bool is_signed);

// An 8-bit blockwise tensor: `codes` (uint8, one per value) and `absmax` (float32, one per block).
struct Quantized {
  at::Tensor codes, absmax;
};

// `x` (float32, any shape) to codes of `map` (nearest value; a block of zeros has absmax 0).
Quantized quantize_blockwise(const at::Tensor &x, const at::Tensor &map);
// Back to float32 in blocks: [ceil(numel / 256), 256] (the padding zero).
at::Tensor dequantize_blocks(const Quantized &q, const at::Tensor &map);

}  // namespace videotrain
