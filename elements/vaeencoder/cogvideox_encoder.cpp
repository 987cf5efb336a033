#include "cogvideox_encoder.h"

#include <ATen/ATen.h>

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
  auto conv = [&](const std::string &p) { return Conv{w.at(p + ".weight"), w.at(p + ".bias")}; };
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
  return enc;
}

// Time padding is causal: the first chunk repeats its first frame kernel-1 times, later
// chunks prepend the cached last kernel-1 frames of the previous chunk's padded input.
at::Tensor CogVideoXEncoder::causal_conv(const Conv &c, const at::Tensor &x, ConvCache &cache, size_t &idx) const {
  if (cache.entries.size() <= idx) cache.entries.resize(idx + 1);
  at::Tensor &slot = cache.entries[idx++];
  int64_t kt = c.w.size(2), kh = c.w.size(3), kw = c.w.size(4);
  at::Tensor in = x;
  if (kt > 1) {
    std::vector<at::Tensor> parts;
    if (slot.defined()) {
      parts.push_back(slot);
    } else {
      at::Tensor first = x.narrow(2, 0, 1);
      for (int64_t i = 0; i < kt - 1; i++) parts.push_back(first);
    }
    parts.push_back(x);
    in = at::cat(parts, 2);
    slot = in.narrow(2, in.size(2) - (kt - 1), kt - 1).clone();
  }
  return conv3d_fast(in, c.w, c.b, {1, 1, 1}, {0, (kh - 1) / 2, (kw - 1) / 2});
}

at::Tensor CogVideoXEncoder::resnet(const Resnet &r, const at::Tensor &x, ConvCache &cache, size_t &idx) const {
  const int g = cfg_.norm_num_groups;
  const double eps = cfg_.norm_eps;
  at::Tensor h = at::silu(at::group_norm(x, g, r.norm1.w, r.norm1.b, eps));
  h = causal_conv(r.conv1, h, cache, idx);
  h = at::silu(at::group_norm(h, g, r.norm2.w, r.norm2.b, eps));
  h = causal_conv(r.conv2, h, cache, idx);
  at::Tensor skip = r.shortcut.w.defined() ? conv3d_fast(x, r.shortcut.w, r.shortcut.b, {1, 1, 1}, {0, 0, 0}) : x;
  return h + skip;
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
  return conv3d_fast(h, b.down.w, b.down.b, {1, 2, 2}, {0, 0, 0});
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
  h = at::silu(at::group_norm(h, cfg_.norm_num_groups, norm_out_.w, norm_out_.b, 1e-6));
  h = causal_conv(conv_out_, h, cache, idx);
  if (quant_conv_.w.defined()) h = conv3d_fast(h, quant_conv_.w, quant_conv_.b, {1, 1, 1}, {0, 0, 0});
  return h;
}

}  // namespace videotrain::vae
