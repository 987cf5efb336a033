/* What the native transformers share (elements/models, torch TUs): a Linear whose parameters are
 * named as torch.nn.Linear's (weight, bias), the float32 norms diffusers computes (LayerNorm and
 * RMSNorm over the last dimension), GELU's tanh form, attention that never holds a
 * [tokens x tokens] matrix across the backward pass, and gradient checkpointing of a block or of
 * the segments of a block around its attention. */
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "attention_backend.h"
#include "block_hooks.h"

namespace videotrain::models {

// y = x W^T + b with torch.nn.Linear's names and default init; the one projection every family
// builds on (LoRA wraps it).
struct LinearImpl : torch::nn::Module {
  LinearImpl(int64_t in, int64_t out, bool bias = true);
  // W x + b, plus scale * B(A dropout(x)) when a LoRA is attached (PEFT's unmerged forward).
  at::Tensor forward(const at::Tensor &x);
  // Attaches (or replaces) a LoRA: children lora_A [rank, in] and lora_B [out, rank], each with a
  // `weight`, so that parameter names are PEFT's (...to_q.lora_A.weight). A Kaiming-uniform as PEFT
  // initialises it (from torch's generator), B zero: the output is unchanged until B trains.
  void add_lora(int64_t rank, double scale, double dropout = 0.0);
  bool has_lora() const { return lora_a.defined(); }
  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }
  // Frozen weight as float8 e4m3 with a float32 scale per output row (absmax / 448, the buffer
  // `weight_scale` [out, 1]); `weight` keeps its name and shape, now 1 byte per element. forward
  // dequantises it to the compute dtype on every use (weight-only storage; LoRA on top as before).
  // Throws when the weight trains or this LibTorch has no float8 (fp8_unavailable()).
  void to_fp8();
  bool is_fp8() const { return weight_scale.defined(); }
  // The dtype the layer computes in: its weight's, or an fp8 weight's scale's.
  at::ScalarType dtype() const { return is_fp8() ? weight_scale.scalar_type() : weight.scalar_type(); }
  at::Tensor weight, bias;
  at::Tensor weight_scale;  // defined once to_fp8() ran
  at::Tensor lora_a, lora_b;  // the children's weights (undefined without a LoRA)
  double lora_scale = 1.0, lora_dropout = 0.0;

 private:
  void replace_module_or_register(const std::string &name, std::shared_ptr<torch::nn::Module> m);
};
TORCH_MODULE(Linear);

// Every Linear of `model` by its dotted name (LoRA targets, merges, the names info lists).
std::map<std::string, LinearImpl *> linear_modules(torch::nn::Module &model);

// "" when this LibTorch stores float8 (2.1 or later), else the requirement (base-dtype=fp8's start error).
std::string fp8_unavailable();
// to_fp8() on every Linear of `model` whose weight does not train (a LoRA run's base); returns the
// bytes the converted weights and scales hold.
int64_t frozen_linears_to_fp8(torch::nn::Module &model);

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

// AdaLN modulation x * (1 + scale) + shift as one addcmul (scale and shift broadcast against x).
at::Tensor shift_scale(const at::Tensor &x, const at::Tensor &shift, const at::Tensor &scale);
// The gated residual (x.float() + y * gate) in x's dtype, as diffusers computes it: one addcmul
// where x and y are float32; otherwise a product and a sum that read the bf16 operands as they are
// (autocast would cast them first for addcmul), then the cast back.
at::Tensor gated_add(const at::Tensor &x, const at::Tensor &y, const at::Tensor &gate);

// Rotary positions as unit complex numbers [..., D/2] (pair i turned by angle i), from cos and sin
// tables [..., D] with each angle repeated for both members of a pair (Wan's and CogVideoX's):
// made once per forward and shared by every block.
at::Tensor rotary_table(const at::Tensor &cos, const at::Tensor &sin);
// The pairs (2i, 2i+1) of x's last dim turned by `table` (rotary_table's; its shape broadcasts
// against x's without the last dim): one complex product in float32 (float64 stays float64),
// returned in float32, so that the caller casts once, after it (q and k leave float32 norms).
at::Tensor rotate_pairs(const at::Tensor &x, const at::Tensor &table);

// softmax(q k^T / sqrt(D)) v for q [B, H, Sq, D], k and v [B, H, Sk, D]. LibTorch's fused
// scaled-dot-product attention where it has one that keeps no probability matrix (CUDA from 2.0,
// CPU from 2.2); float32 scores of at most 256 MiB whole, as plain autograd ops; otherwise queries
// in chunks of `chunk` rows whose backward computes each chunk's probabilities again from q and k,
// so memory is O(chunk x Sk) in both passes. chunk 0: a default that keeps a chunk near 64 MiB.
// `backend` picks the kernel (attention_backend.h); a kernel the inputs or this LibTorch cannot
// run is an error saying why (attention_backend_unavailable says it before a run starts).
at::Tensor attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t chunk = 0,
                     AttentionBackend backend = AttentionBackend::automatic);
// "" when `backend` can run on `device` with this LibTorch (and in bf16 when `bf16`), else why not,
// naming the property value to use instead.
std::string attention_backend_unavailable(AttentionBackend backend, const c10::Device &device, bool bf16);
// The kernel of a follower's (ddpvalsink, ddpsampler) own copy of the trainer's model: its own
// attention-backend on its own device (bf16 on CUDA), not the trainer's; throws naming `element`
// and the device when it cannot run there.
AttentionBackend follower_attention_backend(AttentionBackend backend, const c10::Device &device,
                                            const std::string &element);
// The chunked path alone (tests compare it with the fused one where both exist).
at::Tensor chunked_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t chunk);

// Gradient checkpointing: out = fn(inputs) without keeping fn's activations; backward runs fn
// again (same autocast state) and back-propagates through it into `inputs` and every parameter
// fn uses. fn must be deterministic (no dropout drawn from a generator).
using BlockFn = std::function<at::Tensor(const std::vector<at::Tensor> &)>;
at::Tensor checkpointed(BlockFn fn, const std::vector<at::Tensor> &inputs);
// The same for a segment with several outputs (selective checkpointing: the part of a block before
// its attention returns q, k and v); outputs no later op uses get no gradient.
using SegmentFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor> &)>;
std::vector<at::Tensor> checkpointed_segment(SegmentFn fn, const std::vector<at::Tensor> &inputs);
// Under autocast, a segment's forward casts each trainable float32 weight once and its recompute
// reuses that cast (kept until the segment's backward is done) rather than casting it again.
// false: cast again in the recompute, as autocast alone does (tests and benches compare the two).
void set_keep_weight_casts(bool keep);

}  // namespace videotrain::models
