/* The layers the native transformers share: see layers.h. */
#include "layers.h"

#include <torch/csrc/autograd/functions/utils.h>
#include <torch/version.h>

#include <atomic>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include "autocast_guard.h"

namespace videotrain::models {

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias) {
  weight = register_parameter("weight", torch::empty({out, in}));
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));  // torch.nn.Linear's init
  if (with_bias) {
    const double bound = in > 0 ? 1.0 / std::sqrt(static_cast<double>(in)) : 0.0;
    bias = register_parameter("bias", torch::empty({out}).uniform_(-bound, bound));
  }
}

namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
constexpr bool kHasFp8 = true;
#else
constexpr bool kHasFp8 = false;
#endif

// Autocast's dtype where autocast is on for x's device, else x's dtype: what at::linear will
// compute x in (so an fp8 weight is cast once, not to float32 and again by autocast).
at::ScalarType compute_dtype(const at::Tensor &x) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  const auto dev = x.device().type();
  if ((dev == at::kCUDA || dev == at::kCPU) && at::autocast::is_autocast_enabled(dev))
    return at::autocast::get_autocast_dtype(dev);
#else
  if (x.is_cuda() && at::autocast::is_enabled()) return at::autocast::get_autocast_gpu_dtype();
  if (x.is_cpu() && at::autocast::is_cpu_enabled()) return at::autocast::get_autocast_cpu_dtype();
#endif
  return x.scalar_type();
}

/* The autocast copies (bf16) of trainable float32 weights that a checkpointed segment's forward
 * made, kept for its recompute in backward. Autocast caches such a cast only within one autocast
 * region (at::autocast::cached_cast; AutocastGuard clears the cache when the outermost region
 * ends): the forward's region ends before backward and the recompute opens its own, so without
 * this every weight of a checkpointed block is cast twice per step. The copies are made with
 * gradients on, so the recompute's backward reaches the float32 weight through that same cast;
 * kept from the forward until the recompute has run (then its graph holds what backward needs).
 * Frozen weights are not kept (a LoRA's base would double its memory). */
struct WeightCasts {
  std::unordered_map<const c10::TensorImpl *, at::Tensor> casts;
  bool replay = false;  // the recompute: only look up
};
thread_local WeightCasts *t_weight_casts = nullptr;
std::atomic<bool> g_keep_weight_casts{true};

struct WeightCastScope {
  explicit WeightCastScope(WeightCasts *w) : prev(t_weight_casts) { t_weight_casts = w; }
  ~WeightCastScope() { t_weight_casts = prev; }
  WeightCasts *prev;
};

// `w` as at::linear should take it for input x: the kept cast inside a checkpointed segment.
at::Tensor weight_for(const at::Tensor &w, const at::Tensor &x) {
  WeightCasts *wc = t_weight_casts;
  if (!wc || !w.defined()) return w;
  if (auto it = wc->casts.find(w.unsafeGetTensorImpl()); it != wc->casts.end()) return it->second;
  if (wc->replay || w.scalar_type() != at::kFloat || !w.requires_grad() || !w.is_leaf()) return w;
  const auto dt = compute_dtype(x);
  if (dt == at::kFloat || dt == at::kDouble || x.scalar_type() == at::kDouble) return w;  // no autocast
  at::Tensor c;
  {
    torch::AutoGradMode on(true);
    c = w.to(dt);
  }
  wc->casts.emplace(w.unsafeGetTensorImpl(), c);
  return c;
}

}  // namespace

std::string fp8_unavailable() {
  if (kHasFp8) return "";
  return std::string("base-dtype=fp8 needs LibTorch 2.1 or later (float8 e4m3 storage); this is LibTorch ") +
         TORCH_VERSION + ": use base-dtype=bf16 or a newer LibTorch";
}

