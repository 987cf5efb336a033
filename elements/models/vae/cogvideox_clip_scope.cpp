/* CogVideoXEncoder::forward_clip_scope: whole-clip GroupNorm statistics at chunk-bounded
 * memory. A resnet is normalise(x) -> conv1 -> normalise -> conv2 (+ shortcut of x); each
 * normalisation needs statistics of its whole input before any of it can go on, so the clip
 * flows through the encoder one normalisation at a time:
 *   pass 0: conv_in over the frames           -> level x0, statistics of x0
 *   per resnet, pass a: norm1(x), conv1       -> h, statistics of h
 *               pass b: norm2(h), conv2 + x   -> next x (downsampled at a block's end), its statistics
 *   last pass:  norm_out(x), conv_out, quant  -> moments
 * Every convolution runs chunk by chunk (tile by tile) with its own causal cache, exactly as in
 * forward(). Cost: one encode of compute, one extra read of every activation for its
 * statistics, and each level written once and read twice (x by both passes of its resnet). */
#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

#include "cpu_conv.h"
#include "models/vae/cogvideox_encoder.h"
#include "models/vae/spill_stream.h"

namespace videotrain::vae {

namespace {

// Per (sample, group) count, mean and sum of squared deviations: each chunk's in float32 (on
// its device), merged across chunks and tiles in float64 (Chan et al.).
struct GroupStats {
  int groups;
  std::vector<double> n, mean, m2;  // [B * groups]
  explicit GroupStats(int g) : groups(g) {}

  void add(const at::Tensor &x) {
    if (x.numel() == 0) return;
    const int64_t B = x.size(0);
    if (n.empty()) n.assign(B * groups, 0.0), mean.assign(B * groups, 0.0), m2.assign(B * groups, 0.0);
    if (static_cast<size_t>(B * groups) != n.size()) throw std::runtime_error("forward_clip_scope: batch changed");
    at::Tensor v = x.to(at::kFloat).reshape({B, groups, -1});
    const double k = static_cast<double>(v.size(2));
    auto vm = at::var_mean(v, {2}, /*unbiased=*/false, /*keepdim=*/false);
    at::Tensor var = std::get<0>(vm).to(at::kCPU, at::kDouble).contiguous().view(-1);
    at::Tensor mu = std::get<1>(vm).to(at::kCPU, at::kDouble).contiguous().view(-1);
    auto var_a = var.accessor<double, 1>(), mu_a = mu.accessor<double, 1>();
    for (size_t i = 0; i < n.size(); i++) {
      const double d = mu_a[i] - mean[i], total = n[i] + k;
      mean[i] += d * k / total;
      m2[i] += var_a[i] * k + d * d * n[i] * k / total;
      n[i] = total;
    }
  }

