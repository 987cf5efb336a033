#include "models/vae/wan_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include <fstream>

#include "models/vae/vae_config.h"

namespace videotrain::vae {

using json = nlohmann::json;

std::vector<int> WanConfig::dims() const {
  std::vector<int> d{base_dim};
  for (int m : dim_mult) d.push_back(base_dim * m);
  return d;
}

int WanConfig::spatial_compression() const { return patch_size * (1 << (levels() - 1)); }

int WanConfig::temporal_compression() const {
  int n = 0;
  for (int i = 0; i + 1 < levels() && i < static_cast<int>(temperal_downsample.size()); i++) n += temperal_downsample[i];
  return 1 << n;
}

std::string config_class_name(const std::string &json_text) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_object() && j.contains("_class_name") && j["_class_name"].is_string())
    return j["_class_name"].get<std::string>();
  return "";
}

namespace {

// Integers given as JSON numbers: whole, within [lo, hi].
bool get_int(const json &j, const char *key, int lo, int hi, int *out, std::string *error) {
  if (!j.contains(key) || !j[key].is_number()) {
    *error = std::string("'") + key + "' is missing or not a number";
    return false;
  }
  const double v = j[key].get<double>();
  if (!(v >= lo && v <= hi) || v != static_cast<double>(static_cast<int64_t>(v))) {
    *error = std::string("'") + key + "' is " + j[key].dump() + ", expected a whole number in [" + std::to_string(lo) +
             ", " + std::to_string(hi) + "]";
    return false;
  }
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

bool parse_wan_config(const std::string &json_text, WanConfig *out, std::string *error) {
  std::string err;
  json j = json::parse(json_text, nullptr, false);
  auto fail = [&](const std::string &why) {
    if (error) *error = why;
    return false;
  };
  if (!j.is_object()) return fail("config.json is not a JSON object");
  WanConfig c;
  if (!get_int(j, "base_dim", 1, 65536, &c.base_dim, &err) || !get_int(j, "z_dim", 1, 4096, &c.z_dim, &err) ||
      !get_int(j, "num_res_blocks", 1, 64, &c.num_res_blocks, &err))
    return fail(err);
  if (!j.contains("dim_mult") || !j["dim_mult"].is_array() || j["dim_mult"].empty() || j["dim_mult"].size() > 8)
    return fail("'dim_mult' is missing or not a list of 1 to 8 numbers");
  c.dim_mult.clear();
  // Bounded before any product: base_dim * 2^62 would overflow (and a uint64 read as int64 wraps).
  const int64_t max_mult = 65536 / c.base_dim;
  for (const auto &m : j["dim_mult"]) {
    const bool whole = m.is_number_integer();
    const int64_t v = !whole ? 0 : m.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(m.get<uint64_t>(), 1u << 20))
                                                           : m.get<int64_t>();
    if (v < 1 || v > max_mult)
      return fail("'dim_mult' holds " + m.dump() + ": expected whole numbers from 1 to " + std::to_string(max_mult) +
                  " (base_dim " + std::to_string(c.base_dim) + " times it gives the channels, at most 65536)");
    c.dim_mult.push_back(static_cast<int>(v));
  }
  if (j.contains("decoder_base_dim") && !j["decoder_base_dim"].is_null()) {
    if (!get_int(j, "decoder_base_dim", 1, 65536, &c.decoder_base_dim, &err)) return fail(err);
    for (int m : c.dim_mult)
      if (int64_t{c.decoder_base_dim} * m > 65536)
        return fail("'decoder_base_dim' " + std::to_string(c.decoder_base_dim) + " times 'dim_mult' exceeds 65536 channels");
  }
  c.temperal_downsample.clear();
  if (!j.contains("temperal_downsample") || !j["temperal_downsample"].is_array())
    return fail("'temperal_downsample' is missing or not a list of booleans");
  for (const auto &t : j["temperal_downsample"]) {
    if (!t.is_boolean()) return fail("'temperal_downsample' holds " + t.dump() + ": expected booleans");
    c.temperal_downsample.push_back(t.get<bool>());
  }
  if (c.temperal_downsample.size() + 1 < c.dim_mult.size())
    return fail("'temperal_downsample' has " + std::to_string(c.temperal_downsample.size()) +
                " entries; 'dim_mult' needs " + std::to_string(c.dim_mult.size() - 1));
  if (j.contains("attn_scales") && j["attn_scales"].is_array() && !j["attn_scales"].empty())
    return fail("'attn_scales' is not empty: attention inside the down blocks is not supported (Wan's VAEs have "
                "none; diffusers' encoder cannot run it either)");
  if (j.contains("is_residual") && !j["is_residual"].is_null()) {
    if (!j["is_residual"].is_boolean()) return fail("'is_residual' is " + j["is_residual"].dump() + ", expected a boolean");
    c.is_residual = j["is_residual"].get<bool>();
  }
  if (j.contains("patch_size") && !j["patch_size"].is_null()) {
    if (!get_int(j, "patch_size", 1, 16, &c.patch_size, &err)) return fail(err);
  }
  c.in_channels = 3 * c.patch_size * c.patch_size;
  if (j.contains("in_channels") && !j["in_channels"].is_null()) {
    int in = 0;
    if (!get_int(j, "in_channels", 1, 4096, &in, &err)) return fail(err);
    if (in != c.in_channels)
      return fail("'in_channels' is " + std::to_string(in) + "; RGB frames in patches of " +
                  std::to_string(c.patch_size) + "x" + std::to_string(c.patch_size) + " give " +
                  std::to_string(c.in_channels));
  }
  for (const char *key : {"latents_mean", "latents_std"}) {
    if (!j.contains(key) || !j[key].is_array() || j[key].size() != static_cast<size_t>(c.z_dim))
      return fail(std::string("'") + key + "' is missing or does not hold z_dim = " + std::to_string(c.z_dim) +
                  " numbers");
    auto &dst = std::string(key) == "latents_mean" ? c.latents_mean : c.latents_std;
    for (const auto &v : j[key]) {
      if (!v.is_number()) return fail(std::string("'") + key + "' holds " + v.dump());
      dst.push_back(v.get<double>());
    }
  }
  for (double s : c.latents_std)
    if (!(s > 0)) return fail("'latents_std' holds " + std::to_string(s) + ": every entry must be > 0");
  *out = c;
  return true;
}

namespace {

// The names and shapes of a Wan VAE's tensors, as its encoder and decoder tables list them.
struct TensorTable {
  std::vector<std::pair<std::string, std::vector<int64_t>>> t;
  void conv(const std::string &p, int64_t out, int64_t in, std::vector<int64_t> k) {
    std::vector<int64_t> shape{out, in};
    shape.insert(shape.end(), k.begin(), k.end());
    t.push_back({p + ".weight", shape});
    t.push_back({p + ".bias", {out}});
  }
  void resnet(const std::string &p, int64_t in, int64_t out) {
    t.push_back({p + ".norm1.gamma", {in, 1, 1, 1}});
    conv(p + ".conv1", out, in, {3, 3, 3});
    t.push_back({p + ".norm2.gamma", {out, 1, 1, 1}});
    conv(p + ".conv2", out, out, {3, 3, 3});
    if (in != out) conv(p + ".conv_shortcut", out, in, {1, 1, 1});
  }
  // resnet, attention, resnet at `dim` channels.
  void mid_block(const std::string &p, int64_t dim) {
    resnet(p + ".resnets.0", dim, dim);
    t.push_back({p + ".attentions.0.norm.gamma", {dim, 1, 1}});
    conv(p + ".attentions.0.to_qkv", 3 * dim, dim, {1, 1});
    conv(p + ".attentions.0.proj", dim, dim, {1, 1});
    resnet(p + ".resnets.1", dim, dim);
  }
};

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> wan_encoder_tensor_table(const WanConfig &cfg) {
  TensorTable tt;
  auto resample = [&](const std::string &p, int64_t dim, bool time) {
    tt.conv(p + ".resample.1", dim, dim, {3, 3});
    if (time) tt.conv(p + ".time_conv", dim, dim, {3, 1, 1});
  };
  const auto d = cfg.dims();
  tt.conv("encoder.conv_in", d[0], cfg.in_channels, {3, 3, 3});
  int flat = 0;
  for (int i = 0; i < cfg.levels(); i++) {
    const bool down = i != cfg.levels() - 1;
    const bool time = down && cfg.temperal_downsample[i];
    int64_t in = d[i];
    for (int r = 0; r < cfg.num_res_blocks; r++) {
      const std::string p = cfg.is_residual ? "encoder.down_blocks." + std::to_string(i) + ".resnets." + std::to_string(r)
                                            : "encoder.down_blocks." + std::to_string(flat++);
      tt.resnet(p, in, d[i + 1]);
      in = d[i + 1];
    }
    if (down)
      resample(cfg.is_residual ? "encoder.down_blocks." + std::to_string(i) + ".downsampler"
                               : "encoder.down_blocks." + std::to_string(flat++),
               d[i + 1], time);
  }
  const int64_t top = d.back();
  tt.mid_block("encoder.mid_block", top);
  tt.t.push_back({"encoder.norm_out.gamma", {top, 1, 1, 1}});
  tt.conv("encoder.conv_out", 2 * cfg.z_dim, top, {3, 3, 3});
  tt.conv("quant_conv", 2 * cfg.z_dim, 2 * cfg.z_dim, {1, 1, 1});
  return tt.t;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> wan_decoder_tensor_table(const WanConfig &cfg) {
  TensorTable tt;
  // Channels from the deepest level up: base * [dim_mult.back(), reversed dim_mult...].
  const int64_t base = cfg.decoder_base_dim > 0 ? cfg.decoder_base_dim : cfg.base_dim;
  std::vector<int64_t> d{base * cfg.dim_mult.back()};
  for (auto it = cfg.dim_mult.rbegin(); it != cfg.dim_mult.rend(); ++it) d.push_back(base * *it);
  tt.conv("post_quant_conv", cfg.z_dim, cfg.z_dim, {1, 1, 1});
  tt.conv("decoder.conv_in", d[0], cfg.z_dim, {3, 3, 3});
  tt.mid_block("decoder.mid_block", d[0]);
  const int levels = cfg.levels();
  for (int i = 0; i < levels; i++) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    const bool up = i != levels - 1;
    const bool time = up && cfg.temperal_downsample[static_cast<size_t>(levels - 2 - i)];
    // Wan 2.1's upsamplers halve the channels they pass on; 2.2's keep them.
    int64_t in = (i > 0 && !cfg.is_residual) ? d[i] / 2 : d[i];
    const int64_t out = d[i + 1];
    for (int r = 0; r <= cfg.num_res_blocks; r++, in = out) tt.resnet(p + ".resnets." + std::to_string(r), in, out);
    if (up) {
      const std::string u = p + (cfg.is_residual ? ".upsampler" : ".upsamplers.0");
      tt.conv(u + ".resample.1", cfg.is_residual ? out : out / 2, out, {3, 3});
      if (time) tt.conv(u + ".time_conv", 2 * out, out, {3, 1, 1});
    }
  }
  tt.t.push_back({"decoder.norm_out.gamma", {d.back(), 1, 1, 1}});
  tt.conv("decoder.conv_out", 3 * cfg.patch_size * cfg.patch_size, d.back(), {3, 3, 3});
  return tt.t;
}

std::string wan_config_to_json(const WanConfig &cfg) {
  json j;
  j["_class_name"] = "AutoencoderKLWan";
  j["base_dim"] = cfg.base_dim;
  j["decoder_base_dim"] = cfg.decoder_base_dim > 0 ? json(cfg.decoder_base_dim) : json(nullptr);
  j["z_dim"] = cfg.z_dim;
  j["dim_mult"] = cfg.dim_mult;
  j["num_res_blocks"] = cfg.num_res_blocks;
  j["attn_scales"] = json::array();
  j["temperal_downsample"] = cfg.temperal_downsample;
  j["dropout"] = 0.0;
  j["latents_mean"] = cfg.latents_mean.empty() ? std::vector<double>(cfg.z_dim, 0.0) : cfg.latents_mean;
  j["latents_std"] = cfg.latents_std.empty() ? std::vector<double>(cfg.z_dim, 1.0) : cfg.latents_std;
  j["is_residual"] = cfg.is_residual;
  j["in_channels"] = cfg.in_channels;
  j["out_channels"] = 3 * cfg.patch_size * cfg.patch_size;
  if (cfg.patch_size > 1) j["patch_size"] = cfg.patch_size;
  else j["patch_size"] = nullptr;
  j["scale_factor_temporal"] = cfg.temporal_compression();
  j["scale_factor_spatial"] = cfg.spatial_compression();
  return j.dump(2);
}

WanConfig wan21_config() { return WanConfig{}; }

WanConfig tiny_wan21_config() {
  WanConfig c;
  c.base_dim = 16;
  c.z_dim = 4;
  c.dim_mult = {1, 2, 2, 2};
  c.num_res_blocks = 1;
  return c;
}

WanConfig wan22_config() {
  WanConfig c;
  c.base_dim = 160;
  c.decoder_base_dim = 256;
  c.z_dim = 48;
  c.is_residual = true;
  c.in_channels = 12;
  c.patch_size = 2;
  return c;
}

WanConfig tiny_wan22_config() {
  WanConfig c = tiny_wan21_config();
  c.z_dim = 8;
  c.is_residual = true;
  c.in_channels = 12;
  c.patch_size = 2;
  return c;
}

bool make_random_wan_vae(const std::string &dir, const WanConfig &cfg, uint64_t seed, const std::string &dtype,
                         std::string *error) {
  // What the encoder will read back: the config must parse as one.
  WanConfig check;
  if (!parse_wan_config(wan_config_to_json(cfg), &check, error)) return false;
  mkdir(dir.c_str(), 0755);  // may exist already
  const std::string cfg_path = dir + "/config.json";
  {
    std::ofstream f(cfg_path, std::ios::trunc);
    f << wan_config_to_json(cfg) << "\n";
    if (!f.good()) {
      if (error) *error = cfg_path + ": cannot write";
      return false;
    }
  }
  auto table = wan_encoder_tensor_table(check);  // encoder first: its draws stay as they were
  for (auto &t : wan_decoder_tensor_table(check)) table.push_back(std::move(t));
  return write_random_weights(dir + "/diffusion_pytorch_model.safetensors", table, seed, dtype, error);
}

}  // namespace videotrain::vae
