/* CogVideoXEncoder::forward_clip_scope: whole-clip GroupNorm statistics at chunk-bounded
 * memory. A resnet is normalise(x) -> conv1 -> normalise -> conv2 (+ shortcut of x); each
 * normalisation needs statistics of its whole input before any of it can go on, so the clip
 * flows through the encoder one normalisation at a time:
 *   pass 0: conv_in over the frames           -> level x0, statistics of x0
 *   per resnet, pass a: norm1(x), conv1       -> h, statistics of h
 *               pass b: norm2(h), conv2 + x   -> next x (downsampled at a block's end), its statistics
 *   last pass:  norm_out(x), conv_out, quant  -> moments
 * Every convolution runs chunk by chunk with its own causal cache, exactly as in forward().
 * Cost: one encode of compute plus writing and reading each level once. */
#include <ATen/ATen.h>

#include <stdexcept>

#include "cogvideox_encoder.h"
#include "cpu_conv.h"
#include "spill_stream.h"

namespace videotrain::vae {

namespace {

// Per-group count, mean and sum of squared deviations, merged chunk by chunk (Chan et al.).
struct GroupStats {
  int groups;
  std::vector<double> n, mean, m2;
  explicit GroupStats(int g) : groups(g), n(g, 0.0), mean(g, 0.0), m2(g, 0.0) {}

  void add(const at::Tensor &x) {
    at::Tensor v = x.to(at::kDouble).reshape({x.size(0), groups, -1}).transpose(0, 1).reshape({groups, -1});
    const double k = static_cast<double>(v.size(1));
    at::Tensor mu = v.mean(1), sq = (v - mu.unsqueeze(1)).pow(2).sum(1);
    auto mu_a = mu.accessor<double, 1>(), sq_a = sq.accessor<double, 1>();
    for (int g = 0; g < groups; g++) {
      const double d = mu_a[g] - mean[g], total = n[g] + k;
      mean[g] += d * k / total;
      m2[g] += sq_a[g] + d * d * n[g] * k / total;
      n[g] = total;
    }
  }

  // GroupNorm of x with these statistics, then the affine weight and bias.
  at::Tensor apply(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b, double eps) const {
    std::vector<double> rstd(groups), shift(groups);
    for (int g = 0; g < groups; g++) {
      rstd[g] = 1.0 / std::sqrt(m2[g] / n[g] + eps);
      shift[g] = -mean[g] * rstd[g];
    }
    auto opts = at::TensorOptions().dtype(at::kDouble);
    at::Tensor r = at::tensor(rstd, opts).to(x.device(), at::kFloat);
    at::Tensor s = at::tensor(shift, opts).to(x.device(), at::kFloat);
    const int64_t c = x.size(1);
    // Per channel: scale = w * rstd[g], offset = b + w * shift[g] (float32 on the device).
    at::Tensor scale = (w.to(at::kFloat) * r.repeat_interleave(c / groups)), offset = b.to(at::kFloat) + w.to(at::kFloat) * s.repeat_interleave(c / groups);
    std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
    shape[1] = c;
    return (x.to(at::kFloat) * scale.view(shape) + offset.view(shape)).to(x.scalar_type());
  }
};

}  // namespace

at::Tensor CogVideoXEncoder::forward_clip_scope(const std::vector<at::Tensor> &chunks, bool spill_to_file) const {
  if (chunks.empty()) throw std::runtime_error("forward_clip_scope: no chunks");
  const int g = cfg_.norm_num_groups;
  const double eps = cfg_.norm_eps;
  const at::Tensor like = at::empty({0}, at::TensorOptions().device(device_).dtype(dtype_));
  auto conv_pass = [&](const Conv &c, const at::Tensor &x, ConvCache &cache) {
    size_t idx = 0;
    return causal_conv(c, x, cache, idx);
  };

  // Pass 0: conv_in.
  auto level = std::make_unique<SpillStream>(spill_to_file);
  auto stats = std::make_unique<GroupStats>(g);
  {
    ConvCache cache;
    for (const auto &x : chunks) {
      at::Tensor h = conv_pass(conv_in_, x.to(device_, dtype_), cache);
      stats->add(h);
      level->push(h);
    }
  }
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
    auto hidden = std::make_unique<SpillStream>(spill_to_file);
    auto hstats = std::make_unique<GroupStats>(g);
    {
      ConvCache cache;
      for (size_t i = 0; i < level->size(); i++) {
        at::Tensor x = level->get(i, like);
        at::Tensor h = conv_pass(r.conv1, at::silu(stats->apply(x, r.norm1.w, r.norm1.b, eps)), cache);
        hstats->add(h);
        hidden->push(h);
      }
    }
    auto next = std::make_unique<SpillStream>(spill_to_file);
    auto nstats = std::make_unique<GroupStats>(g);
    {
      ConvCache cache;
      for (size_t i = 0; i < level->size(); i++) {
        at::Tensor x = level->get(i, like), h = hidden->get(i, like);
        at::Tensor out = conv_pass(r.conv2, at::silu(hstats->apply(h, r.norm2.w, r.norm2.b, eps)), cache);
        out = out + (r.shortcut.w.defined() ? conv3d_fast(x, r.shortcut.w, r.shortcut.b, {1, 1, 1}, {0, 0, 0}) : x);
        if (st.down) out = downsample(*st.down, out);
        nstats->add(out);
        next->push(out);
      }
    }
    level = std::move(next);
    stats = std::move(nstats);
  }

  std::vector<at::Tensor> out;
  ConvCache cache;
  for (size_t i = 0; i < level->size(); i++) {
    at::Tensor x = level->get(i, like);
    at::Tensor h = conv_pass(conv_out_, at::silu(stats->apply(x, norm_out_.w, norm_out_.b, 1e-6)), cache);
    if (quant_conv_.w.defined()) h = conv3d_fast(h, quant_conv_.w, quant_conv_.b, {1, 1, 1}, {0, 0, 0});
    out.push_back(h);
  }
  return at::cat(out, 2);
}

}  // namespace videotrain::vae
