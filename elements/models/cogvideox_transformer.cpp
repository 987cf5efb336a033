/* CogVideoX transformer: see cogvideox_transformer.h. The computation follows diffusers'
 * cogvideox_transformer_3d.py, embeddings.py (CogVideoXPatchEmbed, get_3d_sincos_pos_embed,
 * get_3d_rotary_pos_embed), normalization.py (CogVideoXLayerNormZero, AdaLayerNorm),
 * CogVideoXAttnProcessor2_0 and pipeline_cogvideox.py (rotary grids), commit 58eb52c; checked against
 * its outputs and gradients in tests/models/test_cogvideox_transformer.cpp. */
#include "cogvideox_transformer.h"

#include <cfenv>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace videotrain::models {

namespace {

std::string shape_of(const at::Tensor &t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}


// nn.LayerNorm in float32 whatever the input's dtype (CPU autocast in LibTorch 1.13 would hand it bf16
// input with float32 weights), as autocast runs layer_norm on CUDA.
at::Tensor layer_norm32(const torch::nn::LayerNorm &m, const at::Tensor &x) {
  return at::layer_norm(x.to(at::kFloat), m->options.normalized_shape(), m->weight.to(at::kFloat),
                        m->bias.to(at::kFloat), m->options.eps());
}

// Python's round() (ties to even), as get_resize_crop_region_for_grid uses it.
int64_t round_even(double v) {
  const int mode = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const double r = std::nearbyint(v);
  std::fesetround(mode);
  return static_cast<int64_t>(r);
}

// get_1d_rotary_pos_embed(dim, pos, use_real=True) in float32: cos and sin [n, dim], each angle twice.
std::pair<at::Tensor, at::Tensor> rotary_1d(int64_t dim, const at::Tensor &pos) {
  const auto f = at::TensorOptions().dtype(at::kFloat);
  const auto freqs = 1.0 / at::pow(10000.0, at::arange(0, dim, 2, f).slice(0, 0, dim / 2) / static_cast<double>(dim));
  const auto a = at::outer(pos, freqs);
  return {a.cos().repeat_interleave(2, 1), a.sin().repeat_interleave(2, 1)};
}

// get_1d_sincos_pos_embed_from_grid: [sin, cos] of pos * 10000^(-i / (dim/2)) in float64.
at::Tensor sincos_1d(int64_t dim, const at::Tensor &pos) {
  auto omega = at::arange(dim / 2, at::TensorOptions().dtype(at::kDouble)) / (dim / 2.0);
  omega = 1.0 / at::pow(10000.0, omega);
  const auto a = at::outer(pos.to(at::kDouble).reshape(-1), omega);
  return at::cat({a.sin(), a.cos()}, 1);
}

// Timesteps(dim, flip_sin_to_cos, freq_shift) as get_timestep_embedding computes it.
at::Tensor timestep_embedding(const at::Tensor &t, int64_t dim, bool flip, int64_t shift) {
  const int64_t half = dim / 2;
  auto exponent = -std::log(10000.0) * at::arange(0, half, t.options().dtype(at::kFloat));
  exponent = exponent / static_cast<double>(half - shift);
  const auto a = t.to(at::kFloat).unsqueeze(1) * exponent.exp().unsqueeze(0);
  auto e = flip ? at::cat({a.cos(), a.sin()}, -1) : at::cat({a.sin(), a.cos()}, -1);
  if (dim % 2) e = at::constant_pad_nd(e, {0, 1});
  return e;
}

}  // namespace

/* ---------------- block ---------------- */

CogVideoXNormZeroImpl::CogVideoXNormZeroImpl(int64_t time_dim, int64_t dim, double eps) {
  linear = register_module("linear", Linear(time_dim, 6 * dim));
  norm = register_module("norm", LayerNorm32(dim, eps, true));
}

at::Tensor CogVideoXNormZeroImpl::modulation(const at::Tensor &temb) { return linear(torch::silu(temb)); }

