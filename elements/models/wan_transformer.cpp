/* Wan 2.1 / 2.2 transformer: see wan_transformer.h. The computation follows diffusers'
 * transformer_wan.py (commit 58eb52c), checked against its outputs and gradients in
 * tests/models/test_wan_transformer.cpp. */
#include "wan_transformer.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace videotrain::models {

/* ---------------- attention ---------------- */


WanAttentionImpl::WanAttentionImpl(int64_t dim, int64_t heads_, double eps, int64_t added_kv_proj_dim) : heads(heads_) {
  to_q = register_module("to_q", Linear(dim, dim));
  to_k = register_module("to_k", Linear(dim, dim));
  to_v = register_module("to_v", Linear(dim, dim));
  to_out = register_module("to_out", torch::nn::ModuleList());
  to_out->push_back(Linear(dim, dim));
  to_out->push_back(torch::nn::Identity());  // diffusers' dropout: no parameters
  norm_q = register_module("norm_q", RMSNorm(dim, eps));
  norm_k = register_module("norm_k", RMSNorm(dim, eps));
  if (added_kv_proj_dim) {
    add_k_proj = register_module("add_k_proj", Linear(added_kv_proj_dim, dim));
    add_v_proj = register_module("add_v_proj", Linear(added_kv_proj_dim, dim));
    norm_added_k = register_module("norm_added_k", RMSNorm(dim, eps));
  }
}

std::vector<at::Tensor> WanAttentionImpl::qkv(const at::Tensor &x, const at::Tensor &context, const at::Tensor &rope) {
  const auto v = to_v(context);
  // q and k leave their norms in float32, are turned in float32 ([B, S, H, D] against the [S, 1, D/2]
  // table) and cast once to v's dtype (bf16 under autocast): diffusers' order, one cast each.
  auto q = norm_q(to_q(x)).unflatten(2, {heads, -1});
  auto k = norm_k(to_k(context)).unflatten(2, {heads, -1});
  if (rope.defined()) {
    q = rotate_pairs(q, rope);
    k = rotate_pairs(k, rope);
  }
  const auto dt = v.scalar_type();
  return {q.to(dt).transpose(1, 2), k.to(dt).transpose(1, 2), v.unflatten(2, {heads, -1}).transpose(1, 2)};
}

at::Tensor WanAttentionImpl::out(const at::Tensor &o) { return to_out[0]->as<Linear>()->forward(o.transpose(1, 2).flatten(2)); }

at::Tensor WanAttentionImpl::forward(const at::Tensor &x, const at::Tensor &context, const at::Tensor &rope) {
  if (!add_k_proj) {
    const auto p = qkv(x, context, rope);
    return out(attention(p[0], p[1], p[2], 0, backend));
  }
  // I2V: the same queries attend to the text and, separately, to the image tokens (their own keys and
  // values); the two results are summed before the output projection. Where the image part ends is
  // diffusers' WanAttnProcessor's rule: the context's last 512 rows are text (the Wan pipelines pad
  // the text to 512, so the image encoder's tokens come first, as in the Wan authors' code); with a
  // shorter context, Python's slicing of [:L-512] and [L-512:].
  const int64_t L = context.size(1);
  const int64_t split = L >= kWanImageModelTextRows ? L - kWanImageModelTextRows : std::max<int64_t>(0, 2 * L - kWanImageModelTextRows);
  const auto img = context.narrow(1, 0, split);
  const auto p = qkv(x, context.narrow(1, split, L - split), rope);
  const auto v_img = add_v_proj(img).unflatten(2, {heads, -1}).transpose(1, 2);
  const auto k_img = norm_added_k(add_k_proj(img)).to(v_img.scalar_type()).unflatten(2, {heads, -1}).transpose(1, 2);
  // No image rows: diffusers' attention over zero keys, zeros (and zero gradients for the image path).
  const auto o_img = split ? attention(p[0], k_img, v_img, 0, backend)
                           : at::softmax(at::matmul(p[0], k_img.transpose(-1, -2)), -1).matmul(v_img);
  return out(attention(p[0], p[1], p[2], 0, backend) + o_img);
}

/* ---------------- block ---------------- */

namespace {
struct GeluProjImpl : torch::nn::Module {  // diffusers' GELU(approximate="tanh"): net.0.proj
  GeluProjImpl(int64_t in, int64_t out) { proj = register_module("proj", Linear(in, out)); }
  at::Tensor forward(const at::Tensor &x) { return gelu_tanh(proj(x)); }
  Linear proj{nullptr};
};
TORCH_MODULE(GeluProj);
}  // namespace

