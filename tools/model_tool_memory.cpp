/* videotrain-model info's per-GPU memory (a formula, before activations) and `info CONFIG.json`: a
 * Wan transformer's parameter counts from its config alone, without building or loading weights. */
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "model_tool.h"
#include "models/model_options.h"
#include "models/wan_transformer_config.h"

namespace videotrain::model_tool {

bool default_lora_target(const std::string &module) {
  std::stringstream ss(ModelOptions{}.lora_targets);
  for (std::string s; std::getline(ss, s, ',');)
    if (module.size() > s.size() && module.compare(module.size() - s.size(), s.size(), s) == 0 &&
        module[module.size() - s.size() - 1] == '.')
      return true;
  return false;
}

void ParamCounts::add_linear(const std::string &module, uint64_t in, uint64_t out) {
  linear += in * out;
  rows += out;
  if (default_lora_target(module)) lora32 += 32 * (in + out);
}

void print_memory_table(const ParamCounts &c) {
  const double p = double(c.total), l = double(c.lora32), lin = double(c.linear), rows = double(c.rows);
  std::printf("parameters %llu (%.4g B), of them Linear weights %llu in %llu output rows; a rank-32 LoRA on to_q, "
              "to_k, to_v, to_out.0: %llu\n",
              static_cast<unsigned long long>(c.total), p / 1e9, static_cast<unsigned long long>(c.linear),
              static_cast<unsigned long long>(c.rows), static_cast<unsigned long long>(c.lora32));
  std::printf("per GPU before activations, from a formula (not measured; DDP: every rank holds all of it):\n"
              "  full fine-tune (AdamW): weights + gradients + 2 moments, fp32 16 B/param, bf16 autocast adds a bf16 "
              "copy (18 B); fp8 bases cannot train\n"
              "  LoRA rank 32 (AdamW): the frozen base (fp32 4 B, bf16 2 B, fp8 1 B per Linear weight + a float32 "
              "scale per row, the rest bf16) + the adapter's 16 B/param\n"
              "  ema-decay adds 4 B per trained parameter\n");
  const double lora_state = 16 * l;
  const double base[3] = {4 * p, 2 * p, lin + 4 * rows + 2 * (p - lin)};
  const char *names[3] = {"fp32", "bf16", "fp8"};
  std::printf("  %-5s %-14s %-14s %-14s %-14s\n", "base", "full AdamW", "full +EMA", "LoRA r32", "LoRA r32 +EMA");
  for (int i = 0; i < 3; i++) {
    const std::string full = i == 2 ? "-" : human(p * (i == 0 ? 16 : 18)), full_ema = i == 2 ? "-" : human(p * (i == 0 ? 20 : 22));
    std::printf("  %-5s %-14s %-14s %-14s %-14s\n", names[i], full.c_str(), full_ema.c_str(),
                human(base[i] + lora_state).c_str(), human(base[i] + lora_state + 4 * l).c_str());
  }
  // Sharded (param_shards.h): trainable tensors only, so a LoRA's frozen base stays whole.
  const double blk = double(c.largest_block);
  std::printf("with ddptrainsink sharding over N ranks (per GPU; fp32 master weights, AdamW):\n"
              "  optimizer: the weights whole (4 B/param) + gradients and moments / N (12 B / N; with checkpointing a "
              "block's full gradients live only during its backward, without it all of them until the step's end: "
              "+4 B/param)\n"
              "  full: weights, gradients and moments / N (16 B / N) + two gathered blocks' weights (the one in use "
              "and the next, prefetched) and one block's gradients (12 B x %.4g M); bf16 autocast gathers them in "
              "bf16 (6 B x the block; none and optimizer: adds a bf16 copy of every weight)\n"
              "  LoRA: the frozen base as above + the adapter's 16 B / N\n",
              blk / 1e6);
  std::printf("  %-4s %-16s %-16s %-22s %-18s %-18s\n", "N", "full: optimizer", "full: full", "under bf16 autocast",
              "LoRA r32 bf16 base", "LoRA r32 fp8 base");
  for (int n : {2, 8}) {
    const double opt = 4 * p + 12 * p / n + (blk > 0 ? 4 * blk : 4 * p), fsdp = 16 * p / n + 12 * blk;
    std::printf("  %-4d %-16s %-16s %-22s %-18s %-18s\n", n, human(opt).c_str(), human(fsdp).c_str(),
                (human(opt + 2 * p) + " / " + human(fsdp - 6 * blk)).c_str(), human(base[1] + lora_state / n).c_str(),
                human(base[2] + lora_state / n).c_str());
  }
}

ParamCounts wan_param_counts(const models::WanConfig &c) {
  const uint64_t d = c.dim(), f = c.ffn_dim, pt = c.patch_size[0] * c.patch_size[1] * c.patch_size[2];
  ParamCounts n;
  auto linear = [&](const std::string &name, uint64_t in, uint64_t out) {
    n.add_linear(name, in, out);
    n.total += in * out + out;  // every Wan Linear has a bias
  };
  n.total += d * c.in_channels * pt + d;  // patch_embedding (a Conv3d)
  linear("condition_embedder.text_embedder.linear_1", c.text_dim, d);
  linear("condition_embedder.text_embedder.linear_2", d, d);
  linear("condition_embedder.time_embedder.linear_1", c.freq_dim, d);
  linear("condition_embedder.time_embedder.linear_2", d, d);
  linear("condition_embedder.time_proj", d, 6 * d);
  for (int64_t b = 0; b < c.num_layers; b++) {
    const uint64_t before = n.total;
    const std::string p = "blocks." + std::to_string(b) + ".";
    for (const char *a : {"attn1.", "attn2."}) {
      for (const char *m : {"to_q", "to_k", "to_v", "to_out.0"}) linear(p + a + m, d, d);
      n.total += 2 * d;  // norm_q, norm_k (rms_norm_across_heads)
    }
    if (c.cross_attn_norm) n.total += 2 * d;  // norm2, affine
    linear(p + "ffn.net.0.proj", d, f);
    linear(p + "ffn.net.2", f, d);
    n.total += 6 * d;  // scale_shift_table
    if (b == 0) n.largest_block = n.total - before;
  }
  linear("proj_out", d, c.out_channels * pt);
  n.total += 2 * d;  // scale_shift_table
  return n;
}

int config_info(const std::string &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw std::runtime_error("cannot read " + path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const std::exception &e) {
    throw std::runtime_error(path + " is not JSON: " + e.what());
  }
  const std::string cls = j.value("_class_name", "");
  if (cls != "WanTransformer3DModel")
    throw std::runtime_error(path + ": info on a config.json counts WanTransformer3DModel configs (this is " +
                             (cls.empty() ? std::string("no _class_name") : cls) + "); give the model folder instead");
  for (const char *k : {"image_dim", "added_kv_proj_dim", "pos_embed_seq_len"})
    if (j.contains(k) && !j[k].is_null())
      throw std::runtime_error(path + ": '" + k + "' (an image-conditioned Wan): give the model folder, whose weights "
                               "info counts");
  models::WanConfig c;
  std::string err;
  if (!models::parse_wan_transformer_config(text.str(), &c, &err)) throw std::runtime_error(path + ": " + err);
  std::printf("config: %s\nclass: %s, width %lld (%lld heads x %lld), ffn %lld, %lld blocks, text_dim %lld, "
              "channels %lld -> %lld\n",
              path.c_str(), cls.c_str(), (long long)c.dim(), (long long)c.num_attention_heads,
              (long long)c.attention_head_dim, (long long)c.ffn_dim, (long long)c.num_layers, (long long)c.text_dim,
              (long long)c.in_channels, (long long)c.out_channels);
  print_memory_table(wan_param_counts(c));
  return 0;
}

}  // namespace videotrain::model_tool