at::Tensor CogVideoXNormZeroImpl::modulate(const at::Tensor &x, const at::Tensor &mod, int64_t text_len, at::Tensor *gate) {
  // shift, scale, gate (video), enc_shift, enc_scale, enc_gate (text): each [B, 1, dim].
  const auto m = mod.unsqueeze(1).chunk(6, -1);
  const auto n = norm(x).to(x.scalar_type());
  const int64_t S = x.size(1) - text_len;
  const auto text = shift_scale(n.narrow(1, 0, text_len), m[3], m[4]);
  const auto video = shift_scale(n.narrow(1, text_len, S), m[0], m[1]);
  if (gate) *gate = at::cat({m[5].expand({-1, text_len, -1}), m[2].expand({-1, S, -1})}, 1);
  return at::cat({text, video}, 1);
}

at::Tensor CogVideoXNormZeroImpl::forward(const at::Tensor &x, const at::Tensor &temb, int64_t text_len,
                                          at::Tensor *gate) {
  return modulate(x, modulation(temb), text_len, gate);
}

CogVideoXBlockImpl::CogVideoXBlockImpl(const CogVideoXConfig &c) : heads(c.num_attention_heads) {
  const int64_t dim = c.dim();
  norm1 = register_module("norm1", CogVideoXNormZero(c.time_embed_dim, dim, c.norm_eps));
  auto attn = register_module("attn1", std::make_shared<torch::nn::Module>());
  to_q = attn->register_module("to_q", Linear(dim, dim, c.attention_bias));
  to_k = attn->register_module("to_k", Linear(dim, dim, c.attention_bias));
  to_v = attn->register_module("to_v", Linear(dim, dim, c.attention_bias));
  auto out = attn->register_module("to_out", torch::nn::ModuleList());
  to_out = Linear(dim, dim);
  out->push_back(to_out);
  out->push_back(torch::nn::Identity());  // diffusers' dropout: no parameters
  const auto qk = torch::nn::LayerNormOptions({c.attention_head_dim}).eps(1e-6);
  norm_q = attn->register_module("norm_q", torch::nn::LayerNorm(qk));
  norm_k = attn->register_module("norm_k", torch::nn::LayerNorm(qk));
  norm2 = register_module("norm2", CogVideoXNormZero(c.time_embed_dim, dim, c.norm_eps));
  auto ff = register_module("ff", std::make_shared<torch::nn::Module>());
  auto net = ff->register_module("net", torch::nn::ModuleList());
  auto gelu = std::make_shared<torch::nn::Module>();  // net.0: GELU(approximate="tanh") with .proj
  ff_in = gelu->register_module("proj", Linear(dim, 4 * dim));
  net->push_back(gelu);
  net->push_back(torch::nn::Identity());
  ff_out = Linear(4 * dim, dim);
  net->push_back(ff_out);
}

std::vector<at::Tensor> CogVideoXBlockImpl::head(const at::Tensor &x, const at::Tensor &temb, int64_t text_len,
                                                  const at::Tensor &rope) {
  // Both norms' modulations here, so that temb's gradient comes from one segment (summed in the
  // same order as without checkpointing); tail takes them as inputs ([B, 6 dim] each).
  const auto mod1 = norm1->modulation(temb), mod2 = norm2->modulation(temb);
  auto n = norm1->modulate(x, mod1, text_len, nullptr);  // the gate is tail's
  auto heads_of = [&](const at::Tensor &t) { return t.unflatten(2, {heads, -1}); };  // [B, N, H, D]
  const auto v = heads_of(to_v(n)).transpose(1, 2);  // [B, H, N, D]
  // q and k normalised and turned in float32 on contiguous [B, N, H, D] rows (the whole sequence in
  // one product: the text rows' turns are 1), then cast once to v's dtype (bf16 under autocast) and
  // viewed as [B, H, N, D]: no copies before attention.
  auto q = layer_norm32(norm_q, heads_of(to_q(n)));
  auto k = layer_norm32(norm_k, heads_of(to_k(n)));
  if (rope.defined()) {
    q = rotate_pairs(q, rope);
    k = rotate_pairs(k, rope);
  }
  return {q.to(v.scalar_type()).transpose(1, 2), k.to(v.scalar_type()).transpose(1, 2), v, mod1, mod2};
}

