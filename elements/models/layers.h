/* What the native transformers share (elements/models, torch TUs): a Linear whose parameters are
 * named as torch.nn.Linear's (weight, bias), the float32 norms diffusers computes (LayerNorm and
 * RMSNorm over the last dimension), GELU's tanh form, attention that never holds a
 * [tokens x tokens] matrix across the backward pass, and gradient checkpointing of a block. */
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace videotrain::models {

// y = x W^T + b with torch.nn.Linear's names and default init; the one projection every family
// builds on (LoRA wraps it).
struct LinearImpl : torch::nn::Module {
  LinearImpl(int64_t in, int64_t out, bool bias = true);
  at::Tensor forward(const at::Tensor &x);
  at::Tensor weight, bias;
};
TORCH_MODULE(Linear);

// diffusers' RMSNorm over the last dimension, in float32, gain optional; returns float32.
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps, bool affine = true);
  at::Tensor forward(const at::Tensor &x);
  double eps;
  at::Tensor weight;
};
TORCH_MODULE(RMSNorm);

// diffusers' FP32LayerNorm (affine optional): LayerNorm of x in float32; returns float32.
struct LayerNorm32Impl : torch::nn::Module {
  LayerNorm32Impl(int64_t dim, double eps, bool affine);
  at::Tensor forward(const at::Tensor &x);
  int64_t dim;
  double eps;
  at::Tensor weight, bias;
};
TORCH_MODULE(LayerNorm32);

at::Tensor gelu_tanh(const at::Tensor &x);

// softmax(q k^T / sqrt(D)) v for q [B, H, Sq, D], k and v [B, H, Sk, D]. LibTorch's fused
// scaled-dot-product attention where it has one that keeps no probability matrix (CUDA from 2.0,
// CPU from 2.2); scores that fit in one default chunk as plain autograd ops; otherwise queries in
// chunks of `chunk` rows with a backward that recomputes each
// chunk's probabilities from the saved log-sum-exp (flash attention's recurrence), so memory is
// O(chunk x Sk) in both passes. chunk 0: a default that keeps a chunk near 64 MiB.
at::Tensor attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t chunk = 0);
// The chunked path alone (tests compare it with the fused one where both exist).
at::Tensor chunked_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t chunk);

// Gradient checkpointing: out = fn(inputs) without keeping fn's activations; backward runs fn
// again (same autocast state) and back-propagates through it into `inputs` and every parameter
// fn uses. fn must be deterministic (no dropout drawn from a generator).
using BlockFn = std::function<at::Tensor(const std::vector<at::Tensor> &)>;
at::Tensor checkpointed(BlockFn fn, const std::vector<at::Tensor> &inputs);

}  // namespace videotrain::models