void LinearImpl::to_fp8() {
  if (is_fp8()) return;
  if (weight.requires_grad()) throw std::runtime_error("fp8 storage is for frozen weights; this Linear's weight trains");
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  torch::NoGradGuard ng;
  const auto w = weight.to(torch::kFloat);
  const auto amax = w.abs().amax({1}, true);
  // 448 is e4m3's largest finite value; an all-zero row keeps scale 1 rather than dividing by 0.
  const auto scale = torch::where(amax > 0, amax / 448.0, torch::ones_like(amax));
  const auto q = (w / scale).clamp(-448.0, 448.0).to(at::kFloat8_e4m3fn);
  weight.set_data(q);  // same parameter, name and shape; the float storage is freed
  weight_scale = register_buffer("weight_scale", scale);
#else
  throw std::runtime_error(fp8_unavailable());
#endif
}

int64_t frozen_linears_to_fp8(torch::nn::Module &model) {
  int64_t bytes = 0;
  for (auto &[name, l] : linear_modules(model)) {
    if (l->weight.requires_grad()) continue;
    l->to_fp8();
    bytes += l->weight.numel() * l->weight.element_size() + l->weight_scale.numel() * l->weight_scale.element_size();
  }
  return bytes;
}

at::Tensor LinearImpl::forward(const at::Tensor &x) {
  // at::linear, not torch::nn::functional::linear: the C++ frontend's own version takes matmul and
  // a separate bias add for [B, S, in] inputs, where ATen's folds the bias into the GEMM (addmm).
  // An fp8 weight is dequantised per use: the cost of keeping it at 1 byte per element.
  at::Tensor w = weight_for(weight, x);
  if (is_fp8()) {
    const auto dt = compute_dtype(x);
    w = weight.to(dt).mul_(weight_scale.to(dt));
  }
  auto y = at::linear(x, w, weight_for(bias, x));
  if (!lora_a.defined()) return y;
  const auto xd = lora_dropout > 0 && is_training() ? torch::dropout(x, lora_dropout, true) : x;
  return at::add(y, at::linear(at::linear(xd, weight_for(lora_a, x)), weight_for(lora_b, x)), lora_scale);
}

void LinearImpl::add_lora(int64_t rank, double scale, double dropout) {
  auto a = std::make_shared<torch::nn::Module>(), b = std::make_shared<torch::nn::Module>();
  lora_a = a->register_parameter("weight", torch::empty({rank, in_features()}, weight.options().dtype(torch::kFloat)));
  torch::NoGradGuard ng;
  torch::nn::init::kaiming_uniform_(lora_a, std::sqrt(5.0));  // PEFT's default for lora_A
  lora_b = b->register_parameter("weight", torch::zeros({out_features(), rank}, lora_a.options()));
  replace_module_or_register("lora_A", a);
  replace_module_or_register("lora_B", b);
  lora_scale = scale;
  lora_dropout = dropout;
}

void LinearImpl::replace_module_or_register(const std::string &name, std::shared_ptr<torch::nn::Module> m) {
  if (named_children().contains(name))
    replace_module(name, m);
  else
    register_module(name, m);
}

std::map<std::string, LinearImpl *> linear_modules(torch::nn::Module &model) {
  std::map<std::string, LinearImpl *> out;
  for (const auto &item : model.named_modules("", false))
    if (auto *l = item.value()->as<LinearImpl>()) out[item.key()] = l;
  return out;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, bool affine) : eps(eps_) {
  if (affine) weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor &x) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // ATen's own (fused where LibTorch has a kernel for it), on float32 input: diffusers' float32 result.
  return at::rms_norm(x.to(at::kFloat), {x.size(-1)}, weight.defined() ? weight.to(at::kFloat) : at::Tensor(), eps);
#else
  auto h = x.to(at::kFloat);
  h = h * torch::rsqrt(h.pow(2).mean(-1, true) + eps);
  return weight.defined() ? h * weight.to(at::kFloat) : h;
#endif
}

LayerNorm32Impl::LayerNorm32Impl(int64_t dim_, double eps_, bool affine) : dim(dim_), eps(eps_) {
  if (affine) {
    weight = register_parameter("weight", torch::ones({dim}));
    bias = register_parameter("bias", torch::zeros({dim}));
  }
}

