/* LoRA files and their namings: see lora.h. */
#include "lora.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "layers.h"
#include "lora_names.h"
#include "safetensors.h"
#include "weights_io.h"

namespace videotrain::models {

namespace {


at::Tensor to_tensor(const SafetensorsEntry &e, const std::string &path) {
  if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
    throw std::runtime_error("'" + path + "' holds '" + e.name + "' as " + e.dtype + "; LoRA tensors are F32, F16 or BF16");
  return tensor_of(e).to(torch::kFloat);
}


}  // namespace

LoraFile read_lora_file(const std::string &path) {
  std::string err;
  auto f = SafetensorsFile::open(path, &err);
  if (!f) throw std::runtime_error(err);
  LoraFile out;
  out.path = path;
  auto naming = [&](const std::string &n, const std::string &key) {
    if (out.naming.empty()) out.naming = n;
    if (out.naming != n)
      throw std::runtime_error("'" + path + "' mixes namings: '" + key + "' is " + n + ", earlier keys " + out.naming);
  };
  for (const auto &[key, e] : f->entries()) {
    LoraKey k;
    std::string why;
    if (!parse_lora_key(key, &k, &why)) throw std::runtime_error("'" + path + "' key '" + key + "' " + why);
    naming(k.naming, key);
    const std::string &module = k.module;
    const std::string &part = k.part;
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
    if (!lm.a.defined() || !lm.b.defined())
      throw std::runtime_error("'" + path + "' has " + (lm.a.defined() ? "lora_A" : "lora_B") + " for module '" + name +
                               "' but not its " + (lm.a.defined() ? "lora_B" : "lora_A"));
    const int64_t r = lm.a.size(0);
    if (lm.a.dim() != 2 || lm.b.dim() != 2 || lm.b.size(1) != r)
      throw std::runtime_error("'" + path + "' LoRA of module '" + name + "' has A and B whose ranks differ");
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

LoraFile read_lora(const std::string &path, torch::nn::Module &model) {
  LoraFile out = read_lora_file(path);
  const auto targets = linear_modules(model);
  for (const auto &[name, lm] : out.modules) {
    auto it = targets.find(name);
    if (it == targets.end())
      throw std::runtime_error("'" + path + "' has a LoRA for module '" + name + "', which this model does not have: "
                               "a LoRA for another model");
    const LinearImpl *l = it->second;
    if (lm.a.size(1) != l->in_features() || lm.b.size(0) != l->out_features())
      throw std::runtime_error("'" + path + "' LoRA of module '" + name + "' has A " + std::to_string(lm.a.size(0)) +
                               "x" + std::to_string(lm.a.size(1)) + " and B " + std::to_string(lm.b.size(0)) + "x" +
                               std::to_string(lm.b.size(1)) + "; the module maps " + std::to_string(l->in_features()) +
                               " to " + std::to_string(l->out_features()) + " features: a LoRA for another model");
  }
  return out;
}

double LoraFile::alpha_of(const LoraModule &m) const {
  return m.alpha >= 0 ? m.alpha : alpha >= 0 ? alpha : static_cast<double>(m.a.size(0));
}

void write_lora_file(const std::string &path, const LoraFile &lora, const std::string &naming) {
  std::vector<SafetensorsOutTensor> out;
  auto add = [&](const std::string &name, const at::Tensor &t) { out.push_back(out_tensor(name, t)); };
  std::map<std::string, std::string> meta{{"format", "pt"}};
  nlohmann::json targets = nlohmann::json::array(), alpha_pattern = nlohmann::json::object();
  const double global = lora.modules.empty() ? 0 : lora.alpha_of(lora.modules.begin()->second);
  bool cogvideox = false;  // CogVideoX's module names (transformer_blocks.*) stay diffusers' in every naming
  for (const auto &[name, m] : lora.modules) cogvideox = cogvideox || name.rfind("transformer_blocks.", 0) == 0;
  for (const auto &[name, m] : lora.modules) {
    const double a = lora.alpha_of(m);
    if (naming == "diffusers") {
      add("transformer." + name + ".lora_A.weight", m.a);
      add("transformer." + name + ".lora_B.weight", m.b);
      targets.push_back(name);
      if (a != global) alpha_pattern[name] = a;
      continue;
    }
    const std::string down = lora_key(name, naming, cogvideox, LoraPart::kDown);
    if (down.empty()) throw std::runtime_error("module '" + name + "' has no name in the " + naming + " naming");
    add(down, m.a);
    add(lora_key(name, naming, cogvideox, LoraPart::kUp), m.b);
    add(lora_key(name, naming, cogvideox, LoraPart::kAlpha), torch::tensor(a, torch::kFloat).reshape({}));
  }
  if (naming == "diffusers") {
    // PEFT's LoraConfig as diffusers' save_lora_weights stores it (keys prefixed transformer.), so that
    // load_lora_weights takes r and lora_alpha from the file.
    const nlohmann::json cfg = {{"transformer.r", lora.rank}, {"transformer.lora_alpha", global},
                                {"transformer.target_modules", targets}, {"transformer.lora_dropout", 0.0},
                                {"transformer.use_rslora", false}, {"transformer.use_dora", false},
                                {"transformer.bias", "none"}, {"transformer.fan_in_fan_out", false},
                                {"transformer.init_lora_weights", true}, {"transformer.rank_pattern", nlohmann::json::object()},
                                {"transformer.alpha_pattern", alpha_pattern}};
    meta["lora_adapter_metadata"] = cfg.dump(2);
  }
  std::string err;
  if (!write_safetensors(path, out, meta, &err)) throw std::runtime_error(err);
}

LoraFile lora_of(torch::nn::Module &model) {
  LoraFile out;
  for (const auto &[name, l] : linear_modules(model))
    if (l->has_lora()) {
      LoraModule m;
      m.a = l->lora_a;
      m.b = l->lora_b;
      m.alpha = l->lora_scale * static_cast<double>(l->lora_a.size(0));
      out.rank = l->lora_a.size(0);
      out.modules[name] = m;
    }
  return out;
}

void apply_lora(torch::nn::Module &model, const LoraFile &lora, bool trainable) {
  auto targets = linear_modules(model);
  for (const auto &[name, lm] : lora.modules) {
    auto it = targets.find(name);
    if (it == targets.end()) throw std::runtime_error("this model has no module '" + name + "' for the LoRA of " + lora.path);
    LinearImpl *l = it->second;
    l->add_lora(lm.a.size(0), lora.alpha_of(lm) / static_cast<double>(lm.a.size(0)));
    torch::NoGradGuard ng;
    l->lora_a.copy_(lm.a);
    l->lora_b.copy_(lm.b);
    l->lora_a.set_requires_grad(trainable);
    l->lora_b.set_requires_grad(trainable);
  }
}

std::vector<std::pair<std::string, at::Tensor>> lora_parameters(torch::nn::Module &model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto &[name, l] : linear_modules(model))
    if (l->has_lora()) {
      out.emplace_back("transformer." + name + ".lora_A.weight", l->lora_a);
      out.emplace_back("transformer." + name + ".lora_B.weight", l->lora_b);
    }
  return out;
}

}  // namespace videotrain::models
