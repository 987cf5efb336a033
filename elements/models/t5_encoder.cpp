/* T5 / umT5 encoder: see t5_encoder.h. */
#include "t5_encoder.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "diffusers_folder.h"
#include "layers.h"
#include "regular_file.h"
#include "weights_io.h"

namespace videotrain::models {

namespace {

// A module holding one parameter `weight`, so that names read as transformers' (q.weight, ...).
struct WeightImpl : torch::nn::Module {
  WeightImpl(std::vector<int64_t> shape, const torch::TensorOptions &o) {
    weight = register_parameter("weight", torch::empty(shape, o), false);  // filled from the folder
  }
  at::Tensor weight;
};
TORCH_MODULE(Weight);

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const T5Config &c, bool bias, const torch::TensorOptions &o) {
    const int64_t inner = c.inner_dim();
    q = register_module("q", Weight(std::vector<int64_t>{inner, c.d_model}, o));
    k = register_module("k", Weight(std::vector<int64_t>{inner, c.d_model}, o));
    v = register_module("v", Weight(std::vector<int64_t>{inner, c.d_model}, o));
    this->o = register_module("o", Weight(std::vector<int64_t>{c.d_model, inner}, o));
    if (bias)
      relative_attention_bias = register_module(
          "relative_attention_bias", Weight(std::vector<int64_t>{c.relative_attention_num_buckets, c.num_heads}, o));
  }
  Weight q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr}, relative_attention_bias{nullptr};
};
TORCH_MODULE(Attention);

struct NormImpl : torch::nn::Module {
  NormImpl(int64_t d, const torch::TensorOptions &o) { weight = register_parameter("weight", torch::empty({d}, o), false); }
  at::Tensor weight;
};
TORCH_MODULE(Norm);

struct SelfAttentionLayerImpl : torch::nn::Module {
  SelfAttentionLayerImpl(const T5Config &c, bool bias, const torch::TensorOptions &o) {
    SelfAttention = register_module("SelfAttention", Attention(c, bias, o));
    layer_norm = register_module("layer_norm", Norm(c.d_model, o));
  }
  Attention SelfAttention{nullptr};
  Norm layer_norm{nullptr};
};
TORCH_MODULE(SelfAttentionLayer);

struct FeedForwardImpl : torch::nn::Module {
  FeedForwardImpl(const T5Config &c, const torch::TensorOptions &o) {
    wi_0 = register_module("wi_0", Weight(std::vector<int64_t>{c.d_ff, c.d_model}, o));
    wi_1 = register_module("wi_1", Weight(std::vector<int64_t>{c.d_ff, c.d_model}, o));
    wo = register_module("wo", Weight(std::vector<int64_t>{c.d_model, c.d_ff}, o));
  }
  Weight wi_0{nullptr}, wi_1{nullptr}, wo{nullptr};
};
TORCH_MODULE(FeedForward);

struct FeedForwardLayerImpl : torch::nn::Module {
  FeedForwardLayerImpl(const T5Config &c, const torch::TensorOptions &o) {
    DenseReluDense = register_module("DenseReluDense", FeedForward(c, o));
    layer_norm = register_module("layer_norm", Norm(c.d_model, o));
  }
  FeedForward DenseReluDense{nullptr};
  Norm layer_norm{nullptr};
};
TORCH_MODULE(FeedForwardLayer);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const T5Config &c, bool bias, const torch::TensorOptions &o) {
    attn = SelfAttentionLayer(c, bias, o);
    ff = FeedForwardLayer(c, o);
    layer = register_module("layer", torch::nn::ModuleList(attn, ff));
  }
  SelfAttentionLayer attn{nullptr};
  FeedForwardLayer ff{nullptr};
  torch::nn::ModuleList layer{nullptr};
};
TORCH_MODULE(Block);