at::Tensor CogVideoXBlockImpl::tail(const at::Tensor &x, const at::Tensor &mod1, const at::Tensor &mod2,
                                    int64_t text_len, const at::Tensor &o) {
  // norm1's gate: [B, L + S, dim] from mod1's chunks (views), as norm1->modulate makes it.
  const auto m = mod1.unsqueeze(1).chunk(6, -1);
  const int64_t S = x.size(1) - text_len;
  auto gate = at::cat({m[5].expand({-1, text_len, -1}), m[2].expand({-1, S, -1})}, 1);
  auto h = at::addcmul(x, gate, to_out(o.transpose(1, 2).flatten(2)).to(x.scalar_type()));  // gated residuals
  const auto n = norm2->modulate(h, mod2, text_len, &gate);
  return at::addcmul(h, gate, ff_out(gelu_tanh(ff_in(n))).to(h.scalar_type()));
}

at::Tensor CogVideoXBlockImpl::forward(const at::Tensor &x, const at::Tensor &temb, int64_t text_len,
                                       const at::Tensor &rope) {
  const auto p = head(x, temb, text_len, rope);
  return tail(x, p[3], p[4], text_len, attention(p[0], p[1], p[2], 0, backend));
}

/* ---------------- model ---------------- */

CogVideoXTransformerImpl::CogVideoXTransformerImpl(const CogVideoXConfig &c) : cfg(c) {
  const int64_t dim = c.dim(), p = c.patch_size;
  auto pe = register_module("patch_embed", std::make_shared<torch::nn::Module>());
  if (c.patch_size_t == 0)
    patch_conv = pe->register_module(
        "proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(c.in_channels, dim, p).stride(p).bias(c.patch_bias)));
  else  // 1.5: a Linear over p_t x p x p x C inputs (diffusers gives it a bias whatever patch_bias says)
    patch_linear = pe->register_module("proj", Linear(c.in_channels * p * p * c.patch_size_t, dim));
  text_proj = pe->register_module("text_proj", Linear(c.text_embed_dim, dim));
  if (c.use_learned_positional_embeddings) {
    // diffusers' initial value (what `videotrain-model init` writes): no text rows, the sincos table.
    const int64_t f = (c.sample_frames - 1) / c.temporal_compression_ratio + 1;
    pos_embedding = pe->register_buffer(
        "pos_embedding", at::constant_pad_nd(sincos_table(f, c.sample_height, c.sample_width), {0, 0, c.max_text_seq_length, 0})
                             .unsqueeze(0));
  }
  auto te = register_module("time_embedding", std::make_shared<torch::nn::Module>());
  time_1 = te->register_module("linear_1", Linear(dim, c.time_embed_dim));
  time_2 = te->register_module("linear_2", Linear(c.time_embed_dim, c.time_embed_dim));
  if (c.ofs_embed_dim) {
    auto oe = register_module("ofs_embedding", std::make_shared<torch::nn::Module>());
    ofs_1 = oe->register_module("linear_1", Linear(c.ofs_embed_dim, c.ofs_embed_dim));
    ofs_2 = oe->register_module("linear_2", Linear(c.ofs_embed_dim, c.ofs_embed_dim));
  }
  blocks = register_module("transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; i++) blocks->push_back(CogVideoXBlock(c));
  norm_final = register_module("norm_final", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(c.norm_eps)));
  auto no = register_module("norm_out", std::make_shared<torch::nn::Module>());
  out_mod = no->register_module("linear", Linear(c.time_embed_dim, 2 * dim));
  out_norm = no->register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(c.norm_eps)));
  proj_out = register_module("proj_out", Linear(dim, p * p * (c.patch_size_t ? c.patch_size_t : 1) * c.out_channels));
}

