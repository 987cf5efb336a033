#include "models/vae/cogvideox_encoder.h"

#include <ATen/ATen.h>

#include <torch/version.h>

#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>

#include "cpu_conv.h"
#include "safetensors.h"

namespace videotrain::vae {

namespace {

std::optional<at::ScalarType> torch_dtype(const std::string &st) {
  if (st == "F32") return at::kFloat;
  if (st == "F16") return at::kHalf;
  if (st == "BF16") return at::kBFloat16;
  if (st == "F64") return at::kDouble;
  return std::nullopt;
}

}  // namespace

std::unique_ptr<CogVideoXEncoder> CogVideoXEncoder::load(const std::string &dir, c10::Device device,
                                                         c10::ScalarType dtype) {
  std::string cfg_path = dir + "/config.json";
  std::string st_path = dir + "/diffusion_pytorch_model.safetensors";
  std::string err;
  VaeConfig cfg;
  if (!load_vae_config(cfg_path, &cfg, &err)) throw std::runtime_error(err);
  std::string bad = check_supported(cfg);
  if (!bad.empty()) throw std::runtime_error(cfg_path + ": unsupported config: " + bad);
  auto file = SafetensorsFile::open(st_path, &err);
  if (!file) throw std::runtime_error(err);

  std::map<std::string, at::Tensor> w;
  for (const auto &[name, shape] : encoder_tensor_table(cfg)) {
    const SafetensorsEntry *e = file->find(name);
    if (!e)
      throw std::runtime_error("tensor '" + name + "' (expected shape " + shape_str(shape) + ") is missing from " +
                               st_path);
    if (e->shape != shape)
      throw std::runtime_error("tensor '" + name + "' has shape " + shape_str(e->shape) + " in " + st_path +
                               ", but " + cfg_path + " implies " + shape_str(shape));
    auto src = torch_dtype(e->dtype);
    if (!src)
      throw std::runtime_error("tensor '" + name + "' in " + st_path + " has dtype " + e->dtype +
                               "; the loader reads F32, F16, BF16 and F64");
    // Copy out of the mapping (its offsets need not be aligned), then convert.
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(*src));
    if (e->nbytes) memcpy(t.data_ptr(), e->data, e->nbytes);
    w[name] = t.to(device, dtype);
  }

  std::unique_ptr<CogVideoXEncoder> enc(new CogVideoXEncoder());
  enc->cfg_ = cfg;
  enc->device_ = device;
  enc->dtype_ = dtype;
  auto conv = [&](const std::string &p) { return Conv{w.at(p + ".weight"), w.at(p + ".bias"), at::Tensor()}; };
  auto norm = [&](const std::string &p) { return Norm{w.at(p + ".weight"), w.at(p + ".bias")}; };
  auto resnet = [&](const std::string &p) {
    Resnet r;
    r.norm1 = norm(p + ".norm1");
    r.norm2 = norm(p + ".norm2");
    r.conv1 = conv(p + ".conv1.conv");
    r.conv2 = conv(p + ".conv2.conv");
    if (w.count(p + ".conv_shortcut.weight")) r.shortcut = conv(p + ".conv_shortcut");
    return r;
  };
  enc->conv_in_ = conv("encoder.conv_in.conv");
  for (int i = 0; i < cfg.num_blocks(); i++) {
    std::string p = "encoder.down_blocks." + std::to_string(i);
    Block b;
    for (int l = 0; l < cfg.layers_per_block; l++) b.resnets.push_back(resnet(p + ".resnets." + std::to_string(l)));
    b.downsample = i != cfg.num_blocks() - 1;
    b.compress_time = i < cfg.temporal_levels();
    if (b.downsample) {
      b.down = conv(p + ".downsamplers.0.conv");
      b.down.w = b.down.w.unsqueeze(2);  // a per-frame 2D conv as a 1x3x3 3D conv
    }
    enc->blocks_.push_back(std::move(b));
  }
  for (int l = 0; l < 2; l++) enc->mid_.push_back(resnet("encoder.mid_block.resnets." + std::to_string(l)));
  enc->norm_out_ = norm("encoder.norm_out");
  enc->conv_out_ = conv("encoder.conv_out.conv");
  if (cfg.use_quant_conv) enc->quant_conv_ = conv("quant_conv");
  enc->pack_weights();
  return enc;
}

// LibTorch 1.x's oneDNN convolution reorders a plain weight into its blocked layout on every
// call (several percent of a CPU encode); packed once here it is used as is. LibTorch 2.x
// is left on the plain path.
void CogVideoXEncoder::pack_weights() {
#if TORCH_VERSION_MAJOR < 2
  if (!device_.is_cpu() || dtype_ != at::kFloat || !at::hasMKLDNN()) return;
  auto pack = [](Conv &c, at::IntArrayRef stride, at::IntArrayRef padding) {
    c.packed = at::mkldnn_reorder_conv3d_weight(c.w.contiguous().to_mkldnn(), padding, stride, {1, 1, 1}, 1);
  };
  auto same = [](const Conv &c) { return std::vector<int64_t>{0, (c.w.size(3) - 1) / 2, (c.w.size(4) - 1) / 2}; };
  auto resnet = [&](Resnet &r) {
    pack(r.conv1, {1, 1, 1}, same(r.conv1));
    pack(r.conv2, {1, 1, 1}, same(r.conv2));
    if (r.shortcut.w.defined()) pack(r.shortcut, {1, 1, 1}, {0, 0, 0});
  };
  pack(conv_in_, {1, 1, 1}, same(conv_in_));
  for (auto &b : blocks_) {
    for (auto &r : b.resnets) resnet(r);
    if (b.downsample) pack(b.down, {1, 2, 2}, {0, 0, 0});
  }
  for (auto &r : mid_) resnet(r);
  pack(conv_out_, {1, 1, 1}, same(conv_out_));
  if (quant_conv_.w.defined()) pack(quant_conv_, {1, 1, 1}, {0, 0, 0});
#endif
}

