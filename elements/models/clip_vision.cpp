/* CLIP vision transformer: see clip_vision.h. */
#include "clip_vision.h"

#include <torch/torch.h>

#include <stdexcept>

#include "diffusers_folder.h"
#include "layers.h"
#include "regular_file.h"
#include "weights_io.h"

namespace videotrain::models {

namespace {

// Parameters made empty in the target dtype and device (a ViT-H holds 632M of them, filled from the
// folder right away, so torch.nn's random init would only cost time), named as transformers'.
at::Tensor param(torch::nn::Module &m, const char *name, std::vector<int64_t> shape, const torch::TensorOptions &o) {
  return m.register_parameter(name, torch::empty(shape, o), false);
}

struct AffineImpl : torch::nn::Module {  // nn.Linear (bias optional), nn.LayerNorm, nn.Conv2d's weight, nn.Embedding
  AffineImpl(std::vector<int64_t> shape, bool bias, const torch::TensorOptions &o) {
    weight = param(*this, "weight", shape, o);
    if (bias) this->bias = param(*this, "bias", {shape[0]}, o);
  }
  at::Tensor linear(const at::Tensor &x) const { return at::linear(x, weight, bias); }
  at::Tensor weight, bias;
};
TORCH_MODULE(Affine);

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t d, const torch::TensorOptions &o) {
    q_proj = register_module("q_proj", Affine(std::vector<int64_t>{d, d}, true, o));
    k_proj = register_module("k_proj", Affine(std::vector<int64_t>{d, d}, true, o));
    v_proj = register_module("v_proj", Affine(std::vector<int64_t>{d, d}, true, o));
    out_proj = register_module("out_proj", Affine(std::vector<int64_t>{d, d}, true, o));
  }
  Affine q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t d, int64_t inner, const torch::TensorOptions &o) {
    fc1 = register_module("fc1", Affine(std::vector<int64_t>{inner, d}, true, o));
    fc2 = register_module("fc2", Affine(std::vector<int64_t>{d, inner}, true, o));
  }
  Affine fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

struct LayerImpl : torch::nn::Module {
  LayerImpl(const ClipVisionConfig &c, const torch::TensorOptions &o) {
    self_attn = register_module("self_attn", Attention(c.hidden_size, o));
    layer_norm1 = register_module("layer_norm1", Affine(std::vector<int64_t>{c.hidden_size}, true, o));
    mlp = register_module("mlp", Mlp(c.hidden_size, c.intermediate_size, o));
    layer_norm2 = register_module("layer_norm2", Affine(std::vector<int64_t>{c.hidden_size}, true, o));
  }
  Attention self_attn{nullptr};
  Affine layer_norm1{nullptr}, layer_norm2{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Layer);

struct EmbeddingsImpl : torch::nn::Module {
  EmbeddingsImpl(const ClipVisionConfig &c, const torch::TensorOptions &o) {
    class_embedding = param(*this, "class_embedding", {c.hidden_size}, o);
    patch_embedding = register_module(
        "patch_embedding", Affine(std::vector<int64_t>{c.hidden_size, c.num_channels, c.patch_size, c.patch_size}, false, o));
    position_embedding =
        register_module("position_embedding", Affine(std::vector<int64_t>{c.num_positions(), c.hidden_size}, false, o));
  }
  at::Tensor class_embedding;
  Affine patch_embedding{nullptr}, position_embedding{nullptr};
};
TORCH_MODULE(Embeddings);

// CLIPVisionTransformer (transformers 4's vision_model; transformers 5's CLIPVisionModel itself).
struct VisionImpl : torch::nn::Module {
  VisionImpl(const ClipVisionConfig &c, const torch::TensorOptions &o) {
    embeddings = register_module("embeddings", Embeddings(c, o));
    pre_layrnorm = register_module("pre_layrnorm", Affine(std::vector<int64_t>{c.hidden_size}, true, o));
    auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
    auto list = encoder->register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.num_hidden_layers; i++) {
      layers.push_back(Layer(c, o));
      list->push_back(layers.back());
    }
    post_layernorm = register_module("post_layernorm", Affine(std::vector<int64_t>{c.hidden_size}, true, o));
  }
  Embeddings embeddings{nullptr};
  Affine pre_layrnorm{nullptr}, post_layernorm{nullptr};
  std::vector<Layer> layers;
};
TORCH_MODULE(Vision);

}  // namespace

struct ClipVisionEncoder::Impl {
  ClipVisionConfig config;
  std::shared_ptr<torch::nn::Module> root;  // what the folder's names address
  Vision vision{nullptr};
  Affine visual_projection{nullptr};

  at::Tensor norm(const AffineImpl &n, const at::Tensor &x) const {
    return at::layer_norm(x, {config.hidden_size}, n.weight, n.bias, config.layer_norm_eps);
  }

  at::Tensor act(const at::Tensor &x) const {
    if (config.hidden_act == "quick_gelu") return x * torch::sigmoid(1.702 * x);
    if (config.hidden_act == "gelu") return at::gelu(x);
    return gelu_tanh(x);
  }