at::Tensor LayerNorm32Impl::forward(const at::Tensor &x) {
  return at::layer_norm(x.to(at::kFloat), {dim}, weight.defined() ? weight.to(at::kFloat) : at::Tensor(),
                        bias.defined() ? bias.to(at::kFloat) : at::Tensor(), eps);
}

at::Tensor gelu_tanh(const at::Tensor &x) { return at::gelu(x, "tanh"); }

at::Tensor shift_scale(const at::Tensor &x, const at::Tensor &shift, const at::Tensor &scale) {
  return at::addcmul(shift, x, 1 + scale);
}

at::Tensor gated_add(const at::Tensor &x, const at::Tensor &y, const at::Tensor &gate) {
  if (x.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat) return at::addcmul(x, y, gate);
  return at::add(x, at::mul(y, gate.to(at::kFloat))).to(x.scalar_type());
}

at::Tensor rotary_table(const at::Tensor &cos, const at::Tensor &sin) {
  return at::complex(cos.slice(-1, 0, c10::nullopt, 2).to(at::kFloat), sin.slice(-1, 0, c10::nullopt, 2).to(at::kFloat));
}

at::Tensor rotate_pairs(const at::Tensor &x, const at::Tensor &table) {
  auto xf = x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
  if (xf.stride(-1) != 1) xf = xf.contiguous();  // view_as_complex needs the pairs adjacent
  const auto t = xf.scalar_type() == at::kDouble ? table.to(at::kComplexDouble) : table;
  return at::view_as_real(at::view_as_complex(xf.unflatten(-1, {-1, 2})) * t).flatten(-2);
}

namespace {

// Query rows whose float32 scores fit `budget_mb` (all of them: q.size(2)).
int64_t rows_within(const at::Tensor &q, const at::Tensor &k, int64_t budget_mb) {
  const int64_t per_row = q.size(0) * q.size(1) * k.size(2) * 4;  // float32 scores of one query row
  const int64_t rows = std::max<int64_t>(1, (budget_mb << 20) / std::max<int64_t>(1, per_row));
  return std::min<int64_t>(rows, q.size(2));
}
// Chunks of 64 MB of scores; whole scores up to 256 MB (autograd then keeps the probabilities, no
// more than the block's other saved activations at such sizes, and backward needs no recompute).
int64_t default_chunk(const at::Tensor &q, const at::Tensor &k) { return rows_within(q, k, 64); }
bool scores_fit_whole(const at::Tensor &q, const at::Tensor &k) { return rows_within(q, k, 256) >= q.size(2); }

// Scores and softmax in float32 (double stays double).
at::ScalarType accumulate_type(const at::Tensor &t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

/* Attention in query chunks: each chunk's [n x Sk] scores live only while it is computed, and
 * backward computes them again. q (scaled: a pass over [Sq x D] rather than over the scores), k
 * and v are laid out once as [B*H, S, D] for batched GEMMs; the probabilities come from one fused
 * softmax, forward and again in backward, so nothing but
 * q, k, v and the output is kept. */
struct ChunkedAttention : torch::autograd::Function<ChunkedAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &q, const at::Tensor &k,
                            const at::Tensor &v, int64_t chunk) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const auto acc = accumulate_type(q);
    const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), Sk = k.size(2);
    const auto q3 = (q * scale).reshape({B * H, Sq, q.size(3)}).contiguous();
    const auto k3 = k.reshape({B * H, Sk, k.size(3)}).contiguous(), v3 = v.reshape({B * H, Sk, v.size(3)}).contiguous();
    auto out3 = at::empty({B * H, Sq, v.size(3)}, v.options());
    const auto kt = k3.transpose(1, 2);
    for (int64_t s = 0; s < Sq; s += chunk) {
      const int64_t n = std::min(chunk, Sq - s);
      const auto p = at::softmax(at::bmm(q3.narrow(1, s, n), kt), -1, acc);
      out3.narrow(1, s, n).copy_(at::bmm(p.to(v.scalar_type()), v3));
    }
    ctx->save_for_backward({q3, k3, v3, out3});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["heads"] = H;
    return out3.view({B, H, Sq, v.size(3)});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q3 = saved[0], &k3 = saved[1], &v3 = saved[2], &out3 = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t H = ctx->saved_data["heads"].toInt();
    const double scale = 1.0 / std::sqrt(static_cast<double>(q3.size(2)));
    const auto acc = accumulate_type(q3);
    const int64_t B = q3.size(0) / H, Sq = q3.size(1), Sk = k3.size(1);
    const auto go3 = grads[0].to(out3.scalar_type()).reshape(out3.sizes()).contiguous();
    auto dq3 = at::empty_like(q3);
    auto dk3 = at::zeros(k3.sizes(), k3.options().dtype(acc)), dv3 = at::zeros(v3.sizes(), v3.options().dtype(acc));
    const auto kt = k3.transpose(1, 2), vt = v3.transpose(1, 2);
    for (int64_t s = 0; s < Sq; s += chunk) {
      const int64_t n = std::min(chunk, Sq - s);
      const auto qc = q3.narrow(1, s, n), goc = go3.narrow(1, s, n).to(acc);
      auto p = at::softmax(at::bmm(qc, kt), -1, acc);
      dv3 += at::bmm(p.transpose(1, 2), goc);
      auto dp = at::bmm(goc.to(v3.scalar_type()), vt).to(acc);
      const auto delta = (goc * out3.narrow(1, s, n).to(acc)).sum(-1, true);
      // d(scores) without the scale, which q3 carries into dk and dq takes below.
      const auto ds = p.mul_(dp.sub_(delta));
      dq3.narrow(1, s, n).copy_(at::bmm(ds.to(k3.scalar_type()), k3));
      dk3 += at::bmm(ds.transpose(1, 2), qc.to(acc));
    }
    const auto dq = dq3.mul_(scale).view({B, H, Sq, q3.size(2)});
    const auto dk = dk3.to(k3.scalar_type()).view({B, H, Sk, k3.size(2)});
    const auto dv = dv3.to(v3.scalar_type()).view({B, H, Sk, v3.size(2)});
    return {dq, dk, dv, at::Tensor()};
  }
};