at::Tensor CogVideoXEncoder::conv(const Conv &c, const at::Tensor &x, at::IntArrayRef stride,
                                  at::IntArrayRef padding) const {
  if (c.packed.defined() && x.is_cpu() && x.scalar_type() == at::kFloat && !cpu_autocast_on())
    return at::mkldnn_convolution(x.contiguous(), c.packed, c.b, padding, stride, {1, 1, 1}, 1);
  return conv3d_fast(x, c.w, c.b, stride, padding);
}

// Time padding is causal: the first chunk repeats its first frame kernel-1 times, later
// chunks prepend the cached last kernel-1 frames of the previous chunk's padded input.
at::Tensor CogVideoXEncoder::causal_conv(const Conv &c, const at::Tensor &x, ConvCache &cache, size_t &idx) const {
  const int64_t head = c.w.size(2) - 1;
  if (head == 0) return causal_conv_padded(c, x, 0, cache, idx);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[2] += head;
  at::Tensor buf = at::empty(sizes, x.options());
  buf.narrow(2, head, x.size(2)).copy_(x);
  return causal_conv_padded(c, buf, head, cache, idx);
}

// `buf` holds the input from frame `head` on; its first `head` frames are written here, so the
// layer before can write straight into it and no concatenation copies the activations.
at::Tensor CogVideoXEncoder::causal_conv_padded(const Conv &c, const at::Tensor &buf, int64_t head, ConvCache &cache,
                                                size_t &idx) const {
  if (cache.entries.size() <= idx) cache.entries.resize(idx + 1);
  at::Tensor &slot = cache.entries[idx++];
  const int64_t kh = c.w.size(3), kw = c.w.size(4);
  if (head > 0) {
    at::Tensor pad = buf.narrow(2, 0, head);
    if (slot.defined())
      pad.copy_(slot);
    else
      pad.copy_(buf.narrow(2, head, 1).expand_as(pad));
    slot = buf.narrow(2, buf.size(2) - head, head).clone();
  }
  return conv(c, buf, {1, 1, 1}, {0, (kh - 1) / 2, (kw - 1) / 2});
}

// GroupNorm then SiLU, written into frames [head, head + T) of a new [B, C, head + T, H, W]
// buffer for the causal conv that follows (one pass and one allocation less than silu + cat).
// (A per-group fused CPU kernel built from ATen calls measured no faster here: the oneDNN
// convolutions and their layout reorders dominate.)
at::Tensor CogVideoXEncoder::norm_silu(const Norm &n, const at::Tensor &x, double eps, int64_t head) const {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[2] += head;
  at::Tensor buf = at::empty(sizes, x.options());
  at::Tensor out = buf.narrow(2, head, x.size(2));
  at::silu_out(out, at::group_norm(x, cfg_.norm_num_groups, n.w, n.b, eps));
  return buf;
}

at::Tensor CogVideoXEncoder::resnet(const Resnet &r, const at::Tensor &x, ConvCache &cache, size_t &idx) const {
  const double eps = cfg_.norm_eps;
  const int64_t head1 = r.conv1.w.size(2) - 1, head2 = r.conv2.w.size(2) - 1;
  at::Tensor h = causal_conv_padded(r.conv1, norm_silu(r.norm1, x, eps, head1), head1, cache, idx);
  h = causal_conv_padded(r.conv2, norm_silu(r.norm2, h, eps, head2), head2, cache, idx);
  if (r.shortcut.w.defined()) return h.add_(conv(r.shortcut, x, {1, 1, 1}, {0, 0, 0}));
  return h.add_(x);
}

// Temporal compression keeps a lone first frame (odd length) and averages the following
// pairs; then a stride-2 3x3 conv per frame after padding one zero row and column at the end.
at::Tensor CogVideoXEncoder::downsample(const Block &b, const at::Tensor &x) const {
  at::Tensor h = x;
  if (b.compress_time) {
    int64_t t = h.size(2);
    auto pair_mean = [](const at::Tensor &y) {
      int64_t n = y.size(2) / 2 * 2;
      return (y.slice(2, 0, n, 2) + y.slice(2, 1, n, 2)) / 2;
    };
    if (t % 2 == 1) {
      at::Tensor first = h.narrow(2, 0, 1);
      if (t > 1)
        h = at::cat({first, pair_mean(h.narrow(2, 1, t - 1))}, 2);
      else
        h = first;
    } else {
      h = pair_mean(h);
    }
  }
  h = at::constant_pad_nd(h, {0, 1, 0, 1}, 0);
  return conv(b.down, h, {1, 2, 2}, {0, 0, 0});
}

at::Tensor CogVideoXEncoder::forward(const at::Tensor &x_in, ConvCache &cache) const {
  size_t idx = 0;
  at::Tensor x = x_in.to(device_, dtype_);
  at::Tensor h = causal_conv(conv_in_, x, cache, idx);
  for (const auto &b : blocks_) {
    for (const auto &r : b.resnets) h = resnet(r, h, cache, idx);
    if (b.downsample) h = downsample(b, h);
  }
  for (const auto &r : mid_) h = resnet(r, h, cache, idx);
  const int64_t head = conv_out_.w.size(2) - 1;
  h = causal_conv_padded(conv_out_, norm_silu(norm_out_, h, 1e-6, head), head, cache, idx);
  if (quant_conv_.w.defined()) h = conv(quant_conv_, h, {1, 1, 1}, {0, 0, 0});
  return h;
}

}  // namespace videotrain::vae
