/* LoRA files and their namings: see lora.h. */
#include "lora.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iterator>
#include <regex>

#include "layers.h"
#include "lora_names.h"
#include "model_family.h"
#include "safetensors.h"
#include "weights_io.h"

namespace videotrain::models {

namespace {


at::Tensor to_tensor(const SafetensorsEntry &e, const std::string &path) {
  if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
    throw std::runtime_error("'" + path + "' holds '" + e.name + "' as " + e.dtype + "; LoRA tensors are F32, F16 or BF16");
  return tensor_of(e).to(torch::kFloat);
}

const char *const kShapesKey = "videotrain.linear_shapes";

// blocks.7.attn1.to_q -> blocks.{i}.attn1.to_q (transformer_blocks.{i}. likewise): every block of a
// Wan or CogVideoX model has the same Linears.
std::string block_pattern(const std::string &name) {
  for (const auto &f : model_families()) {
    const char *prefix = f.lora_names->block_prefix;
    const size_t n = std::strlen(prefix);
    if (name.compare(0, n, prefix) != 0) continue;
    size_t i = n;
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) i++;
    if (i > n && i < name.size() && name[i] == '.') return std::string(prefix) + "{i}" + name.substr(i);
  }
  return name;
}

// The block index of <prefix>N.* (-1 for a module outside the blocks).
int64_t block_index(const std::string &name, const std::string &prefix) {
  if (name.rfind(prefix, 0) != 0) return -1;
  size_t i = prefix.size();
  int64_t v = 0;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) v = v * 10 + (name[i++] - '0');
  return i > prefix.size() ? v : -1;
}

// The family of a LoRA's modules (diffusers names): a later family of the table when a module or a
// shape of the model's Linears is that family's alone (proj_out is several's), else the first.
const ModelFamily &lora_family(const LoraFile &lora) {
  const auto &all = model_families();
  auto owner = [&](const std::string &name) -> const ModelFamily * {
    const ModelFamily *hit = nullptr;
    for (const auto &f : all)
      if (name.rfind(f.lora_names->block_prefix, 0) == 0 || !lora_original_name(*f.lora_names, name).empty()) {
        if (hit) return nullptr;
        hit = &f;
      }
    return hit;
  };
  for (size_t i = 1; i < all.size(); i++) {
    for (const auto &[name, m] : lora.modules)
      if (owner(name) == &all[i]) return all[i];
    for (const auto &[name, s] : lora.shapes)
      if (owner(name) == &all[i]) return all[i];
  }
  return all.front();
}

// (in, out) of the model's Linear `name`: from the shapes, else from a LoRA module of the same kind.
bool shape_of(const LoraFile &lora, const std::string &name, std::pair<int64_t, int64_t> *out) {
  const std::string p = block_pattern(name);
  auto it = lora.shapes.find(p);
  if (it != lora.shapes.end()) {
    *out = it->second;
    return true;
  }
  for (const auto &[n, m] : lora.modules)
    if (block_pattern(n) == p) {
      *out = {m.a.size(1), m.b.size(0)};
      return true;
    }
  return false;
}

void add_shapes(torch::nn::Module &model, LoraFile *lora) {
  for (const auto &[name, l] : linear_modules(model)) lora->shapes[block_pattern(name)] = {l->in_features(), l->out_features()};
}