#if TORCH_VERSION_MAJOR >= 2
bool fused_attention_here(const at::Tensor &q) {
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 2
  (void)q;
  return true;  // CUDA flash/memory-efficient kernels, CPU flash attention
#else
  return q.is_cuda();
#endif
}
#endif

}  // namespace

at::Tensor chunked_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t chunk) {
  if (chunk <= 0) chunk = default_chunk(q, k);
  // One dtype for the three (autocast may have cast only some of the projections).
  const auto dt = at::promote_types(at::promote_types(q.scalar_type(), k.scalar_type()), v.scalar_type());
  return ChunkedAttention::apply(q.to(dt), k.to(dt), v.to(dt), chunk);
}

namespace {

// Our kernel: whole scores while they fit, else chunks (AttentionBackend::math).
at::Tensor own_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t chunk) {
  // Scores small enough to keep whole: plain autograd (no recompute in backward) is faster.
  // The scale goes on q, not on the [Sq x Sk] scores: a pass over the largest tensor fewer, each way.
  if (chunk <= 0 && scores_fit_whole(q, k)) {
    const auto dt = at::promote_types(at::promote_types(q.scalar_type(), k.scalar_type()), v.scalar_type());
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const auto scores = at::matmul(q.to(dt) * scale, k.to(dt).transpose(-1, -2)).to(accumulate_type(q));
    return at::matmul(at::softmax(scores, -1).to(dt), v.to(dt));
  }
  return chunked_attention(q, k, v, chunk);
}

constexpr int kTorchMinor = TORCH_VERSION_MAJOR > 2 ? 99 : (TORCH_VERSION_MAJOR == 2 ? TORCH_VERSION_MINOR : -1);

}  // namespace