  at::Tensor layer(const LayerImpl &l, const at::Tensor &h) const {
    const int64_t b = h.size(0), s = h.size(1), heads = config.num_attention_heads;
    const int64_t d = config.hidden_size / heads;
    const auto x = norm(*l.layer_norm1, h);
    auto split = [&](const AffineImpl &p) { return p.linear(x).view({b, s, heads, d}).transpose(1, 2); };
    const auto a = attention(split(*l.self_attn->q_proj), split(*l.self_attn->k_proj), split(*l.self_attn->v_proj));
    auto out = h + l.self_attn->out_proj->linear(a.transpose(1, 2).reshape({b, s, config.hidden_size}));
    return out + l.mlp->fc2->linear(act(l.mlp->fc1->linear(norm(*l.layer_norm2, out))));
  }
};

ClipVisionEncoder::ClipVisionEncoder() : im_(new Impl) {}
ClipVisionEncoder::~ClipVisionEncoder() = default;

std::unique_ptr<ClipVisionEncoder> ClipVisionEncoder::open(const std::string &dir, c10::Device device,
                                                           c10::ScalarType dtype) {
  DiffusersFolder folder;
  std::string err;
  if (!open_diffusers_folder(dir, "model", &folder, &err)) throw std::runtime_error(err);
  std::unique_ptr<ClipVisionEncoder> e(new ClipVisionEncoder());
  Impl &im = *e->im_;
  if (!parse_clip_vision_config(folder.config_text, &im.config, &err))
    throw std::runtime_error("'" + dir + "/config.json': " + err);
  if (folder.class_name.empty()) folder.class_name = im.config.class_name;
  // transformers before 4.31 stored the positions' arange as a buffer: not a weight.
  folder.tensors.erase("vision_model.embeddings.position_ids");
  folder.tensors.erase("embeddings.position_ids");
  bool prefixed = false;
  for (const auto &[name, entry] : folder.tensors) prefixed = prefixed || name.rfind("vision_model.", 0) == 0;
  const auto o = torch::TensorOptions().dtype(dtype).device(device);
  im.vision = Vision(im.config, o);
  im.root = im.vision.ptr();
  if (prefixed) {
    im.root = std::make_shared<torch::nn::Module>();
    im.root->register_module("vision_model", im.vision);
  }
  if (im.config.with_projection)
    im.visual_projection = im.root->register_module(
        "visual_projection", Affine(std::vector<int64_t>{im.config.projection_dim, im.config.hidden_size}, false, o));
  load_strict(*im.root, folder);
  im.root->eval();
  return e;
}

ClipVisionConfig ClipVisionEncoder::read_config(const std::string &dir) {
  std::string text, err;
  if (!read_small_file(dir + "/config.json", kMaxConfigBytes, &text, &err)) throw std::runtime_error(err);
  ClipVisionConfig c;
  if (!parse_clip_vision_config(text, &c, &err)) throw std::runtime_error("'" + dir + "/config.json': " + err);
  return c;
}

const ClipVisionConfig &ClipVisionEncoder::config() const { return im_->config; }
c10::Device ClipVisionEncoder::device() const { return im_->vision->pre_layrnorm->weight.device(); }

std::vector<at::Tensor> ClipVisionEncoder::hidden_states(const at::Tensor &pixel_values, int64_t layers) const {
  const Impl &im = *im_;
  const ClipVisionConfig &c = im.config;
  const VisionImpl &v = *im.vision;
  if (pixel_values.dim() != 4 || pixel_values.size(1) != c.num_channels || pixel_values.size(2) != c.image_size ||
      pixel_values.size(3) != c.image_size)
    throw std::runtime_error("pixel_values must be [B, " + std::to_string(c.num_channels) + ", " +
                             std::to_string(c.image_size) + ", " + std::to_string(c.image_size) +
                             "] (the image processor's output for this encoder's image_size), not " +
                             c10::str(pixel_values.sizes()));
  torch::NoGradGuard ng;
  const auto &w = v.pre_layrnorm->weight;
  const auto x = pixel_values.to(w.device(), w.scalar_type());
  const int64_t b = x.size(0);
  auto patches = at::conv2d(x, v.embeddings->patch_embedding->weight, {}, c.patch_size).flatten(2).transpose(1, 2);
  auto h = torch::cat({v.embeddings->class_embedding.expand({b, 1, c.hidden_size}), patches}, 1) +
           v.embeddings->position_embedding->weight;
  std::vector<at::Tensor> out{im.norm(*v.pre_layrnorm, h)};
  const int64_t n = layers < 0 ? c.num_hidden_layers : std::min<int64_t>(layers, c.num_hidden_layers);
  for (int64_t i = 0; i < n; i++) out.push_back(im.layer(*v.layers[i], out.back()));
  return out;
}

at::Tensor ClipVisionEncoder::penultimate_hidden_states(const at::Tensor &pixel_values) const {
  return hidden_states(pixel_values, im_->config.num_hidden_layers - 1).back();
}

at::Tensor ClipVisionEncoder::pooled(const at::Tensor &last_hidden_state) const {
  torch::NoGradGuard ng;
  return im_->norm(*im_->vision->post_layernorm, last_hidden_state.select(1, 0));
}

at::Tensor ClipVisionEncoder::image_embeds(const at::Tensor &pooled) const {
  if (!im_->visual_projection) throw std::runtime_error("this image encoder (" + im_->config.class_name + ") has no visual_projection");
  torch::NoGradGuard ng;
  return im_->visual_projection->linear(pooled);
}

}  // namespace videotrain::models