std::vector<std::string> module_names(const LoraFile &lora) {
  std::vector<std::string> out;
  for (const auto &[name, m] : lora.modules) out.push_back(name);
  return out;
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
    // NaN or Inf in a factor or an alpha would write NaN weights or outputs without a word: refused here,
    // naming the key (issue 38 item 10).
    const at::Tensor t = to_tensor(e, path);
    if (t.numel() > 0 && !torch::isfinite(t).all().item<bool>())
      throw std::runtime_error("'" + path + "' key '" + key + "' holds NaN or Inf");
    if (part == ".alpha") {
      if (e.nbytes == 0) throw std::runtime_error("'" + path + "' key '" + key + "' is empty");
      lm.alpha = t.flatten()[0].item<double>();
      if (!(lm.alpha > 0) || lm.alpha > 1e6)
        throw std::runtime_error("'" + path + "' key '" + key + "' is alpha " + std::to_string(lm.alpha) +
                                 "; a LoRA's alpha is positive (the scale is alpha / rank)");
    } else if (part == ".lora_A.weight" || part == ".lora_down.weight") {
      if (lm.a.defined())
        throw std::runtime_error("'" + path + "' holds module '" + module + "''s A twice (lora_A and lora_down): '" +
                                 key + "' is the second");
      lm.a = t;
    } else {
      if (lm.b.defined())
        throw std::runtime_error("'" + path + "' holds module '" + module + "''s B twice (lora_B and lora_up): '" +
                                 key + "' is the second");
      lm.b = t;
    }
  }
  if (out.modules.empty()) throw std::runtime_error("'" + path + "' holds no LoRA tensors");
  for (const auto &[name, lm] : out.modules) {
    if (!lm.a.defined() || !lm.b.defined())
      throw std::runtime_error("'" + path + "' has " + (lm.a.defined() ? "lora_A" : "lora_B") + " for module '" + name +
                               "' but not its " + (lm.a.defined() ? "lora_B" : "lora_A"));
    const int64_t r = lm.a.size(0);
    if (lm.a.dim() == 2 && r == 0)
      throw std::runtime_error("'" + path + "' LoRA of module '" + name + "' has rank 0 (no rows in A)");
    if (lm.a.dim() != 2 || lm.b.dim() != 2 || lm.b.size(1) != r)
      throw std::runtime_error("'" + path + "' LoRA of module '" + name + "' has A and B whose ranks differ");
    if (out.rank && r != out.rank)
      throw std::runtime_error("'" + path + "' has rank " + std::to_string(r) + " at module '" + name + "' and rank " +
                               std::to_string(out.rank) + " elsewhere; one rank per file is supported");
    out.rank = r;
  }
  // diffusers keeps PEFT's LoraConfig in the metadata (keys prefixed transformer. by a pipeline's
  // save_lora_weights, bare by a model's save_lora_adapter); without it PEFT's loader takes alpha = r.
  const auto md = f->metadata().find("lora_adapter_metadata");
  if (md != f->metadata().end()) {
    const auto j = nlohmann::json::parse(md->second, nullptr, false);
    auto get = [&](const std::string &k) -> const nlohmann::json * {
      if (!j.is_object()) return nullptr;
      if (j.contains("transformer." + k)) return &j["transformer." + k];
      return j.contains(k) ? &j[k] : nullptr;
    };
    const auto *dora = get("use_dora");
    if (dora && dora->is_boolean() && dora->get<bool>())
      throw std::runtime_error("'" + path + "' is a DoRA adapter (use_dora in its lora_adapter_metadata); LoRA only");
    if (const auto *a = get("lora_alpha"); a && a->is_number()) {
      out.alpha = a->get<double>();
      if (!std::isfinite(out.alpha) || !(out.alpha > 0) || out.alpha > 1e6)
        throw std::runtime_error("'" + path + "' lora_adapter_metadata says lora_alpha " + a->dump() +
                                 "; a LoRA's alpha is positive and finite (the scale is alpha / rank)");
    }
    // PEFT's alpha_pattern: the first pattern that matches the module's name or a dotted tail of it.
    if (const auto *ap = get("alpha_pattern"); ap && ap->is_object())
      for (auto &[name, lm] : out.modules)
        for (auto it = ap->begin(); it != ap->end(); ++it) {
          const std::string pat = it.key();
          const auto &v = it.value();
          bool hit = false;
          try {
            hit = std::regex_match(name, std::regex("(.*\\.)?(" + pat + ")$"));
          } catch (const std::regex_error &) {
            throw std::runtime_error("'" + path + "' alpha_pattern '" + pat + "' is not a regular expression");
          }
          if (hit && v.is_number()) {
            if (!(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
              throw std::runtime_error("'" + path + "' alpha_pattern gives '" + pat + "' alpha " + v.dump() +
                                       "; a LoRA's alpha is positive and finite");
            if (lm.alpha < 0) lm.alpha = v.get<double>();
            break;
          }
        }
    // rsLoRA scales by alpha / sqrt(r): the same as alpha * sqrt(r) / r.
    if (const auto *rs = get("use_rslora"); rs && rs->is_boolean() && rs->get<bool>())
      for (auto &[name, lm] : out.modules) lm.alpha = out.alpha_of(lm) * std::sqrt(static_cast<double>(out.rank));
  }
  const auto shapes = f->metadata().find(kShapesKey);
  if (shapes != f->metadata().end()) {
    const auto j = nlohmann::json::parse(shapes->second, nullptr, false);
    if (j.is_object())
      for (auto it = j.begin(); it != j.end(); ++it) {
        const auto &v = it.value();
        if (v.is_array() && v.size() == 2 && v[0].is_number_integer() && v[1].is_number_integer())
          out.shapes[it.key()] = {v[0].get<int64_t>(), v[1].get<int64_t>()};
      }
  }
  // Finite factors can still overflow float32 once multiplied (3e38 in A and B): refused, naming the module.
  for (const auto &[name, lm] : out.modules) {
    const double scale = out.alpha_of(lm) / static_cast<double>(lm.a.size(0));
    const double bound = lm.a.abs().max().item<double>() * lm.b.abs().max().item<double>() *
                         static_cast<double>(lm.a.size(0)) * scale;
    if (!std::isfinite(bound) || bound > 1e30)
      throw std::runtime_error("'" + path + "' LoRA of module '" + name + "' has factors whose product (up to " +
                               std::to_string(bound) + " a weight) overflows float32 when applied");
  }
  // The zero adapters a naming's loaders required change nothing and cannot train (both factors zero).
  bool any = false;
  for (const auto &[name, lm] : out.modules) any = any || lm.a.count_nonzero().item<int64_t>() || lm.b.count_nonzero().item<int64_t>();
  if (any)
    for (auto it = out.modules.begin(); it != out.modules.end();)
      it = !it->second.a.count_nonzero().item<int64_t>() && !it->second.b.count_nonzero().item<int64_t>()
               ? out.modules.erase(it)
               : std::next(it);
  return out;
}

LoraFile read_lora(const std::string &path, torch::nn::Module &model) {
  LoraFile out = read_lora_file(path);
  add_shapes(model, &out);
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
  const ModelFamily &family = lora_family(lora);
  const std::string why = lora_naming_problem(module_names(lora), naming, family);
  if (!why.empty()) throw std::runtime_error("cannot write '" + path + "' in the " + naming + " naming: " + why);
  std::vector<SafetensorsOutTensor> out;
  auto add = [&](const std::string &name, const at::Tensor &t) { out.push_back(out_tensor(name, t)); };
  std::map<std::string, std::string> meta{{"format", "pt"}};
  if (!lora.shapes.empty()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto &[name, s] : lora.shapes) j[name] = {s.first, s.second};
    meta[kShapesKey] = j.dump();
  }
  nlohmann::json targets = nlohmann::json::array(), alpha_pattern = nlohmann::json::object();
  const double global = lora.modules.empty() ? 0 : lora.alpha_of(lora.modules.begin()->second);
  if (naming == "diffusers") {
    for (const auto &[name, m] : lora.modules) {
      const double a = lora.alpha_of(m);
      add("transformer." + name + ".lora_A.weight", m.a);
      add("transformer." + name + ".lora_B.weight", m.b);
      targets.push_back(name);
      if (a != global) alpha_pattern[name] = a;
    }
    // PEFT's LoraConfig as diffusers' save_lora_weights stores it (keys prefixed transformer.), so that
    // load_lora_weights takes r and lora_alpha from the file.
    const nlohmann::json cfg = {{"transformer.r", lora.rank}, {"transformer.lora_alpha", global},
                                {"transformer.target_modules", targets}, {"transformer.lora_dropout", 0.0},
                                {"transformer.use_rslora", false}, {"transformer.use_dora", false},
                                {"transformer.bias", "none"}, {"transformer.fan_in_fan_out", false},
                                {"transformer.init_lora_weights", true}, {"transformer.rank_pattern", nlohmann::json::object()},
                                {"transformer.alpha_pattern", alpha_pattern}};
    meta["lora_adapter_metadata"] = cfg.dump(2);
  } else {
    // A family whose files load in this naming (lora_naming_problem): what diffusers' converters need.
    const std::string prefix = family.lora_names->block_prefix;
    std::map<std::string, LoraModule> mods;
    for (const auto &[name, m] : lora.modules) {
      LoraModule c = m;
      c.alpha = lora.alpha_of(m);
      mods[name] = c;
    }
    auto pad = [&](const std::string &name, const std::string &need) {
      if (mods.count(name)) return;
      std::pair<int64_t, int64_t> s;
      if (!shape_of(lora, name, &s))
        throw std::runtime_error("cannot write '" + path + "' in the " + naming + " naming: " + need +
                                 ", so the file needs a zero adapter on '" + name +
                                 "', whose size this LoRA does not give (no such module, no " + kShapesKey +
                                 " metadata, which the files our trainer writes carry); write the " +
                                 (naming == "kohya" ? "comfyui or diffusers" : "diffusers") + " naming");
      LoraModule z;
      z.a = torch::zeros({lora.rank, s.first});
      z.b = torch::zeros({s.second, lora.rank});
      z.alpha = static_cast<double>(lora.rank);
      mods[name] = z;
    };
    if (naming == "kohya") {
      int64_t last = -1;
      for (const auto &[name, m] : lora.modules) last = std::max(last, block_index(name, prefix));
      for (int64_t i = 0; i <= last; i++)
        for (const auto &d : lora_block_modules(*family.lora_names))
          pad(prefix + std::to_string(i) + "." + d,
              "diffusers' musubi converter (WanPipeline.load_lora_weights) requires every module of blocks 0 to " +
                  std::to_string(last));
    } else {
      bool block = false;
      for (const auto &[name, m] : lora.modules) block = block || block_index(name, prefix) >= 0;
      if (!block)
        pad(prefix + "0." + family.lora_names->block.front().first,
            "diffusers' converter of the original Wan naming (WanPipeline.load_lora_weights) "
                                   "requires a block module");
    }
    for (const auto &[name, m] : mods) {
      // diffusers' converter of the original naming reads .alpha only in the blocks: fold it in elsewhere.
      const bool fold = naming == "comfyui" && block_index(name, prefix) < 0;
      const double scale = m.alpha / static_cast<double>(m.a.size(0));
      add(lora_key(name, naming, family, LoraPart::kDown), fold && scale != 1.0 ? m.a * scale : m.a);
      add(lora_key(name, naming, family, LoraPart::kUp), m.b);
      if (!fold) add(lora_key(name, naming, family, LoraPart::kAlpha), torch::tensor(m.alpha, torch::kFloat).reshape({}));
    }
  }
  std::string err;
  if (!write_safetensors(path, out, meta, &err)) throw std::runtime_error(err);
}

void check_lora_format(torch::nn::Module &model, const std::string &format) {
  const LoraFile lora = lora_of(model);
  if (format != "all" && format != "diffusers" && format != "comfyui" && format != "kohya")
    throw std::runtime_error("lora-format '" + format + "' is not one of diffusers, comfyui, kohya, all");
  for (const char *n : {"diffusers", "comfyui", "kohya"})
    if (format == n || format == "all") {
      const std::string why = lora_naming_problem(module_names(lora), n, lora_family(lora));
      if (!why.empty())
        throw std::runtime_error("lora-format=" + format + (format == "all" ? std::string(" (") + n + ")" : "") +
                                 " with these lora-targets: " + why);
    }
}

LoraFile lora_of(torch::nn::Module &model) {
  LoraFile out;
  add_shapes(model, &out);
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
