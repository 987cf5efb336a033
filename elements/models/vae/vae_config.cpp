#include "models/vae/vae_config.h"

#include <sys/stat.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "safetensors.h"
#include "regular_file.h"
#include "seeded_hash.h"

namespace videotrain::vae {

using json = nlohmann::json;

int VaeConfig::temporal_levels() const {
  int l = 0;
  while ((1 << l) < temporal_compression_ratio) l++;
  return l;
}

std::string shape_str(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// A JSON number as an int: integers (or integral floats such as 3.0) that fit, else false.
// nlohmann's get<int>() casts 1e30 to int, which is undefined behaviour.
bool json_int(const json &v, int *out) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT_MAX)
                               : v.get<int64_t>() < INT_MIN || v.get<int64_t>() > INT_MAX)
      return false;
    *out = static_cast<int>(v.get<int64_t>());
    return true;
  }
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  if (!(std::floor(d) == d && d >= INT_MIN && d <= INT_MAX)) return false;  // NaN fails too
  *out = static_cast<int>(d);
  return true;
}

std::string int_error(const char *key, const json &v) {
  return std::string("'") + key + "' must be an integer that fits 32 bits, not " + v.dump();
}

}  // namespace

bool parse_vae_config(const std::string &text, VaeConfig *out, std::string *error) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception &e) {
    if (error) *error = std::string("not valid JSON: ") + e.what();
    return false;
  }
  if (!j.is_object()) {
    if (error) *error = "not a JSON object";
    return false;
  }
  auto fail = [&](const std::string &why) {
    if (error) *error = why;
    return false;
  };
  VaeConfig c;
  try {
    auto get = [&](const char *key, auto &dst) {
      if (j.contains(key) && !j[key].is_null()) dst = j[key].get<std::decay_t<decltype(dst)>>();
    };
    get("_class_name", c.class_name);
    get("act_fn", c.act_fn);
    get("norm_eps", c.norm_eps);
    get("scaling_factor", c.scaling_factor);
    get("invert_scale_latents", c.invert_scale_latents);
    get("use_quant_conv", c.use_quant_conv);
    get("use_post_quant_conv", c.use_post_quant_conv);
    for (auto [key, dst] : {std::pair{"in_channels", &c.in_channels}, std::pair{"latent_channels", &c.latent_channels},
                            std::pair{"layers_per_block", &c.layers_per_block},
                            std::pair{"norm_num_groups", &c.norm_num_groups},
                            std::pair{"temporal_compression_ratio", &c.temporal_compression_ratio}})
      if (j.contains(key) && !j[key].is_null() && !json_int(j[key], dst)) return fail(int_error(key, j[key]));
    if (!j.contains("block_out_channels") || !j.contains("down_block_types"))
      return fail("missing 'block_out_channels' or 'down_block_types'");
    const json &ch = j.at("block_out_channels");
    if (!ch.is_array()) return fail("'block_out_channels' is not a list");
    for (const auto &v : ch) {
      c.block_out_channels.push_back(0);
      if (!json_int(v, &c.block_out_channels.back())) return fail(int_error("block_out_channels", v));
    }
    c.down_block_types = j.at("down_block_types").get<std::vector<std::string>>();
  } catch (const std::exception &e) {
    return fail(std::string("unexpected value type: ") + e.what());
  }
  *out = c;
  return true;
}

bool load_vae_config(const std::string &path, VaeConfig *out, std::string *error) {
  std::string text, why;
  if (!read_small_file(path, kMaxConfigBytes, &text, &why)) {
    if (error) *error = "cannot read " + why;
    return false;
  }
  if (!parse_vae_config(text, out, &why)) {
    if (error) *error = path + ": " + why;
    return false;
  }
  return true;
}

