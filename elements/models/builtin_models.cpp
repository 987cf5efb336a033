/* The built-in models users can pick (torch::nn, no Python needed).
 *
 * builtin:tiny-unet3d  a small latent video diffusion model: a 3D conv UNet (two
 *                      levels, residual blocks conditioned by FiLM on a timestep and a
 *                      caption embedding), trained with a flow-matching loss (noise and
 *                      timesteps from torch's default generator, which the trainer seeds).
 * builtin:tiny-t2v     a small text-conditioned transformer (cross-attention to a textencoder's
 *                      embeddings), the same loss. */
#include "model_parts.h"

#include <array>
#include <cmath>

#include "cpu_conv.h"

namespace videotrain {

at::Tensor caption_bag(torch::nn::EmbeddingBag &bag, const std::vector<std::string> &captions, int64_t batch,
                       const c10::Device &device) {
  std::vector<int64_t> ids, offsets;
  for (int64_t i = 0; i < batch; i++) {
    offsets.push_back(static_cast<int64_t>(ids.size()));
    auto t = caption_token_ids(i < static_cast<int64_t>(captions.size()) ? captions[i] : std::string(),
                               kCaptionBuckets);
    ids.insert(ids.end(), t.begin(), t.end());
  }
  auto opt = torch::TensorOptions().dtype(torch::kLong);
  auto idt = torch::tensor(ids, opt).to(device);
  auto off = torch::tensor(offsets, opt).to(device);
  return bag->forward(idt, off);
}

at::Tensor conv(const torch::nn::Conv3d &m, const at::Tensor &x) {
  const auto k = m->weight.sizes();
  const std::array<int64_t, 3> padding{k[2] / 2, k[3] / 2, k[4] / 2};
  return conv3d_fast(x, m->weight, m->bias, m->options.stride(), padding);
}

namespace {

// A norm layer in float32: CPU autocast (precision=bf16 on CPU) hands it bfloat16 while its
// affine weights stay float, which LibTorch's CPU group/layer norm kernels refuse ("expected
// scalar type BFloat16 but found Float"). CUDA autocast runs norms in float32 too.
template <typename Norm>
at::Tensor norm32(Norm &n, const at::Tensor &x) {
  return n(x.scalar_type() == torch::kFloat ? x : x.to(torch::kFloat));
}

// Sinusoidal embedding of t in [0, 1].
at::Tensor timestep_embedding(const at::Tensor &t, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = torch::exp(-std::log(10000.0) * torch::arange(half, t.options()) / half);
  auto args = (t * 1000.0).unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, 1);
}

// Rectified flow: x_t = (1 - t) x0 + t n, predict v = n - x0; t logit-normal. Noise and t come
// from torch's default generator, which the trainer seeds per step.
template <typename F>
at::Tensor flow_loss(const at::Tensor &x0, F &&predict) {
  auto noise = torch::randn_like(x0);
  auto t = torch::sigmoid(torch::randn({x0.size(0)}, x0.options()));
  auto tb = t.view({-1, 1, 1, 1, 1});
  auto pred = predict((1 - tb) * x0 + tb * noise, t);
  return torch::mse_loss(pred.to(torch::kFloat), (noise - x0).to(torch::kFloat));
}

// The same loss per sample, noise and t from a CPU generator per seed (same numbers on any device).
template <typename F>
at::Tensor flow_losses_seeded(const at::Tensor &x0, const std::vector<int64_t> &seeds, F &&predict) {
  std::vector<at::Tensor> ns, ts;
  const auto cpu = torch::TensorOptions().dtype(torch::kFloat);
  for (int64_t i = 0; i < x0.size(0); i++) {
    auto g = at::detail::createCPUGenerator(static_cast<uint64_t>(seeds.at(i)));
    ns.push_back(at::randn(x0[i].sizes(), g, cpu));
    ts.push_back(at::randn({1}, g, cpu));
  }
  auto noise = torch::stack(ns).to(x0.device(), x0.scalar_type());
  auto t = torch::sigmoid(torch::cat(ts)).to(x0.device(), x0.scalar_type());
  auto tb = t.view({-1, 1, 1, 1, 1});
  auto pred = predict((1 - tb) * x0 + tb * noise, t);
  return (pred.to(torch::kFloat) - (noise - x0).to(torch::kFloat)).pow(2).mean({1, 2, 3, 4});
}

struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t ch, int64_t cond_dim)
      : n1(torch::nn::GroupNormOptions(std::min<int64_t>(8, ch), ch)),
        n2(torch::nn::GroupNormOptions(std::min<int64_t>(8, ch), ch)),
        c1(torch::nn::Conv3dOptions(ch, ch, 3).padding(1)),
        c2(torch::nn::Conv3dOptions(ch, ch, 3).padding(1)),
        film(cond_dim, 2 * ch) {
    register_module("n1", n1);
    register_module("n2", n2);
    register_module("c1", c1);
    register_module("c2", c2);
    register_module("film", film);
  }
  at::Tensor forward(const at::Tensor &x, const at::Tensor &cond) {
    auto h = conv(c1, torch::silu(norm32(n1, x)));
    auto ss = film(torch::silu(cond)).view({x.size(0), -1, 1, 1, 1}).chunk(2, 1);
    h = norm32(n2, h) * (1 + ss[0]) + ss[1];
    return x + conv(c2, torch::silu(h));
  }
  torch::nn::GroupNorm n1, n2;
  torch::nn::Conv3d c1, c2;
  torch::nn::Linear film;
};
TORCH_MODULE(ResBlock);

