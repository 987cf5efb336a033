/* LoRA files and their namings: see lora.h. */
#include "lora.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <regex>

#include "layers.h"
#include "safetensors.h"

namespace videotrain::models {

namespace {

// diffusers <- original Wan (wan/modules/model.py), the map ComfyUI-format LoRAs use.
const std::pair<const char *, const char *> kWanNames[] = {
    {"attn1.to_q", "self_attn.q"},      {"attn1.to_k", "self_attn.k"},
    {"attn1.to_v", "self_attn.v"},      {"attn1.to_out.0", "self_attn.o"},
    {"attn2.to_q", "cross_attn.q"},     {"attn2.to_k", "cross_attn.k"},
    {"attn2.to_v", "cross_attn.v"},     {"attn2.to_out.0", "cross_attn.o"},
    {"ffn.net.0.proj", "ffn.0"},        {"ffn.net.2", "ffn.2"},
};
const std::pair<const char *, const char *> kWanTop[] = {
    {"condition_embedder.text_embedder.linear_1", "text_embedding.0"},
    {"condition_embedder.text_embedder.linear_2", "text_embedding.2"},
    {"condition_embedder.time_embedder.linear_1", "time_embedding.0"},
    {"condition_embedder.time_embedder.linear_2", "time_embedding.2"},
    {"condition_embedder.time_proj", "time_projection.1"},
    {"proj_out", "head.head"},
};

bool ends_with(const std::string &s, const std::string &t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

at::Tensor to_tensor(const SafetensorsEntry &e, const std::string &path) {
  const auto dt = e.dtype == "F32" ? at::kFloat : e.dtype == "F16" ? at::kHalf : e.dtype == "BF16" ? at::kBFloat16
                  : at::ScalarType::Undefined;
  if (dt == at::ScalarType::Undefined)
    throw std::runtime_error("'" + path + "' holds '" + e.name + "' as " + e.dtype + "; LoRA tensors are F32, F16 or BF16");
  auto t = torch::empty(e.shape, torch::TensorOptions().dtype(dt));
  std::memcpy(t.data_ptr(), e.data, e.nbytes);
  return t.to(torch::kFloat);
}

std::map<std::string, LinearImpl *> linears(torch::nn::Module &model) {
  std::map<std::string, LinearImpl *> out;
  for (const auto &item : model.named_modules("", false))
    if (auto *l = item.value()->as<LinearImpl>()) out[item.key()] = l;
  return out;
}

}  // namespace

std::string wan_original_name(const std::string &name) {
  for (const auto &[d, o] : kWanTop)
    if (name == d) return o;
  static const std::regex block(R"(^blocks\.(\d+)\.(.+)$)");
  std::smatch m;
  if (std::regex_match(name, m, block))
    for (const auto &[d, o] : kWanNames)
      if (m[2] == d) return "blocks." + m[1].str() + "." + o;
  return "";
}

LoraFile read_lora(const std::string &path, torch::nn::Module &model) {
  std::string err;
  auto f = SafetensorsFile::open(path, &err);
  if (!f) throw std::runtime_error(err);
  const auto targets = linears(model);
  // Each naming's module name -> the model's.
  std::map<std::string, std::string> from_original, from_kohya;
  for (const auto &[name, l] : targets) {
    const std::string o = wan_original_name(name);
    if (o.empty()) continue;
    from_original[o] = name;
    std::string k = "lora_unet_" + o;
    for (auto &c : k)
      if (c == '.') c = '_';
    from_kohya[k] = name;
  }
  LoraFile out;
  out.path = path;
  auto naming = [&](const std::string &n, const std::string &key) {
    if (out.naming.empty()) out.naming = n;
    if (out.naming != n)
      throw std::runtime_error("'" + path + "' mixes namings: '" + key + "' is " + n + ", earlier keys " + out.naming);
  };
  for (const auto &[key, e] : f->entries()) {
    std::string stem, part;
    for (const char *suffix : {".lora_A.weight", ".lora_B.weight", ".lora_down.weight", ".lora_up.weight", ".alpha"})
      if (ends_with(key, suffix)) {
        stem = key.substr(0, key.size() - std::strlen(suffix));
        part = suffix;
      }
    if (stem.empty())
      throw std::runtime_error("'" + path + "' key '" + key + "' is not a LoRA tensor (lora_A/lora_B, lora_down/"
                               "lora_up or alpha)");
    std::string module;
    if (stem.rfind("transformer.", 0) == 0 && targets.count(stem.substr(12))) {
      naming("diffusers", key);
      module = stem.substr(12);
    } else if (stem.rfind("diffusion_model.", 0) == 0 && from_original.count(stem.substr(16))) {
      naming("comfyui", key);
      module = from_original[stem.substr(16)];
    } else if (from_kohya.count(stem)) {
      naming("kohya", key);
      module = from_kohya[stem];
    } else {
      throw std::runtime_error("'" + path + "' key '" + key + "' names no Linear module of this model: a LoRA for "
                               "another model, or a naming other than diffusers (transformer.blocks.0.attn1.to_q), "
                               "ComfyUI (diffusion_model.blocks.0.self_attn.q) or kohya (lora_unet_blocks_0_self_attn_q)");
    }
    auto &lm = out.modules[module];
    if (part == ".alpha") {
      if (e.nbytes == 0) throw std::runtime_error("'" + path + "' key '" + key + "' is empty");
      lm.alpha = to_tensor(e, path).flatten()[0].item<double>();
    } else if (part == ".lora_A.weight" || part == ".lora_down.weight") {
      lm.a = to_tensor(e, path);
    } else {
      lm.b = to_tensor(e, path);
    }
  }
  if (out.modules.empty()) throw std::runtime_error("'" + path + "' holds no LoRA tensors");
  for (const auto &[name, lm] : out.modules) {
    const LinearImpl *l = targets.at(name);
    if (!lm.a.defined() || !lm.b.defined())
      throw std::runtime_error("'" + path + "' has " + (lm.a.defined() ? "lora_A" : "lora_B") + " for module '" + name +
                               "' but not its " + (lm.a.defined() ? "lora_B" : "lora_A"));
    const int64_t r = lm.a.size(0);
    if (lm.a.dim() != 2 || lm.b.dim() != 2 || lm.a.size(1) != l->in_features() || lm.b.size(0) != l->out_features() ||
        lm.b.size(1) != r)
      throw std::runtime_error("'" + path + "' LoRA of module '" + name + "' has A " + std::to_string(lm.a.size(0)) +
                               "x" + std::to_string(lm.a.size(1)) + " and B " + std::to_string(lm.b.size(0)) + "x" +
                               std::to_string(lm.b.size(1)) + "; the module maps " + std::to_string(l->in_features()) +
                               " to " + std::to_string(l->out_features()) + " features: a LoRA for another model");
    if (out.rank && r != out.rank)
      throw std::runtime_error("'" + path + "' has rank " + std::to_string(r) + " at module '" + name + "' and rank " +
                               std::to_string(out.rank) + " elsewhere; one rank per file is supported");
    out.rank = r;
  }
  // diffusers keeps r and lora_alpha in the metadata; without them PEFT's loader takes alpha = r.
  const auto md = f->metadata().find("lora_adapter_metadata");
  if (md != f->metadata().end()) {
    const auto j = nlohmann::json::parse(md->second, nullptr, false);
    if (j.is_object() && j.contains("transformer.lora_alpha") && j["transformer.lora_alpha"].is_number())
      out.alpha = j["transformer.lora_alpha"].get<double>();
  }
  return out;
}

void apply_lora(torch::nn::Module &model, const LoraFile &lora, bool trainable) {
  auto targets = linears(model);
  for (const auto &[name, lm] : lora.modules) {
    LinearImpl *l = targets.at(name);
    const double alpha = lm.alpha >= 0 ? lm.alpha : lora.alpha >= 0 ? lora.alpha : static_cast<double>(lora.rank);
    l->add_lora(lm.a.size(0), alpha / static_cast<double>(lm.a.size(0)));
    torch::NoGradGuard ng;
    l->lora_a.copy_(lm.a);
    l->lora_b.copy_(lm.b);
    l->lora_a.set_requires_grad(trainable);
    l->lora_b.set_requires_grad(trainable);
  }
}

std::vector<std::pair<std::string, at::Tensor>> lora_parameters(torch::nn::Module &model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto &[name, l] : linears(model))
    if (l->has_lora()) {
      out.emplace_back("transformer." + name + ".lora_A.weight", l->lora_a);
      out.emplace_back("transformer." + name + ".lora_B.weight", l->lora_b);
    }
  return out;
}

}  // namespace videotrain::models