struct StackImpl : torch::nn::Module {
  StackImpl(const T5Config &c, const at::Tensor &shared, const torch::TensorOptions &o) {
    block = register_module("block", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_layers; i++) {
      blocks.push_back(Block(c, c.umt5 || i == 0, o));
      block->push_back(blocks.back());
    }
    final_layer_norm = register_module("final_layer_norm", Norm(c.d_model, o));
    // transformers ties the encoder's embedding to `shared`: the same tensor under both names.
    auto e = std::make_shared<torch::nn::Module>();
    e->register_parameter("weight", shared, false);
    register_module("embed_tokens", e);
  }
  std::vector<Block> blocks;
  torch::nn::ModuleList block{nullptr};
  Norm final_layer_norm{nullptr};
};
TORCH_MODULE(Stack);

struct T5Module : torch::nn::Module {
  T5Module(const T5Config &c, const torch::TensorOptions &o) {
    shared = register_module("shared", Weight(std::vector<int64_t>{c.vocab_size, c.d_model}, o));
    encoder = register_module("encoder", Stack(c, shared->weight, o));
  }
  Weight shared{nullptr};
  Stack encoder{nullptr};
};

// transformers' bidirectional bucket of (key position - query position): half the buckets per
// direction, the first half of those exact, the rest logarithmic up to max_distance.
at::Tensor relative_buckets(int64_t len, int64_t num_buckets, int64_t max_distance, c10::Device device) {
  auto pos = torch::arange(len, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto rel = pos.unsqueeze(0) - pos.unsqueeze(1);  // [q, k] = k - q
  const int64_t half = num_buckets / 2, max_exact = half / 2;
  auto ret = (rel > 0).to(torch::kLong) * half;
  auto n = rel.abs();
  auto large = max_exact + (torch::log(n.to(torch::kFloat) / static_cast<double>(max_exact)) /
                            std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                            static_cast<double>(half - max_exact))
                               .to(torch::kLong);
  large = torch::clamp_max(large, half - 1);
  return ret + torch::where(n < max_exact, n, large);
}

}  // namespace

struct T5Encoder::Impl {
  T5Config config;
  std::string config_text;
  std::unique_ptr<T5Module> m;

  // [1, H, L, L] float32 from a bias table [buckets, H].
  at::Tensor position_bias(const at::Tensor &table, int64_t len) const {
    auto b = relative_buckets(len, config.relative_attention_num_buckets, config.relative_attention_max_distance,
                              table.device());
    return torch::embedding(table, b).to(torch::kFloat).permute({2, 0, 1}).unsqueeze(0);
  }

  // T5LayerNorm: no mean subtracted, the variance in float32, scaled in the weight's dtype.
  at::Tensor norm(const at::Tensor &x, const at::Tensor &w) const {
    auto h = x.to(torch::kFloat);
    h = h * torch::rsqrt(h.pow(2).mean(-1, true) + config.layer_norm_epsilon);
    return w * h.to(w.scalar_type());
  }

  // x [B, L, D]; bias [B or 1, H, L, L] float32 (position bias + mask).
  at::Tensor attention(const AttentionImpl &a, const at::Tensor &x, const at::Tensor &bias) const {
    const int64_t b = x.size(0), l = x.size(1), h = config.num_heads, d = config.d_kv;
    auto split = [&](const at::Tensor &w) { return at::linear(x, w).view({b, l, h, d}).transpose(1, 2); };
    auto q = split(a.q->weight), k = split(a.k->weight), v = split(a.v->weight);
    auto scores = torch::matmul(q, k.transpose(-1, -2)).to(torch::kFloat) + bias;
    auto p = torch::softmax(scores, -1).to(v.scalar_type());
    auto y = torch::matmul(p, v).transpose(1, 2).reshape({b, l, h * d});
    return at::linear(y, a.o->weight);
  }

  at::Tensor feed_forward(const FeedForwardImpl &f, const at::Tensor &x) const {
    return at::linear(gelu_tanh(at::linear(x, f.wi_0->weight)) * at::linear(x, f.wi_1->weight), f.wo->weight);
  }