std::string vae_config_to_json(const VaeConfig &c) {
  std::vector<std::string> up(c.down_block_types.size(), "CogVideoXUpBlock3D");
  json j = {{"_class_name", c.class_name},
            {"in_channels", c.in_channels},
            {"out_channels", c.in_channels},
            {"down_block_types", c.down_block_types},
            {"up_block_types", up},
            {"block_out_channels", c.block_out_channels},
            {"latent_channels", c.latent_channels},
            {"layers_per_block", c.layers_per_block},
            {"act_fn", c.act_fn},
            {"norm_eps", c.norm_eps},
            {"norm_num_groups", c.norm_num_groups},
            {"temporal_compression_ratio", c.temporal_compression_ratio},
            {"sample_height", 480},
            {"sample_width", 720},
            {"scaling_factor", c.scaling_factor},
            {"shift_factor", nullptr},
            {"latents_mean", nullptr},
            {"latents_std", nullptr},
            {"force_upcast", true},
            {"use_quant_conv", c.use_quant_conv},
            {"use_post_quant_conv", c.use_post_quant_conv},
            {"invert_scale_latents", c.invert_scale_latents}};
  return j.dump(2);
}

std::string check_supported(const VaeConfig &c) {
  if (c.class_name != "AutoencoderKLCogVideoX")
    return "_class_name is '" + c.class_name + "', the native encoder runs AutoencoderKLCogVideoX only";
  if (c.in_channels != 3) return "in_channels is " + std::to_string(c.in_channels) + ", RGB input needs 3";
  if (c.block_out_channels.empty()) return "block_out_channels is empty";
  if (c.block_out_channels.size() != c.down_block_types.size())
    return "block_out_channels has " + std::to_string(c.block_out_channels.size()) + " entries but down_block_types " +
           std::to_string(c.down_block_types.size());
  for (size_t i = 0; i < c.down_block_types.size(); i++)
    if (c.down_block_types[i] != "CogVideoXDownBlock3D")
      return "down_block_types[" + std::to_string(i) + "] is '" + c.down_block_types[i] +
             "', only CogVideoXDownBlock3D is supported";
  // Upper bounds keep the tensor table (and 1 << blocks) finite: the largest published
  // CogVideoX VAEs have 4 blocks of at most 512 channels and 3 layers.
  if (c.block_out_channels.size() > kMaxBlocks)
    return "block_out_channels has " + std::to_string(c.block_out_channels.size()) + " entries, at most " +
           std::to_string(kMaxBlocks) + " are supported";
  if (c.norm_num_groups < 1 || c.norm_num_groups > kMaxChannels)
    return "norm_num_groups = " + std::to_string(c.norm_num_groups) + " is not in [1, " +
           std::to_string(kMaxChannels) + "]";
  for (size_t i = 0; i < c.block_out_channels.size(); i++) {
    int ch = c.block_out_channels[i];
    if (ch < 1 || ch > kMaxChannels || ch % c.norm_num_groups != 0)
      return "block_out_channels[" + std::to_string(i) + "] = " + std::to_string(ch) +
             " is not a positive multiple of norm_num_groups = " + std::to_string(c.norm_num_groups) +
             " up to " + std::to_string(kMaxChannels);
  }
  if (c.latent_channels < 1 || c.latent_channels > kMaxChannels)
    return "latent_channels = " + std::to_string(c.latent_channels) + " is not in [1, " +
           std::to_string(kMaxChannels) + "]";
  if (c.layers_per_block < 1 || c.layers_per_block > kMaxLayersPerBlock)
    return "layers_per_block = " + std::to_string(c.layers_per_block) + " is not in [1, " +
           std::to_string(kMaxLayersPerBlock) + "]";
  if (c.act_fn != "silu" && c.act_fn != "swish") return "act_fn '" + c.act_fn + "' is not supported (silu only)";
  int r = c.temporal_compression_ratio;
  if (r < 1 || (r & (r - 1)) != 0) return "temporal_compression_ratio " + std::to_string(r) + " is not a power of two";
  if (c.temporal_levels() > c.num_blocks() - 1)
    return "temporal_compression_ratio " + std::to_string(r) + " needs " + std::to_string(c.temporal_levels()) +
           " downsampling blocks, the config has " + std::to_string(c.num_blocks() - 1);
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps)) return "norm_eps must be positive and finite";
  if (!std::isfinite(c.scaling_factor)) return "scaling_factor must be finite";
  return "";
}