struct TinyUNet3DImpl : torch::nn::Module {
  static constexpr int64_t kCh = 32, kCond = 128, kTime = 64;
  static constexpr bool kTakesText = false;
  explicit TinyUNet3DImpl(const ModelDims &dims) : TinyUNet3DImpl(dims.latent_channels) {}
  explicit TinyUNet3DImpl(int64_t c)
      : in_conv(torch::nn::Conv3dOptions(c, kCh, 3).padding(1)),
        r1(kCh, kCond),
        down(torch::nn::Conv3dOptions(kCh, 2 * kCh, {1, 3, 3}).stride({1, 2, 2}).padding({0, 1, 1})),
        r2(2 * kCh, kCond),
        mid(2 * kCh, kCond),
        up(torch::nn::Conv3dOptions(2 * kCh, kCh, 3).padding(1)),
        r3(kCh, kCond),
        out_norm(torch::nn::GroupNormOptions(8, kCh)),
        out_conv(torch::nn::Conv3dOptions(kCh, c, 3).padding(1)),
        t1(kTime, kCond),
        t2(kCond, kCond),
        caption(torch::nn::EmbeddingBagOptions(kCaptionBuckets, kCond).mode(torch::kMean)) {
    register_module("in_conv", in_conv);
    register_module("r1", r1);
    register_module("down", down);
    register_module("r2", r2);
    register_module("mid", mid);
    register_module("up", up);
    register_module("r3", r3);
    register_module("out_norm", out_norm);
    register_module("out_conv", out_conv);
    register_module("t1", t1);
    register_module("t2", t2);
    register_module("caption", caption);
    torch::NoGradGuard ng;
    caption->weight.normal_(0.0, 0.02);
  }
  at::Tensor forward(const at::Tensor &x, const at::Tensor &t, const std::vector<std::string> &captions) {
    auto cond = t2(torch::silu(t1(timestep_embedding(t, kTime)))) + caption_bag(caption, captions, x.size(0), x.device());
    auto h0 = r1(conv(in_conv, x), cond);
    auto h = mid(r2(conv(down, h0), cond), cond);
    h = torch::nn::functional::interpolate(
        h, torch::nn::functional::InterpolateFuncOptions()
                .size(std::vector<int64_t>{h0.size(2), h0.size(3), h0.size(4)})
                .mode(torch::kNearest));
    h = r3(conv(up, h) + h0, cond);
    return conv(out_conv, torch::silu(norm32(out_norm, h)));
  }
  at::Tensor training_step(const ModelInputs &in) {
    return flow_loss(in.latents, [&](const at::Tensor &xt, const at::Tensor &t) { return forward(xt, t, in.captions); });
  }
  at::Tensor validation_step(const ModelInputs &in, const std::vector<int64_t> &seeds) {
    return flow_losses_seeded(in.latents, seeds,
                              [&](const at::Tensor &xt, const at::Tensor &t) { return forward(xt, t, in.captions); });
  }
  torch::nn::Conv3d in_conv;
  ResBlock r1;
  torch::nn::Conv3d down;
  ResBlock r2, mid;
  torch::nn::Conv3d up;
  ResBlock r3;
  torch::nn::GroupNorm out_norm;
  torch::nn::Conv3d out_conv;
  torch::nn::Linear t1, t2;
  torch::nn::EmbeddingBag caption;
};
TORCH_MODULE(TinyUNet3D);