  // fp16 overflow guard transformers applies after each sub-layer.
  static at::Tensor clamp_half(at::Tensor x) {
    if (x.scalar_type() != at::kHalf) return x;
    const double limit = 65504.0 - 1000.0;
    return torch::clamp(x, -limit, limit);
  }
};

T5Encoder::T5Encoder() : im_(new Impl) {}
T5Encoder::~T5Encoder() = default;

std::unique_ptr<T5Encoder> T5Encoder::open(const std::string &dir, c10::Device device, c10::ScalarType dtype) {
  DiffusersFolder folder;
  std::string err;
  if (!open_diffusers_folder(dir, "model", &folder, &err)) throw std::runtime_error(err);
  std::unique_ptr<T5Encoder> e(new T5Encoder());
  Impl &im = *e->im_;
  if (!parse_t5_config(folder.config_text, &im.config, &err))
    throw std::runtime_error("'" + dir + "/config.json': " + err);
  im.config_text = folder.config_text;
  if (folder.class_name.empty()) folder.class_name = im.config.class_name;
  im.m = std::make_unique<T5Module>(im.config, torch::TensorOptions().dtype(dtype).device(device));
  load_strict(*im.m, folder, {"encoder.embed_tokens.weight"});
  im.m->eval();
  return e;
}

T5Config T5Encoder::read_config(const std::string &dir) {
  std::string text, err;
  if (!read_small_file(dir + "/config.json", kMaxConfigBytes, &text, &err)) throw std::runtime_error(err);
  T5Config c;
  if (!parse_t5_config(text, &c, &err)) throw std::runtime_error("'" + dir + "/config.json': " + err);
  return c;
}

const T5Config &T5Encoder::config() const { return im_->config; }

at::Tensor T5Encoder::forward(const at::Tensor &input_ids, const at::Tensor &attention_mask) const {
  const Impl &im = *im_;
  const T5Module &m = *im.m;
  torch::NoGradGuard ng;
  const auto dev = m.shared->weight.device();
  const auto ids = input_ids.to(dev, torch::kLong);
  TORCH_CHECK(ids.dim() == 2, "input_ids must be [B, L]");
  if (ids.numel() > 0 && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= im.config.vocab_size))
    throw std::runtime_error("a token id is outside the encoder's vocabulary of " +
                             std::to_string(im.config.vocab_size) + " (another tokenizer?)");
  const int64_t len = ids.size(1);
  at::Tensor mask_bias;  // [B, 1, 1, L]: 0 on tokens, float32's lowest on padding (transformers' extended mask)
  if (attention_mask.defined())
    mask_bias = (1.0 - attention_mask.to(dev, torch::kFloat)).view({ids.size(0), 1, 1, len}) *
                std::numeric_limits<float>::lowest();
  auto with_mask = [&](at::Tensor bias) { return mask_bias.defined() ? bias + mask_bias : bias; };
  at::Tensor h = torch::embedding(m.shared->weight, ids);
  at::Tensor shared_bias;
  for (size_t i = 0; i < m.encoder->blocks.size(); i++) {
    const BlockImpl &blk = *m.encoder->blocks[i];
    const AttentionImpl &a = *blk.attn->SelfAttention;
    at::Tensor bias;
    if (a.relative_attention_bias) {
      bias = with_mask(im.position_bias(a.relative_attention_bias->weight, len));
      if (!im.config.umt5) shared_bias = bias;
    } else {
      bias = shared_bias;
    }
    h = Impl::clamp_half(h + im.attention(a, im.norm(h, blk.attn->layer_norm->weight), bias));
    h = Impl::clamp_half(h + im.feed_forward(*blk.ff->DenseReluDense, im.norm(h, blk.ff->layer_norm->weight)));
  }
  return im.norm(h, m.encoder->final_layer_norm->weight);
}

void T5Encoder::save(const std::string &dir, c10::ScalarType dtype, uint64_t max_shard_bytes) const {
  // The tied embedding goes out under both names (each loads); transformers writes only `shared.weight`.
  save_folder(*im_->m, dir, im_->config_text, "model", dtype, max_shard_bytes);
}

}  // namespace videotrain::models
