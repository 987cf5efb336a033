/* See dit_precheck.h. */
#include "dit_precheck.h"

#include <cstdint>
#include <set>
#include <vector>

#include "cogvideox_transformer_config.h"
#include "wan_transformer_config.h"

namespace videotrain::models {

namespace {

std::string shape_text(const std::vector<int64_t> &s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The blocks the headers hold: distinct N of "<prefix>N.".
int64_t blocks_in(const DiffusersFolder &f, const std::string &prefix) {
  std::set<int64_t> seen;
  for (const auto &[name, e] : f.tensors) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos || dot == prefix.size()) continue;
    int64_t n = 0;
    bool digits = true;
    for (size_t i = prefix.size(); i < dot; i++) {
      if (name[i] < '0' || name[i] > '9' || n > 1000000) digits = false;
      else n = n * 10 + (name[i] - '0');
    }
    if (digits) seen.insert(n);
  }
  return static_cast<int64_t>(seen.size());
}

}  // namespace

std::string precheck_dit_folder(const DiffusersFolder &f) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> want;
  std::string prefix, why;
  int64_t layers = 0;
  if (f.class_name == "WanTransformer3DModel") {
    WanConfig c;
    if (!parse_wan_transformer_config(f.config_text, &c, &why)) return "";  // the build names the key
    const int64_t d = c.dim();
    want = {{"patch_embedding.weight", {d, c.in_channels, c.patch_size[0], c.patch_size[1], c.patch_size[2]}},
            {"condition_embedder.text_embedder.linear_1.weight", {d, c.text_dim}},
            {"condition_embedder.time_embedder.linear_1.weight", {d, c.freq_dim}},
            {"blocks.0.attn1.to_q.weight", {d, d}},
            {"blocks.0.ffn.net.0.proj.weight", {c.ffn_dim, d}}};
    if (c.image_dim) {
      want.push_back({"condition_embedder.image_embedder.ff.net.0.proj.weight", {c.image_dim, c.image_dim}});
      want.push_back({"blocks.0.attn2.add_k_proj.weight", {d, c.added_kv_proj_dim}});
    }
    if (c.pos_embed_seq_len)
      want.push_back({"condition_embedder.image_embedder.pos_embed", {1, c.pos_embed_seq_len, c.image_dim}});
    prefix = "blocks.";
    layers = c.num_layers;
  } else if (f.class_name == "CogVideoXTransformer3DModel") {
    CogVideoXConfig c;
    if (!parse_cogvideox_transformer_config(f.config_text, &c, &why)) return "";
    const int64_t d = c.dim();
    want = {{"patch_embed.text_proj.weight", {d, c.text_embed_dim}},
            {"time_embedding.linear_1.weight", {c.time_embed_dim, d}},
            {"transformer_blocks.0.attn1.to_q.weight", {d, d}}};
    prefix = "transformer_blocks.";
    layers = c.num_layers;
  } else {
    return "";
  }
  for (const auto &[name, shape] : want) {
    const auto it = f.tensors.find(name);
    if (it != f.tensors.end() && it->second->shape != shape)
      return f.dir + "/config.json declares " + name + " as " + shape_text(shape) + ", the weights hold " +
             shape_text(it->second->shape) + ": a config of another model than its weights";
  }
  const int64_t held = blocks_in(f, prefix);
  if (held > layers)
    return f.dir + "/config.json declares num_layers " + std::to_string(layers) + ", the weights hold " +
           std::to_string(held) + " blocks: " + prefix + std::to_string(layers) +
           ".* and on are not in the model (a config of another model than its weights)";
  if (held < layers)
    return f.dir + "/config.json declares num_layers " + std::to_string(layers) + ", the folder lacks '" + prefix +
           std::to_string(held) + ".*' (its weights hold " + std::to_string(held) +
           " blocks: a config of another model than its weights)";
  return "";
}

}  // namespace videotrain::models