/* builtin:tiny-t2v: a small text-conditioned latent video transformer. Latents are cut into
 * 1x2x2 patches (odd sizes padded), each block runs self-attention over the patches,
 * cross-attention to the text embeddings (masked by text_mask) and an MLP, modulated by the
 * timestep; trained with the same rectified-flow loss as tiny-unet3d. */

// Multi-head attention of q [B, Lq, D] over k, v [B, Lk, D]; `keep` [B, Lk] (bool) masks keys.
at::Tensor attend(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t heads,
                  const at::Tensor &keep = at::Tensor()) {
  const int64_t B = q.size(0), D = q.size(2), dh = D / heads;
  auto split = [&](const at::Tensor &x) { return x.view({B, x.size(1), heads, dh}).transpose(1, 2); };
  auto scores = torch::matmul(split(q), split(k).transpose(-2, -1)) / std::sqrt(static_cast<double>(dh));
  // A finite fill: a sample whose keys are all masked attends evenly instead of giving NaN.
  if (keep.defined()) scores = scores.masked_fill(keep.logical_not().view({B, 1, 1, -1}), -1e4);
  auto out = torch::matmul(torch::softmax(scores, -1), split(v));
  return out.transpose(1, 2).reshape({B, q.size(1), D});
}

struct T2VBlockImpl : torch::nn::Module {
  T2VBlockImpl(int64_t dim, int64_t heads)
      : heads(heads),
        n1(torch::nn::LayerNormOptions({dim}).elementwise_affine(false)),
        n2(torch::nn::LayerNormOptions({dim})),
        n3(torch::nn::LayerNormOptions({dim}).elementwise_affine(false)),
        qkv(dim, 3 * dim),
        proj(dim, dim),
        q(dim, dim),
        kv(dim, 2 * dim),
        cross_out(dim, dim),
        fc1(dim, 4 * dim),
        fc2(4 * dim, dim),
        mod(dim, 4 * dim) {
    register_module("n1", n1);
    register_module("n2", n2);
    register_module("n3", n3);
    register_module("qkv", qkv);
    register_module("proj", proj);
    register_module("q", q);
    register_module("kv", kv);
    register_module("cross_out", cross_out);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("mod", mod);
  }
  // x [B, N, D] patches, text [B, L, D], keep [B, L], cond [B, D] (timestep).
  at::Tensor forward(at::Tensor x, const at::Tensor &text, const at::Tensor &keep, const at::Tensor &cond) {
    auto m = mod(torch::silu(cond)).unsqueeze(1).chunk(4, -1);  // scale/shift of self-attention and MLP
    auto h = norm32(n1, x) * (1 + m[0]) + m[1];
    auto s = qkv(h).chunk(3, -1);
    x = x + proj(attend(s[0], s[1], s[2], heads));
    auto c = kv(text).chunk(2, -1);
    x = x + cross_out(attend(q(norm32(n2, x)), c[0], c[1], heads, keep));
    h = norm32(n3, x) * (1 + m[2]) + m[3];
    return x + fc2(torch::gelu(fc1(h)));
  }
  int64_t heads;
  torch::nn::LayerNorm n1, n2, n3;
  torch::nn::Linear qkv, proj, q, kv, cross_out, fc1, fc2, mod;
};
TORCH_MODULE(T2VBlock);