WanBlockImpl::WanBlockImpl(const WanConfig &c) {
  const int64_t dim = c.dim();
  norm1 = LayerNorm32(dim, c.eps, false);  // no parameters: not registered, as in diffusers' state dict
  attn1 = register_module("attn1", WanAttention(dim, c.num_attention_heads, c.eps));
  attn2 = register_module("attn2", WanAttention(dim, c.num_attention_heads, c.eps, c.added_kv_proj_dim));
  if (c.cross_attn_norm) norm2 = register_module("norm2", LayerNorm32(dim, c.eps, true));
  norm3 = LayerNorm32(dim, c.eps, false);
  auto ffn = register_module("ffn", std::make_shared<torch::nn::Module>());
  ffn_net = ffn->register_module("net", torch::nn::ModuleList());
  ffn_net->push_back(GeluProj(dim, c.ffn_dim));
  ffn_net->push_back(torch::nn::Identity());
  ffn_net->push_back(Linear(c.ffn_dim, dim));
  scale_shift_table = register_parameter("scale_shift_table", torch::randn({1, 6, dim}) / std::sqrt(double(dim)));
}

// mod [B, 1|S, 6, dim] + table [1, 6, dim] -> six [B, 1|S, dim] (shift, scale, gate; then for the FFN).
// Computed again by tail: tiny, and each part's gradient has its own entries of the stack.
std::vector<at::Tensor> WanBlockImpl::modulation(const at::Tensor &mod) {
  return (scale_shift_table.to(at::kFloat).unsqueeze(0) + mod.to(at::kFloat)).unbind(2);
}

std::vector<at::Tensor> WanBlockImpl::head(const at::Tensor &x, const at::Tensor &mod, const at::Tensor &rope) {
  const auto m = modulation(mod);
  const auto n = shift_scale(norm1(x), m[0], m[1]).to(x.scalar_type());
  return attn1->qkv(n, n, rope);
}

at::Tensor WanBlockImpl::tail(const at::Tensor &x, const at::Tensor &context, const at::Tensor &mod,
                              const at::Tensor &o) {
  const auto m = modulation(mod);
  auto h = gated_add(x, attn1->out(o), m[2]);
  auto n = norm2 ? norm2(h).to(h.scalar_type()) : h;
  h = h + attn2(n, context, at::Tensor());
  n = shift_scale(norm3(h), m[3], m[4]).to(h.scalar_type());
  auto ff = ffn_net[2]->as<Linear>()->forward(ffn_net[0]->as<GeluProj>()->forward(n));
  return gated_add(h, ff, m[5]);
}

at::Tensor WanBlockImpl::forward(const at::Tensor &x, const at::Tensor &context, const at::Tensor &mod,
                                 const at::Tensor &rope) {
  const auto p = head(x, mod, rope);
  return tail(x, context, mod, attention(p[0], p[1], p[2], 0, attn1->backend));
}

/* ---------------- model ---------------- */