std::pair<at::Tensor, at::Tensor> CogVideoXTransformerImpl::rotary_tables(int64_t frames, int64_t height,
                                                                          int64_t width) const {
  const int64_t p = cfg.patch_size, gh = height / p, gw = width / p, hd = cfg.attention_head_dim;
  const auto f = at::TensorOptions().dtype(at::kFloat);
  at::Tensor grid_t, grid_h, grid_w;
  int64_t T = frames;
  if (cfg.patch_size_t == 0) {
    // CogVideoX 1.0: the grid resized into the base (sample size) grid and centred, linspace positions.
    const int64_t bw = cfg.sample_width / p, bh = cfg.sample_height / p;
    int64_t rh, rw;
    if (static_cast<double>(gh) / gw > static_cast<double>(bh) / bw) {
      rh = bh;
      rw = round_even(static_cast<double>(bh) / gh * gw);
    } else {
      rw = bw;
      rh = round_even(static_cast<double>(bw) / gw * gh);
    }
    const int64_t top = round_even((bh - rh) / 2.0), left = round_even((bw - rw) / 2.0);
    grid_h = at::linspace(static_cast<double>(top), static_cast<double>((top + rh) * (gh - 1)) / gh, gh, f);
    grid_w = at::linspace(static_cast<double>(left), static_cast<double>((left + rw) * (gw - 1)) / gw, gw, f);
    grid_t = at::linspace(0.0, static_cast<double>(T * (T - 1)) / T, T, f);
  } else {
    // CogVideoX 1.5: "slice" grids, positions 0, 1, ... along each axis.
    T = (frames + cfg.patch_size_t - 1) / cfg.patch_size_t;
    grid_t = at::arange(T, f);
    grid_h = at::arange(gh, f);
    grid_w = at::arange(gw, f);
  }
  const auto t = rotary_1d(hd / 4, grid_t), h = rotary_1d(hd / 8 * 3, grid_h), w = rotary_1d(hd / 8 * 3, grid_w);
  auto combine = [&](const at::Tensor &a, const at::Tensor &b, const at::Tensor &c) {
    return at::cat({a.view({T, 1, 1, -1}).expand({T, gh, gw, -1}), b.view({1, gh, 1, -1}).expand({T, gh, gw, -1}),
                    c.view({1, 1, gw, -1}).expand({T, gh, gw, -1})},
                   -1)
        .reshape({T * gh * gw, -1});
  };
  return {combine(t.first, h.first, w.first), combine(t.second, h.second, w.second)};
}

at::Tensor CogVideoXTransformerImpl::sincos_table(int64_t frames, int64_t height, int64_t width) const {
  const int64_t dim = cfg.dim(), gh = height / cfg.patch_size, gw = width / cfg.patch_size;
  const auto f = at::TensorOptions().dtype(at::kFloat);
  // get_3d_sincos_pos_embed: spatial 3/4 (first half from the w coordinate, then h), temporal 1/4;
  // grids in float32, the table in float64.
  const auto gy = (at::arange(gh, f) / cfg.spatial_interpolation_scale).view({gh, 1}).expand({gh, gw}).reshape(-1);
  const auto gx = (at::arange(gw, f) / cfg.spatial_interpolation_scale).view({1, gw}).expand({gh, gw}).reshape(-1);
  const int64_t ds = 3 * dim / 4, dt = dim / 4;
  const auto spatial = at::cat({sincos_1d(ds / 2, gx), sincos_1d(ds / 2, gy)}, 1);  // [h w, ds]
  const auto temporal = sincos_1d(dt, at::arange(frames, f) / cfg.temporal_interpolation_scale);  // [F, dt]
  return at::cat({temporal.view({frames, 1, dt}).expand({frames, gh * gw, dt}),
                  spatial.view({1, gh * gw, ds}).expand({frames, gh * gw, ds})},
                 -1)
      .reshape({frames * gh * gw, dim})
      .to(at::kFloat);
}