struct TinyT2VImpl : torch::nn::Module {
  static constexpr int64_t kDim = 64, kHeads = 4, kTime = 64, kBlocks = 2;
  static constexpr bool kTakesText = true;
  explicit TinyT2VImpl(const ModelDims &dims)
      : patch_in(torch::nn::Conv3dOptions(dims.latent_channels, kDim, {1, 2, 2}).stride({1, 2, 2})),
        patch_out(torch::nn::ConvTranspose3dOptions(kDim, dims.latent_channels, {1, 2, 2}).stride({1, 2, 2})),
        text_in(dims.text_dim, kDim),
        t1(kTime, kDim),
        t2(kDim, kDim),
        norm_out(torch::nn::LayerNormOptions({kDim})) {
    register_module("patch_in", patch_in);
    register_module("patch_out", patch_out);
    register_module("text_in", text_in);
    register_module("t1", t1);
    register_module("t2", t2);
    register_module("norm_out", norm_out);
    for (int64_t i = 0; i < kBlocks; i++) blocks.push_back(register_module("block" + std::to_string(i), T2VBlock(kDim, kHeads)));
  }
  at::Tensor forward(const at::Tensor &x, const at::Tensor &t, const at::Tensor &text_embeds, const at::Tensor &text_mask) {
    const int64_t H = x.size(3), W = x.size(4);
    auto xp = torch::constant_pad_nd(x, {0, W % 2, 0, H % 2});
    auto p = patch_in(xp);  // [B, D, t, H', W']
    const auto grid = p.sizes().vec();
    auto tokens = p.flatten(2).transpose(1, 2);  // [B, N, D]
    auto cond = t2(torch::silu(t1(timestep_embedding(t, kTime))));
    tokens = tokens + cond.unsqueeze(1);
    auto text = text_in(text_embeds.to(x.scalar_type()));
    auto keep = text_mask.to(x.device()) > 0;
    for (auto &b : blocks) tokens = b->forward(tokens, text, keep, cond);
    auto out = norm32(norm_out, tokens).transpose(1, 2).reshape(grid);
    return patch_out(out).narrow(3, 0, H).narrow(4, 0, W);
  }
  at::Tensor training_step(const ModelInputs &in) {
    return flow_loss(in.latents, [&](const at::Tensor &xt, const at::Tensor &t) {
      return forward(xt, t, in.text_embeds, in.text_mask);
    });
  }
  at::Tensor validation_step(const ModelInputs &in, const std::vector<int64_t> &seeds) {
    return flow_losses_seeded(in.latents, seeds, [&](const at::Tensor &xt, const at::Tensor &t) {
      return forward(xt, t, in.text_embeds, in.text_mask);
    });
  }
  torch::nn::Conv3d patch_in;
  torch::nn::ConvTranspose3d patch_out;
  torch::nn::Linear text_in, t1, t2;
  torch::nn::LayerNorm norm_out;
  std::vector<T2VBlock> blocks;
};
TORCH_MODULE(TinyT2V);

}  // namespace

std::unique_ptr<TrainModel> make_public_builtin(const std::string &name, const ModelDims &dims,
                                                const c10::Device &device) {
  if (name == "tiny-unet3d") return std::make_unique<BuiltinModel<TinyUNet3D>>(name, dims, device);
  if (name == "tiny-t2v") {
    if (dims.text_dim <= 0)
      throw std::runtime_error("model " + std::string(kBuiltinPrefix) + name +
                               " needs text embeddings: put a textencoder after vaeencoder");
    return std::make_unique<BuiltinModel<TinyT2V>>(name, dims, device);
  }
  return nullptr;
}

}  // namespace videotrain