std::string attention_backend_unavailable(AttentionBackend backend, const c10::Device &device, bool bf16) {
  const std::string name = std::string("attention-backend=") + attention_backend_name(backend);
  const std::string version = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  switch (backend) {
    case AttentionBackend::automatic:
    case AttentionBackend::math: return "";
    case AttentionBackend::flash:
      if (kTorchMinor < 0) return name + " needs LibTorch 2.x (this is " + version + "): use auto or math";
      if (device.is_cuda()) return bf16 ? "" : name + " runs in bf16 or fp16 only on CUDA: set precision=bf16, or use auto";
      if (kTorchMinor < 2) return name + " on the CPU needs LibTorch 2.2 or later (this is " + version + "): use auto or math";
      return "";
    case AttentionBackend::efficient:
      if (kTorchMinor < 0) return name + " needs LibTorch 2.x (this is " + version + "): use auto or math";
      return device.is_cuda() ? "" : name + " is a CUDA kernel: on the CPU use auto, flash or math";
    case AttentionBackend::cudnn:
      if (kTorchMinor < 5) return name + " needs LibTorch 2.5 or later (this is " + version + "): use auto, flash or math";
      return device.is_cuda() ? "" : name + " is a CUDA kernel: on the CPU use auto, flash or math";
  }
  return "";
}

AttentionBackend follower_attention_backend(AttentionBackend backend, const c10::Device &device,
                                            const std::string &element) {
  if (std::string why = attention_backend_unavailable(backend, device, device.is_cuda()); !why.empty())
    throw std::runtime_error(why + " (" + element + " on " + device.str() + ")");
  return backend;
}

at::Tensor attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t chunk,
                     AttentionBackend backend) {
  if (backend == AttentionBackend::math) return own_attention(q, k, v, chunk);
  if (backend != AttentionBackend::automatic) {
    const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
    if (std::string why = attention_backend_unavailable(backend, q.device(), half); !why.empty())
      throw std::runtime_error(why);
  }
#if TORCH_VERSION_MAJOR >= 2
  // The fused kernels take one dtype (autocast may have cast only some of the projections).
  const auto dt = at::promote_types(at::promote_types(q.scalar_type(), k.scalar_type()), v.scalar_type());
  const bool lse = q.requires_grad() || k.requires_grad() || v.requires_grad();  // what their backward needs
  switch (backend) {
    case AttentionBackend::flash:
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 2
      if (!q.is_cuda()) return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(q.to(dt), k.to(dt), v.to(dt)));
#endif
      return std::get<0>(at::_scaled_dot_product_flash_attention(q.to(dt), k.to(dt), v.to(dt)));
    case AttentionBackend::efficient:
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 1
      return std::get<0>(at::_scaled_dot_product_efficient_attention(q.to(dt), k.to(dt), v.to(dt), c10::nullopt, lse));
#else
      return std::get<0>(at::_scaled_dot_product_efficient_attention(q.to(dt), k.to(dt), v.to(dt), lse));
#endif
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 5
    case AttentionBackend::cudnn:
      return std::get<0>(at::_scaled_dot_product_cudnn_attention(q.to(dt), k.to(dt), v.to(dt), c10::nullopt, lse));
#endif
    default: break;
  }
  if (fused_attention_here(q)) return at::scaled_dot_product_attention(q, k, v);
#else
  (void)backend;
#endif
  return own_attention(q, k, v, chunk);
}

namespace {

// The backward of a checkpointed segment: runs it again with gradients on, then back-propagates
// the incoming gradients of its outputs through it (parameters accumulate their .grad as usual,
// so the trainer's gradient hooks see them) and hands on the inputs' gradients.
struct CheckpointBackward : torch::autograd::Node {
  SegmentFn fn;
  std::vector<at::Tensor> inputs;  // detached
  std::vector<bool> needs_grad;
  bool autocast = false, autocast_cuda = false;
  BlockHooks *hooks = nullptr;  // of the block this segment belongs to (block_hooks.h)
  int block = -1;
  bool block_first = false;  // the block's first segment: its backward ends the block's
  WeightCasts weight_casts;  // the forward's, for the recompute