std::vector<at::Tensor> CogVideoXTransformerImpl::positions(int64_t frames, int64_t height, int64_t width,
                                                            const c10::Device &device) {
  std::lock_guard<std::mutex> lock(positions_mutex_);
  const auto key = std::make_tuple(frames, height, width, device.str());
  auto it = positions_.find(key);
  if (it != positions_.end()) return it->second;
  std::vector<at::Tensor> v;
  if (cfg.use_rotary_positional_embeddings) {
    const auto cs = rotary_tables(frames, height, width);
    v = {cs.first.to(device), cs.second.to(device)};
    // Learned positions at another length than sample_frames: diffusers adds the sincos table instead.
    if (cfg.use_learned_positional_embeddings &&
        (frames - 1) * cfg.temporal_compression_ratio + 1 != cfg.sample_frames)
      v.push_back(sincos_table(frames, height, width).to(device));
  } else {
    v = {sincos_table(frames, height, width).to(device)};
  }
  if (positions_.size() >= 16) positions_.clear();  // a few bucket shapes in practice
  positions_[key] = v;
  return v;
}

at::Tensor CogVideoXTransformerImpl::forward(const at::Tensor &x, const at::Tensor &timestep, const at::Tensor &text,
                                             const at::Tensor &ofs_in) {
  const int64_t p = cfg.patch_size, pt = cfg.patch_size_t ? cfg.patch_size_t : 1;
  if (x.dim() != 5 || x.size(2) != cfg.in_channels || x.size(1) % pt || x.size(3) % p || x.size(4) % p)
    throw std::invalid_argument(
        "hidden_states has shape " + shape_of(x) + "; this CogVideoX model takes [B, F, " +
        std::to_string(cfg.in_channels) + ", H, W] (frames before channels) with H, W multiples of " +
        std::to_string(p) + (pt > 1 ? " and F a multiple of patch_size_t " + std::to_string(pt) : std::string()));
  const int64_t B = x.size(0), F = x.size(1), C = x.size(2), H = x.size(3), W = x.size(4);
  const int64_t h = H / p, w = W / p, S = (F / pt) * h * w, dim = cfg.dim();
  if (timestep.dim() != 1 || timestep.size(0) != B)
    throw std::invalid_argument("timestep has shape " + shape_of(timestep) + "; expected [" + std::to_string(B) + "]");
  // The sincos and learned tables start with max_text_seq_length text rows.
  const bool any_text_length = cfg.use_rotary_positional_embeddings && !cfg.use_learned_positional_embeddings;
  if (text.dim() != 3 || text.size(0) != B || text.size(2) != cfg.text_embed_dim ||
      (!any_text_length && text.size(1) != cfg.max_text_seq_length))
    throw std::invalid_argument(
        "encoder_hidden_states has shape " + shape_of(text) + "; expected [" + std::to_string(B) + ", " +
        (any_text_length ? std::string("L") : std::to_string(cfg.max_text_seq_length)) + ", " +
        std::to_string(cfg.text_embed_dim) + "]" +
        (any_text_length ? "" : " (this layout's position table starts with max_text_seq_length "
                                "text rows: the text encoder's max-length)"));
  if (cfg.use_learned_positional_embeddings && (H != cfg.sample_height || W != cfg.sample_width))
    throw std::invalid_argument("hidden_states has shape " + shape_of(x) + "; this CogVideoX (learned positional "
                                "embeddings, 5b-I2V) takes only its sample size, latents of " +
                                std::to_string(cfg.sample_height) + " x " + std::to_string(cfg.sample_width) +
                                " (as diffusers, which refuses other sizes)");
  if (!cfg.ofs_embed_dim && ofs_in.defined())
    throw std::invalid_argument("ofs was given, but this CogVideoX has no ofs embedding (ofs_embed_dim is null)");
  if (ofs_in.defined() && (ofs_in.dim() != 1 || (ofs_in.size(0) != 1 && ofs_in.size(0) != B)))
    throw std::invalid_argument("ofs has shape " + shape_of(ofs_in) + "; expected [1] or [" + std::to_string(B) + "]");
  const auto pos = positions(F, H, W, x.device());

  auto temb = time_2(torch::silu(time_1(
      timestep_embedding(timestep, dim, cfg.flip_sin_to_cos, cfg.freq_shift).to(time_1->dtype()))));
  if (cfg.ofs_embed_dim) {  // 1.5-I2V: the ofs embedding (same form as the time one) added to it
    const auto ofs = ofs_in.defined() ? ofs_in.to(x.device()) : at::full({1}, 2.0, x.options().dtype(at::kFloat));
    temb = temb + ofs_2(torch::silu(ofs_1(
                      timestep_embedding(ofs, cfg.ofs_embed_dim, cfg.flip_sin_to_cos, cfg.freq_shift).to(ofs_1->dtype()))));
  }
  at::Tensor video;
  if (patch_conv) {
    video = patch_conv(x.reshape({B * F, C, H, W}).to(patch_conv->weight.scalar_type()));  // [B F, dim, h, w]
    video = video.view({B, F, dim, h * w}).transpose(2, 3).reshape({B, S, dim});
  } else {
    video = x.permute({0, 1, 3, 4, 2})
                .reshape({B, F / pt, pt, h, p, w, p, C})
                .permute({0, 1, 3, 5, 7, 2, 4, 6})
                .reshape({B, S, C * pt * p * p});
    video = patch_linear(video);
  }
  // The residual stream in float32 (autocast runs the projections in bf16).
  video = video.to(at::kFloat);
  if (!cfg.use_rotary_positional_embeddings) video = video + pos[0];
  const int64_t L = text.size(1);
  auto hs = at::cat({text_proj(text).to(at::kFloat), video}, 1);  // text rows' positions are zero
  if (cfg.use_learned_positional_embeddings)  // the stored table at the sample length, else diffusers' sincos
    hs = hs + (pos.size() < 3 ? pos_embedding.to(at::kFloat)
                              : at::constant_pad_nd(pos[2], {0, 0, L, 0}).unsqueeze(0));
  at::Tensor rope;  // [L + S, 1, head_dim / 2]: the text rows unturned (1), as diffusers rotates the video rows only
  if (cfg.use_rotary_positional_embeddings) {
    const auto video_turns = rotary_table(pos[0], pos[1]);
    rope = at::cat({at::ones({L, video_turns.size(1)}, video_turns.options()), video_turns}).unsqueeze(1);
  }
  int index = 0;
  for (const auto &blk : *blocks) {
    auto block = blk->as<CogVideoXBlock>();
    BlockScope scope(block_hooks, index++);  // sharded weights: gathered for this block (block_hooks.h)
    block->backend = attention_backend;
    if (checkpointing == Checkpointing::full && torch::GradMode::is_enabled()) {
      hs = checkpointed(
          [block, L, rope](const std::vector<at::Tensor> &in) { return block->forward(in[0], in[1], L, rope); },
          {hs, temb});
    } else if (checkpointing == Checkpointing::selective && torch::GradMode::is_enabled()) {
      // forward's ops, with attention run with autograd between two recomputed segments: it keeps
      // q, k, v and its output, and backward never runs it forward again.
      const auto p = checkpointed_segment(
          [block, L, rope](const std::vector<at::Tensor> &in) { return block->head(in[0], in[1], L, rope); },
          {hs, temb});
      const auto o = attention(p[0], p[1], p[2], 0, attention_backend);
      hs = checkpointed([block, L](const std::vector<at::Tensor> &in) { return block->tail(in[0], in[1], in[2], L, in[3]); },
                        {hs, p[3], p[4], o});
    } else
      hs = block->forward(hs, temb, L, rope);
  }
  auto out = layer_norm32(norm_final, hs.narrow(1, L, S));
  const auto m = out_mod(torch::silu(temb)).unsqueeze(1).chunk(2, -1);  // shift, scale
  out = proj_out(layer_norm32(out_norm, out) * (1 + m[1]) + m[0]);
  const int64_t Co = cfg.out_channels;
  if (!cfg.patch_size_t)
    return out.reshape({B, F, h, w, Co, p, p}).permute({0, 1, 4, 2, 5, 3, 6}).reshape({B, F, Co, H, W});
  return out.reshape({B, F / pt, h, w, Co, pt, p, p})
      .permute({0, 1, 5, 4, 2, 6, 3, 7})
      .reshape({B, F, Co, H, W});
}

}  // namespace videotrain::models