  // GroupNorm of x with these statistics and the affine weight and bias, then SiLU; float32
  // arithmetic, the result in x's dtype.
  at::Tensor apply_silu(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b, double eps) const {
    if (n.empty()) throw std::runtime_error("forward_clip_scope: statistics of an empty level");
    const int64_t B = x.size(0), c = x.size(1);
    std::vector<double> rstd(n.size()), shift(n.size());
    for (size_t i = 0; i < n.size(); i++) {
      rstd[i] = 1.0 / std::sqrt(m2[i] / n[i] + eps);
      shift[i] = -mean[i] * rstd[i];
    }
    auto opts = at::TensorOptions().dtype(at::kDouble);
    at::Tensor r = at::tensor(rstd, opts).to(x.device(), at::kFloat).view({B, groups, 1});
    at::Tensor s = at::tensor(shift, opts).to(x.device(), at::kFloat).view({B, groups, 1});
    at::Tensor wf = w.to(at::kFloat).view({1, groups, c / groups}), bf = b.to(at::kFloat).view({1, groups, c / groups});
    // Per channel: scale = w * rstd[g], offset = b + w * shift[g].
    std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
    shape[0] = B, shape[1] = c;
    at::Tensor scale = (wf * r).reshape(shape), offset = (bf + wf * s).reshape(shape);
    at::Tensor y = at::addcmul(offset, x, scale);  // float32 (promoted from a 16-bit x)
    at::silu_(y);
    return y.scalar_type() == x.scalar_type() ? y : y.to(x.scalar_type());
  }
};

}  // namespace

std::vector<at::Tensor> CogVideoXEncoder::forward_clip_scope(const ClipScopeInput &in, SpillTo spill) const {
  if (in.tiles == 0 || in.chunks == 0 || !in.chunk) throw std::runtime_error("forward_clip_scope: no chunks");
  const int g = cfg_.norm_num_groups;
  const double eps = cfg_.norm_eps;
  const size_t items = in.tiles * in.chunks;  // tile-major: each tile's chunks in order
  const at::Tensor like = at::empty({0}, at::TensorOptions().device(device_).dtype(dtype_));
  auto conv = [&](const Conv &c, const at::Tensor &x, StreamCache &cache) {
    cache.idx = 0;
    return causal_conv3d(c, x, cache.next(), true);
  };
  auto pointwise = [](const Conv &c, const at::Tensor &x) {
    return conv3d_fast(x, c.w, c.b, {1, 1, 1}, {0, 0, 0});
  };

  // One streaming pass: step(i, cache) is item i's output; it is spilled and, over the positions
  // its tile owns at downscale `scale`, counted in the statistics of the next normalisation.
  struct Level {
    std::unique_ptr<SpillStream> data;
    GroupStats stats;
  };
  auto pass = [&](int64_t scale, const std::function<at::Tensor(size_t, StreamCache &)> &step) {
    Level out{std::make_unique<SpillStream>(spill), GroupStats(g)};
    StreamCache cache;
    for (size_t i = 0; i < items; i++) {
      if (i % in.chunks == 0) cache = StreamCache();
      at::Tensor h = step(i, cache);
      at::Tensor counted = h;
      if (in.owned) {
        auto o = in.owned(i / in.chunks, scale, h.size(3), h.size(4));
        counted = h.slice(3, o[0], o[1]).slice(4, o[2], o[3]);
      }
      out.stats.add(counted);
      out.data->push(h);
    }
    return out;
  };

  int64_t scale = 1;
  Level level = pass(scale, [&](size_t i, StreamCache &cache) {
    return conv(conv_in_, in.chunk(i / in.chunks, i % in.chunks).to(device_, dtype_), cache);
  });

  // The resnets in order, each with what follows it (a block's downsampler after its last).
  struct Step {
    const Resnet *r;
    const Block *down;
  };
  std::vector<Step> steps;
  for (const auto &b : blocks_)
    for (size_t i = 0; i < b.resnets.size(); i++)
      steps.push_back({&b.resnets[i], (i + 1 == b.resnets.size() && b.downsample) ? &b : nullptr});
  for (const auto &r : mid_) steps.push_back({&r, nullptr});

  for (const Step &st : steps) {
    const Resnet &r = *st.r;
    Level hidden = pass(scale, [&](size_t i, StreamCache &cache) {
      return conv(r.conv1, level.stats.apply_silu(level.data->get(i, like), r.norm1.w, r.norm1.b, eps), cache);
    });
    const int64_t next_scale = st.down ? scale * 2 : scale;
    Level next = pass(next_scale, [&](size_t i, StreamCache &cache) {
      at::Tensor h = hidden.data->get(i, like);
      at::Tensor out = conv(r.conv2, hidden.stats.apply_silu(h, r.norm2.w, r.norm2.b, eps), cache);
      h = at::Tensor();
      at::Tensor x = level.data->get(i, like);
      out.add_(r.shortcut.w.defined() ? pointwise(r.shortcut, x) : x);
      return st.down ? downsample(*st.down, out) : out;
    });
    level = std::move(next);
    scale = next_scale;
  }

  std::vector<at::Tensor> tiles(in.tiles);
  std::vector<at::Tensor> parts;
  StreamCache cache;
  for (size_t i = 0; i < items; i++) {
    if (i % in.chunks == 0) cache = StreamCache();
    at::Tensor h = conv(conv_out_, level.stats.apply_silu(level.data->get(i, like), norm_out_.w, norm_out_.b, 1e-6),
                        cache);
    if (quant_conv_.w.defined()) h = pointwise(quant_conv_, h);
    parts.push_back(h);
    if (i % in.chunks + 1 == in.chunks) {
      tiles[i / in.chunks] = parts.size() == 1 ? parts[0] : at::cat(parts, 2);
      parts.clear();
    }
  }
  return tiles;
}

at::Tensor CogVideoXEncoder::forward_clip_scope(const std::vector<at::Tensor> &chunks, SpillTo spill) const {
  ClipScopeInput in;
  in.chunks = chunks.size();
  in.chunk = [&](size_t, size_t c) { return chunks[c]; };
  return forward_clip_scope(in, spill).at(0);
}

}  // namespace videotrain::vae