  torch::autograd::variable_list apply(torch::autograd::variable_list &&grads) override {
    if (hooks) hooks->acquire(block, BlockUse::recompute);
    std::vector<at::Tensor> xs;
    for (size_t i = 0; i < inputs.size(); i++) {
      auto x = inputs[i].detach();
      if (needs_grad[i]) x.requires_grad_(true);
      xs.push_back(x);
    }
    std::vector<at::Tensor> outs;
    {
      torch::AutoGradMode on(true);
      AutocastGuard cast(autocast, autocast_cuda);
      weight_casts.replay = true;
      WeightCastScope replay(weight_casts.casts.empty() ? nullptr : &weight_casts);
      outs = fn(xs);
    }
    weight_casts.casts.clear();  // the recompute's graph holds what its backward still needs
    // Outputs no later op used (or that depend on nothing trainable) get no gradient.
    std::vector<at::Tensor> ys, gs;
    for (size_t i = 0; i < outs.size() && i < grads.size(); i++)
      if (grads[i].defined() && outs[i].requires_grad()) {
        ys.push_back(outs[i]);
        gs.push_back(grads[i]);
      }
    if (!ys.empty()) torch::autograd::backward(ys, gs);
    torch::autograd::variable_list res;
    for (size_t i = 0; i < xs.size(); i++) res.push_back(needs_grad[i] ? xs[i].grad() : at::Tensor());
    if (hooks && block_first) hooks->backward_done(block);
    return res;
  }
  void release_variables() override {
    inputs.clear();
    fn = nullptr;
    weight_casts.casts.clear();
  }
};

bool autocast_on(bool cuda) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return at::autocast::is_autocast_enabled(cuda ? at::kCUDA : at::kCPU);
#else
  return cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

}  // namespace

std::vector<at::Tensor> checkpointed_segment(SegmentFn fn, const std::vector<at::Tensor> &inputs) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 12)
  auto node = c10::make_intrusive<CheckpointBackward>();  // autograd holds nodes in intrusive_ptr from 2.12
#else
  auto node = std::shared_ptr<CheckpointBackward>(new CheckpointBackward(), torch::autograd::deleteNode);
#endif
  std::vector<at::Tensor> outs;
  {
    torch::NoGradGuard ng;
    // Sharded weights (block hooks) are gathered per use: kept casts would hold them whole.
    const BlockContext *b = current_block();
    WeightCastScope record(b && b->hooks || !g_keep_weight_casts ? nullptr : &node->weight_casts);
    outs = fn(inputs);
  }
  node->fn = std::move(fn);
  if (BlockContext *b = current_block(); b && b->hooks) {
    node->hooks = b->hooks;
    node->block = b->block;
    node->block_first = b->segments++ == 0;
  }
  for (const auto &x : inputs) {
    node->inputs.push_back(x.detach());
    node->needs_grad.push_back(x.requires_grad());
  }
  const bool cuda = !outs.empty() && outs[0].is_cuda();
  node->autocast = autocast_on(cuda);
  node->autocast_cuda = cuda;
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  // Detached first: an output may be a view (q as a transpose), and a view made without gradients
  // must not carry a gradient edge of its own; detach() gives a plain alias with the same strides.
  for (auto &y : outs) {
    y = y.detach();
    torch::autograd::set_history(y, node);  // output i is the node's input i
  }
  return outs;
}

namespace {
thread_local BlockContext *t_block = nullptr;
}  // namespace

BlockContext *current_block() { return t_block; }

BlockScope::BlockScope(BlockHooks *hooks, int block) : prev_(t_block) {
  ctx_.hooks = hooks;
  ctx_.block = block;
  t_block = &ctx_;
  if (hooks) hooks->acquire(block, BlockUse::forward);
}

BlockScope::~BlockScope() {
  t_block = prev_;
  if (ctx_.hooks) ctx_.hooks->forward_done(ctx_.block);
}

void set_keep_weight_casts(bool keep) { g_keep_weight_casts = keep; }

at::Tensor checkpointed(BlockFn fn, const std::vector<at::Tensor> &inputs) {
  return checkpointed_segment([fn = std::move(fn)](const std::vector<at::Tensor> &in) { return std::vector<at::Tensor>{fn(in)}; },
                              inputs)[0];
}

}  // namespace videotrain::models