namespace {

std::shared_ptr<torch::nn::Module> two_linears(int64_t in, int64_t mid, int64_t out, Linear *l1, Linear *l2) {
  auto m = std::make_shared<torch::nn::Module>();
  *l1 = m->register_module("linear_1", Linear(in, mid));
  *l2 = m->register_module("linear_2", Linear(mid, out));
  return m;
}

// diffusers' Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0): [cos, sin] of t * 10000^(-i/half).
at::Tensor timestep_sinusoid(const at::Tensor &t, int64_t dim) {
  const int64_t half = dim / 2;
  const auto freqs = at::exp(at::arange(half, t.options().dtype(at::kFloat)) * (-std::log(10000.0) / half));
  const auto a = t.to(at::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  return at::cat({a.cos(), a.sin()}, -1);
}

// The rotary axes' sizes: h and w get 2 * (head_dim / 6) each, t the rest.
std::array<int64_t, 3> rope_axes(int64_t head_dim) {
  const int64_t hw = 2 * (head_dim / 6);
  return {head_dim - 2 * hw, hw, hw};
}

std::string shape_of(const at::Tensor &t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

}  // namespace

WanTransformerImpl::WanTransformerImpl(const WanConfig &c) : cfg(c) {
  const int64_t dim = c.dim();
  const auto &p = c.patch_size;
  patch_embedding = register_module(
      "patch_embedding", torch::nn::Conv3d(torch::nn::Conv3dOptions(c.in_channels, dim, {p[0], p[1], p[2]})
                                               .stride({p[0], p[1], p[2]})));
  auto ce = register_module("condition_embedder", std::make_shared<torch::nn::Module>());
  ce->register_module("time_embedder", two_linears(c.freq_dim, dim, dim, &time_1, &time_2));
  time_proj = ce->register_module("time_proj", Linear(dim, 6 * dim));
  ce->register_module("text_embedder", two_linears(c.text_dim, dim, dim, &text_1, &text_2));
  if (c.image_dim) {  // diffusers' WanImageEmbedding: FP32 LayerNorms (eps 1e-5), FeedForward with exact GELU
    auto ie = ce->register_module("image_embedder", std::make_shared<torch::nn::Module>());
    image_norm1 = ie->register_module("norm1", LayerNorm32(c.image_dim, 1e-5, true));
    auto ff = ie->register_module("ff", std::make_shared<torch::nn::Module>());
    auto net = ff->register_module("net", torch::nn::ModuleList());
    auto proj = std::make_shared<torch::nn::Module>();
    image_1 = proj->register_module("proj", Linear(c.image_dim, c.image_dim));
    net->push_back(proj);
    net->push_back(torch::nn::Identity());  // dropout
    image_2 = Linear(c.image_dim, dim);
    net->push_back(image_2);
    image_norm2 = ie->register_module("norm2", LayerNorm32(dim, 1e-5, true));
    if (c.pos_embed_seq_len)
      image_pos_embed = ie->register_parameter("pos_embed", torch::zeros({1, c.pos_embed_seq_len, c.image_dim}));
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; i++) blocks->push_back(WanBlock(c));
  proj_out = register_module("proj_out", Linear(dim, c.out_channels * p[0] * p[1] * p[2]));
  scale_shift_table = register_parameter("scale_shift_table", torch::randn({1, 2, dim}) / std::sqrt(double(dim)));
  // Angles in float64, as diffusers computes them before storing cos/sin in float32.
  const auto axes = rope_axes(c.attention_head_dim);
  const auto pos = torch::arange(c.rope_max_seq_len, torch::kDouble);
  for (int a = 0; a < 3; a++) {
    const auto inv = 1.0 / torch::pow(10000.0, torch::arange(0, axes[a], 2, torch::kDouble) / double(axes[a]));
    rope_angles_[a] = torch::outer(pos, inv);
  }
}

void WanTransformerImpl::check_image(const at::Tensor &image, int64_t B) const {
  if (!cfg.image_dim) {
    if (image.defined())
      throw std::invalid_argument("encoder_hidden_states_image was given, but this Wan model has no image path "
                                  "(its config.json has no image_dim: a text-to-video model)");
    return;
  }
  if (!image.defined())
    throw std::invalid_argument("this Wan model is image-to-video (image_dim " + std::to_string(cfg.image_dim) +
                                "): it needs encoder_hidden_states_image, the image encoder's states");
  const int64_t per = cfg.pos_embed_seq_len ? 2 : 1;  // FLF2V: first and last frame of each sample
  if (image.dim() != 3 || image.size(0) != per * B || image.size(2) != cfg.image_dim ||
      (per == 2 && 2 * image.size(1) != cfg.pos_embed_seq_len) || image.size(1) < 1)
    throw std::invalid_argument(
        "encoder_hidden_states_image has shape " + shape_of(image) + "; expected [" + std::to_string(per * B) + ", " +
        (per == 2 ? std::to_string(cfg.pos_embed_seq_len / 2) : std::string("N")) + ", " +
        std::to_string(cfg.image_dim) + "]" +
        (per == 2 ? " (FLF2V: each sample's first then last frame, pos_embed_seq_len / 2 tokens each)" : ""));
}

at::Tensor WanTransformerImpl::forward(const at::Tensor &x, const at::Tensor &timestep, const at::Tensor &text,
                                       const at::Tensor &image) {
  const auto &p = cfg.patch_size;
  if (x.dim() != 5 || x.size(1) != cfg.in_channels || x.size(2) % p[0] || x.size(3) % p[1] || x.size(4) % p[2])
    throw std::invalid_argument("hidden_states has shape " + shape_of(x) + "; this Wan model takes [B, " +
                                std::to_string(cfg.in_channels) + ", T, H, W] with T, H, W multiples of the patch " +
                                std::to_string(p[0]) + "x" + std::to_string(p[1]) + "x" + std::to_string(p[2]));
  const int64_t B = x.size(0), f = x.size(2) / p[0], h = x.size(3) / p[1], w = x.size(4) / p[2], S = f * h * w;
  if (f > cfg.rope_max_seq_len || h > cfg.rope_max_seq_len || w > cfg.rope_max_seq_len)
    throw std::invalid_argument("hidden_states " + shape_of(x) + " has more patches along an axis than the model's "
                                "rope_max_seq_len " + std::to_string(cfg.rope_max_seq_len));
  if (!((timestep.dim() == 1 && timestep.size(0) == B) || (timestep.dim() == 2 && timestep.size(0) == B && timestep.size(1) == S)))
    throw std::invalid_argument("timestep has shape " + shape_of(timestep) + "; expected [" + std::to_string(B) +
                                "] or, per token, [" + std::to_string(B) + ", " + std::to_string(S) + "]");
  if (text.dim() != 3 || text.size(0) != B || text.size(2) != cfg.text_dim)
    throw std::invalid_argument("encoder_hidden_states has shape " + shape_of(text) + "; expected [" +
                                std::to_string(B) + ", L, " + std::to_string(cfg.text_dim) + "]");
  check_image(image, B);
  // Rotary tables for this grid: [S, head_dim], axes t, h, w concatenated, each repeated per pair.
  std::vector<at::Tensor> cs, ss;
  const int64_t n[3] = {f, h, w};
  for (int a = 0; a < 3; a++) {
    auto ang = rope_angles_[a].narrow(0, 0, n[a]).repeat_interleave(2, 1);
    std::vector<int64_t> shape{1, 1, 1, ang.size(1)};
    shape[a] = n[a];
    ang = ang.view(shape).expand({f, h, w, shape[3]});
    cs.push_back(ang.cos().to(at::kFloat));
    ss.push_back(ang.sin().to(at::kFloat));
  }
  // One complex turn per pair, [S, 1, head_dim / 2] against q and k's [B, S, H, D/2] pairs.
  const auto rope = rotary_table(at::cat(cs, -1).reshape({S, -1}), at::cat(ss, -1).reshape({S, -1})).unsqueeze(1).to(x.device());

  // [B, S, dim], made contiguous once here: element-wise ops keep their input's layout, so a
  // transposed residual stream would make every LayerNorm (and its backward) copy it again.
  auto hs = patch_embedding(x).flatten(2).transpose(1, 2).contiguous();
  // Time: [B] -> [B, 1, ...]; per token [B, S] -> [B, S, ...].
  const auto t = timestep.dim() == 1 ? timestep.unsqueeze(1) : timestep;
  const auto temb = time_2(torch::silu(time_1(timestep_sinusoid(t.flatten(), cfg.freq_dim)))).unflatten(0, {B, t.size(1)});
  const auto mod = time_proj(torch::silu(temb)).unflatten(-1, {6, -1});  // [B, 1|S, 6, dim]
  auto context = text_2(gelu_tanh(text_1(text)));
  if (image.defined()) {  // the embedded image tokens go first, as diffusers concatenates them
    auto i = image;
    if (image_pos_embed.defined()) i = i.reshape({B, -1, cfg.image_dim}) + image_pos_embed;  // FLF2V: pairs of images
    i = image_norm2(image_2(at::gelu(image_1(image_norm1(i).to(i.scalar_type()))))).to(i.scalar_type());
    context = at::cat({i, context}, 1);
  }
  int index = 0;
  for (const auto &blk : *blocks) {
    auto block = blk->as<WanBlock>();
    BlockScope scope(block_hooks, index++);  // sharded weights: gathered for this block (block_hooks.h)
    block->attn1->backend = block->attn2->backend = attention_backend;
    if (checkpointing == Checkpointing::full && torch::GradMode::is_enabled()) {
      hs = checkpointed(
          [block, rope](const std::vector<at::Tensor> &in) { return block->forward(in[0], in[1], in[2], rope); },
          {hs, context, mod});
    } else if (checkpointing == Checkpointing::selective && torch::GradMode::is_enabled()) {
      // The same ops as forward's: the self-attention in between runs with autograd, so it keeps
      // q, k, v and its output (what its backward needs) and backward never recomputes it.
      const auto p = checkpointed_segment(
          [block, rope](const std::vector<at::Tensor> &in) { return block->head(in[0], in[1], rope); },
          {hs, mod});
      const auto o = attention(p[0], p[1], p[2], 0, attention_backend);
      hs = checkpointed([block](const std::vector<at::Tensor> &in) { return block->tail(in[0], in[1], in[2], in[3]); },
                        {hs, context, mod, o});
    } else {
      hs = block->forward(hs, context, mod, rope);
    }
  }
  const auto m = (scale_shift_table.to(at::kFloat).unsqueeze(0) + temb.to(at::kFloat).unsqueeze(2)).unbind(2);
  hs = (torch::layer_norm(hs.to(at::kFloat), {cfg.dim()}, {}, {}, cfg.eps) * (1 + m[1]) + m[0]).to(hs.scalar_type());
  hs = proj_out(hs);  // [B, S, C_out * pt * ph * pw]
  return hs.reshape({B, f, h, w, p[0], p[1], p[2], cfg.out_channels})
      .permute({0, 7, 1, 4, 2, 5, 3, 6})
      .reshape({B, cfg.out_channels, f * p[0], h * p[1], w * p[2]});
}

}  // namespace videotrain::models