std::vector<std::pair<std::string, std::vector<int64_t>>> encoder_tensor_table(const VaeConfig &c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> t;
  auto add = [&](const std::string &n, std::vector<int64_t> s) { t.emplace_back(n, std::move(s)); };
  auto conv3 = [&](const std::string &p, int64_t out, int64_t in) {
    add(p + ".conv.weight", {out, in, 3, 3, 3});
    add(p + ".conv.bias", {out});
  };
  auto resnet = [&](const std::string &p, int64_t in, int64_t out) {
    add(p + ".norm1.weight", {in});
    add(p + ".norm1.bias", {in});
    conv3(p + ".conv1", out, in);
    add(p + ".norm2.weight", {out});
    add(p + ".norm2.bias", {out});
    conv3(p + ".conv2", out, out);
    if (in != out) {
      add(p + ".conv_shortcut.weight", {out, in, 1, 1, 1});
      add(p + ".conv_shortcut.bias", {out});
    }
  };
  const auto &ch = c.block_out_channels;
  if (ch.empty()) return t;
  conv3("encoder.conv_in", ch[0], c.in_channels);
  for (int i = 0; i < c.num_blocks(); i++) {
    int64_t in = i == 0 ? ch[0] : ch[i - 1], out = ch[i];
    std::string p = "encoder.down_blocks." + std::to_string(i);
    for (int l = 0; l < c.layers_per_block; l++) resnet(p + ".resnets." + std::to_string(l), l == 0 ? in : out, out);
    if (i != c.num_blocks() - 1) {
      add(p + ".downsamplers.0.conv.weight", {out, out, 3, 3});
      add(p + ".downsamplers.0.conv.bias", {out});
    }
  }
  int64_t last = ch.back();
  for (int l = 0; l < 2; l++) resnet("encoder.mid_block.resnets." + std::to_string(l), last, last);
  add("encoder.norm_out.weight", {last});
  add("encoder.norm_out.bias", {last});
  conv3("encoder.conv_out", 2 * c.latent_channels, last);
  if (c.use_quant_conv) {
    add("quant_conv.weight", {2 * c.latent_channels, 2 * c.latent_channels, 1, 1, 1});
    add("quant_conv.bias", {2 * c.latent_channels});
  }
  return t;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> decoder_tensor_table(const VaeConfig &c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> t;
  auto add = [&](const std::string &n, std::vector<int64_t> s) { t.emplace_back(n, std::move(s)); };
  auto conv = [&](const std::string &p, int64_t out, int64_t in, int64_t k) {
    add(p + ".weight", {out, in, k, k, k});
    add(p + ".bias", {out});
  };
  const int64_t L = c.latent_channels;
  // SpatialNorm3D: GroupNorm affine plus 1x1x1 convolutions of the latent.
  auto snorm = [&](const std::string &p, int64_t ch) {
    add(p + ".norm_layer.weight", {ch});
    add(p + ".norm_layer.bias", {ch});
    conv(p + ".conv_y.conv", ch, L, 1);
    conv(p + ".conv_b.conv", ch, L, 1);
  };
  auto resnet = [&](const std::string &p, int64_t in, int64_t out) {
    snorm(p + ".norm1", in);
    conv(p + ".conv1.conv", out, in, 3);
    snorm(p + ".norm2", out);
    conv(p + ".conv2.conv", out, out, 3);
    if (in != out) conv(p + ".conv_shortcut", out, in, 1);
  };
  if (c.block_out_channels.empty()) return t;
  const std::vector<int64_t> ch(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  conv("decoder.conv_in.conv", ch[0], L, 3);
  for (int l = 0; l < 2; l++) resnet("decoder.mid_block.resnets." + std::to_string(l), ch[0], ch[0]);
  int64_t prev = ch[0];
  for (size_t i = 0; i < ch.size(); i++) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    for (int l = 0; l <= c.layers_per_block; l++)
      resnet(p + ".resnets." + std::to_string(l), l == 0 ? prev : ch[i], ch[i]);
    if (i + 1 != ch.size()) {
      add(p + ".upsamplers.0.conv.weight", {ch[i], ch[i], 3, 3});
      add(p + ".upsamplers.0.conv.bias", {ch[i]});
    }
    prev = ch[i];
  }
  snorm("decoder.norm_out", ch.back());
  conv("decoder.conv_out.conv", c.in_channels, ch.back(), 3);
  if (c.use_post_quant_conv) conv("post_quant_conv", L, L, 1);
  return t;
}

VaeConfig tiny_config() {
  VaeConfig c;
  c.down_block_types.assign(4, "CogVideoXDownBlock3D");
  c.block_out_channels = {16, 32, 32, 32};
  c.latent_channels = 4;
  c.layers_per_block = 1;
  c.norm_num_groups = 4;
  return c;
}

VaeConfig cogvideox_2b_config() {
  VaeConfig c;
  c.down_block_types.assign(4, "CogVideoXDownBlock3D");
  c.block_out_channels = {128, 256, 256, 512};
  c.latent_channels = 16;
  c.layers_per_block = 3;
  c.norm_num_groups = 32;
  return c;
}

VaeConfig mid_config() {
  VaeConfig c = cogvideox_2b_config();
  c.block_out_channels = {64, 128, 128, 256};
  c.layers_per_block = 2;
  return c;
}

bool write_random_weights(const std::string &path, const std::vector<std::pair<std::string, std::vector<int64_t>>> &table,
                          uint64_t seed, const std::string &dtype, std::string *error) {
  if (dtype != "F32" && dtype != "F16" && dtype != "BF16") {
    if (error) *error = "dtype must be F32, F16 or BF16, not '" + dtype + "'";
    return false;
  }
  SplitMix64 rng{seed * 0x2545F4914F6CDD1DULL + 1};
  std::vector<SafetensorsOutTensor> out;
  std::map<std::string, std::vector<int64_t>> shapes(table.begin(), table.end());
  for (const auto &[name, shape] : table) {
    size_t numel = 1;
    for (auto d : shape) numel *= d;
    std::vector<float> v(numel);
    bool is_norm = name.find("norm") != std::string::npos;
    bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_norm) {
      for (auto &x : v) x = static_cast<float>((is_bias ? 0.0 : 1.0) + 0.2 * (rng.uniform() - 0.5));
    } else {
      // fan_in of the layer this weight or bias belongs to
      std::string wname = is_bias ? name.substr(0, name.size() - 5) + ".weight" : name;
      int64_t fan_in = 1;
      const auto &ws = shapes[wname];
      for (size_t k = 1; k < ws.size(); k++) fan_in *= ws[k];
      double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
      for (auto &x : v) x = static_cast<float>(bound * (2.0 * rng.uniform() - 1.0));
    }
    SafetensorsOutTensor t;
    t.name = name;
    t.dtype = dtype;
    t.shape = shape;
    if (dtype == "F32") {
      t.bytes.resize(numel * 4);
      memcpy(t.bytes.data(), v.data(), numel * 4);
    } else {
      t.bytes.resize(numel * 2);
      for (size_t k = 0; k < numel; k++) {
        uint16_t h = dtype == "F16" ? float_to_half(v[k]) : float_to_bfloat16(v[k]);
        memcpy(t.bytes.data() + 2 * k, &h, 2);
      }
    }
    out.push_back(std::move(t));
  }
  return write_safetensors(path, out, {{"format", "pt"}}, error);
}

bool make_random_vae(const std::string &dir, const VaeConfig &cfg, uint64_t seed, const std::string &dtype,
                     std::string *error) {
  std::string bad = check_supported(cfg);
  if (!bad.empty()) {
    if (error) *error = "unsupported config: " + bad;
    return false;
  }
  if (dtype != "F32" && dtype != "F16" && dtype != "BF16") {
    if (error) *error = "dtype must be F32, F16 or BF16, not '" + dtype + "'";
    return false;
  }
  mkdir(dir.c_str(), 0755);  // may exist already
  std::string cfg_path = dir + "/config.json";
  {
    std::ofstream f(cfg_path, std::ios::trunc);
    f << vae_config_to_json(cfg) << "\n";
    if (!f.good()) {
      if (error) *error = cfg_path + ": cannot write";
      return false;
    }
  }
  // Encoder tensors first (their draws do not depend on the decoder's), then the decoder's, so that
  // vaedecoder takes the folder too.
  auto table = encoder_tensor_table(cfg);
  for (auto &t : decoder_tensor_table(cfg)) table.push_back(std::move(t));
  return write_random_weights(dir + "/diffusion_pytorch_model.safetensors", table, seed, dtype, error);
}

}  // namespace videotrain::vae
