/* videotrain-model: checks and converts the native models' folders (diffusers transformer folders).
 *
 *   videotrain-model info DIR
 *   videotrain-model forward DIR IN.safetensors OUT.safetensors [--backward] [--dtype float32|bfloat16]
 *                    [--device cpu|cuda:N] [--checkpointing] [--lora FILE]
 *   videotrain-model export CHECKPOINT_DIR OUT_DIR [--dtype bf16|fp16|fp32] [--max-shard-bytes N]
 *   videotrain-model init CONFIG.json OUT_DIR [--seed N] [--dtype ...]
 *   videotrain-model lora convert IN OUT --format diffusers|comfyui|kohya
 *   videotrain-model lora merge BASE_DIR LORA OUT_DIR [--dtype bf16|fp16|fp32]
 *
 * forward: IN holds the class's own inputs in diffusers' layout (Wan: hidden_states [B,C,T,H,W],
 * timestep [B] or [B, tokens], encoder_hidden_states [B,L,D], optionally encoder_attention_mask
 * [B,L] whose zeros zero those rows, as Wan's pipelines pass text; CogVideoX: hidden_states
 * [B,F,C,H,W], frames before channels, timestep [B], encoder_hidden_states [B,226,D]: T5's output
 * with no mask, rotary tables computed from the shape). OUT gets `output`; with
 * --backward, IN also holds `cotangent` and OUT gets grad.hidden_states, grad.encoder_hidden_states
 * and grad.<parameter> of d(sum(output * cotangent)); with --lora FILE (diffusers, ComfyUI or kohya
 * naming) the base is frozen and the gradients are the LoRA tensors', in diffusers/PEFT naming
 * (grad.transformer.blocks.0.attn1.to_q.lora_A.weight), for the tensors as stored. Rotary tables come
 * from the shape. */
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "autocast_guard.h"
#include "first_line.h"
#include "models/diffusers_folder.h"
#include "models/layers.h"
#include "models/lora.h"
#include "models/native_model.h"
#include "models/weights_io.h"
#include "regular_file.h"
#include "safetensors.h"

using namespace videotrain;
using namespace videotrain::models;

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: videotrain-model info DIR\n"
               "       videotrain-model forward DIR IN.safetensors OUT.safetensors [--backward] "
               "[--dtype float32|bfloat16] [--device cpu|cuda:N] [--checkpointing] [--lora FILE]\n"
               "       videotrain-model export CHECKPOINT_DIR OUT_DIR [--dtype bf16|fp16|fp32] [--max-shard-bytes N]\n"
               "       videotrain-model init CONFIG.json OUT_DIR [--seed N] [--dtype bf16|fp16|fp32]\n"
               "       videotrain-model lora convert IN OUT --format diffusers|comfyui|kohya\n"
               "       videotrain-model lora merge BASE_DIR LORA OUT_DIR [--dtype bf16|fp16|fp32]\n");
  return 2;
}

std::string opt(std::vector<std::string> &args, const std::string &name, const std::string &def) {
  for (size_t i = 0; i + 1 < args.size(); i++)
    if (args[i] == name) {
      std::string v = args[i + 1];
      args.erase(args.begin() + i, args.begin() + i + 2);
      return v;
    }
  return def;
}

bool flag(std::vector<std::string> &args, const std::string &name) {
  for (size_t i = 0; i < args.size(); i++)
    if (args[i] == name) {
      args.erase(args.begin() + i);
      return true;
    }
  return false;
}

std::string human(double bytes) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  while (bytes >= 1024 && k < 4) bytes /= 1024, k++;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", bytes, u[k]);
  return buf;
}

// blocks.7.attn1.to_q -> blocks.{i}.attn1.to_q, transformer_blocks.7.* (CogVideoX) likewise (one line
// per kind of module).
std::string pattern_of(const std::string &name) {
  std::string out;
  size_t i = 0;
  const size_t at = name.rfind("blocks.", 0) == 0 ? 7 : name.rfind("transformer_blocks.", 0) == 0 ? 19 : 0;
  while (i < name.size()) {
    if (at && i == at && std::isdigit(static_cast<unsigned char>(name[i]))) {
      while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) i++;
      out += "{i}";
    } else {
      out += name[i++];
    }
  }
  return out;
}

int info(const std::string &dir) {
  DiffusersFolder folder;
  std::string err;
  if (!open_diffusers_folder(dir, "diffusion_pytorch_model", &folder, &err)) throw std::runtime_error(err);
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_dtype;  // dtype -> (count, bytes)
  uint64_t params = 0;
  for (const auto &[name, e] : folder.tensors) {
    uint64_t n = 1;
    for (int64_t d : e->shape) n *= static_cast<uint64_t>(d);
    params += n;
    by_dtype[e->dtype].first += n;
    by_dtype[e->dtype].second += e->nbytes;
  }
  torch::NoGradGuard ng;
  auto m = open_dit(dir, torch::kCPU);  // checks the folder strictly
  std::printf("folder: %s\nclass: %s (family %s)\nweights: %s\n", dir.c_str(), m->class_name().c_str(),
              m->family().c_str(), folder.weights_description().c_str());
  std::printf("config: %s", nlohmann::json::parse(folder.config_text).dump(1).c_str());
  std::printf("\nparameters: %llu (%.3f B)\n", (unsigned long long)params, params / 1e9);
  for (const auto &[dt, cb] : by_dtype)
    std::printf("  stored %s: %llu parameters, %s\n", dt.c_str(), (unsigned long long)cb.first, human(cb.second).c_str());
  std::map<std::string, int> kinds;
  for (const auto &n : m->linear_names()) kinds[pattern_of(n)]++;
  std::printf("LoRA-targetable modules (Linear layers, diffusers names):\n");
  for (const auto &[k, n] : kinds) std::printf("  %s%s\n", k.c_str(), n > 1 ? ("  (x" + std::to_string(n) + ")").c_str() : "");
  // Per-GPU memory for the weights and optimizer (activations: README, bench/wan_bench).
  const double p = static_cast<double>(params);
  std::printf("per GPU, before activations (DDP: every rank holds all of it):\n");
  std::printf("  full fine-tune, fp32 master weights + grads + AdamW moments + bf16 autocast copies: %s\n",
              human(p * 18).c_str());
  std::printf("  LoRA over a bf16 base (adapter and its optimizer state negligible): %s\n", human(p * 2).c_str());
  return 0;
}

at::Tensor entry_tensor(const SafetensorsFile &f, const std::string &name, bool required) {
  const auto *e = f.find(name);
  if (!e) {
    if (required) throw std::runtime_error("'" + f.path() + "' has no tensor '" + name + "'");
    return at::Tensor();
  }
  return tensor_of(*e);
}

void add_out(std::vector<SafetensorsOutTensor> *out, const std::string &name, const at::Tensor &t) {
  if (t.defined()) out->push_back(out_tensor(name, t));
}

int forward(std::vector<std::string> args) {
  const bool backward = flag(args, "--backward"), ckpt = flag(args, "--checkpointing");
  const std::string dtype = opt(args, "--dtype", "float32"), device_name = opt(args, "--device", "cpu");
  const std::string lora_file = opt(args, "--lora", "");
  if (args.size() != 3 || (dtype != "float32" && dtype != "bfloat16")) return usage();
  const c10::Device device(device_name);
  auto m = open_dit(args[0], device);
  m->set_gradient_checkpointing(ckpt);
  if (!lora_file.empty()) {  // the base frozen: --backward gives the LoRA tensors' gradients
    for (auto &p : m->module().parameters()) p.set_requires_grad(false);
    const auto lora = read_lora(lora_file, m->module());
    apply_lora(m->module(), lora, true);
    m->module().to(device);
    std::printf("LoRA %s: %s naming, %zu modules, rank %lld\n", lora_file.c_str(), lora.naming.c_str(),
                lora.modules.size(), (long long)lora.rank);
  }
  std::string err;
  auto in = SafetensorsFile::open(args[1], &err);
  if (!in) throw std::runtime_error(err);
  auto x = entry_tensor(*in, "hidden_states", true).to(device, torch::kFloat);
  auto t = entry_tensor(*in, "timestep", true).to(device);
  auto text = entry_tensor(*in, "encoder_hidden_states", true).to(device, torch::kFloat);
  const auto mask = entry_tensor(*in, "encoder_attention_mask", false);
  if (mask.defined()) text = zero_text_padding(text, mask.to(device));
  std::vector<SafetensorsOutTensor> out;
  if (!backward) {
    torch::NoGradGuard ng;
    AutocastGuard cast(dtype == "bfloat16", device.is_cuda());
    add_out(&out, "output", m->forward(x, t, text));
  } else {
    x.requires_grad_(true);
    text.requires_grad_(true);
    at::Tensor y;
    {
      AutocastGuard cast(dtype == "bfloat16", device.is_cuda());
      y = m->forward(x, t, text);
    }
    const auto cot = entry_tensor(*in, "cotangent", true).to(device, torch::kFloat);
    if (cot.sizes() != y.sizes()) throw std::runtime_error("cotangent's shape differs from the output's");
    (y.to(torch::kFloat) * cot).sum().backward();
    add_out(&out, "output", y);
    add_out(&out, "grad.hidden_states", x.grad());
    add_out(&out, "grad.encoder_hidden_states", text.grad());
    if (!lora_file.empty()) {
      for (const auto &[name, t] : lora_parameters(m->module())) add_out(&out, "grad." + name, t.grad());
    } else {
      for (const auto &p : m->module().named_parameters(true))
        if (p.value().requires_grad()) add_out(&out, "grad." + p.key(), p.value().grad());
    }
  }
  if (!write_safetensors(args[2], out, {{"format", "pt"}, {"model", args[0]}}, &err)) throw std::runtime_error(err);
  std::printf("wrote %zu tensors to %s\n", out.size(), args[2].c_str());
  return 0;
}

int export_folder(std::vector<std::string> args) {
  const std::string dtype = opt(args, "--dtype", "bf16");
  const uint64_t shard = std::stoull(opt(args, "--max-shard-bytes", std::to_string(uint64_t(5) << 30)));
  at::ScalarType t;
  if (args.size() != 2 || !parse_save_dtype(dtype, &t) || shard == 0) return usage();
  torch::NoGradGuard ng;
  auto m = open_dit(args[0], torch::kCPU);
  const std::string file = m->save(args[1], t, shard);
  std::printf("exported %s (%s) to %s/%s\n", args[0].c_str(), dtype.c_str(), args[1].c_str(), file.c_str());
  return 0;
}

int init(std::vector<std::string> args) {
  const uint64_t seed = std::stoull(opt(args, "--seed", "0"));
  const std::string dtype = opt(args, "--dtype", "fp32");
  at::ScalarType t;
  if (args.size() != 2 || !parse_save_dtype(dtype, &t)) return usage();
  std::string text, err;
  if (!read_small_file(args[0], kMaxConfigBytes, &text, &err)) throw std::runtime_error(err);
  torch::manual_seed(static_cast<int64_t>(seed & 0x7fffffffffffffffull));
  auto m = build_dit(text, torch::kCPU);
  const std::string file = m->save(args[1], t, uint64_t(5) << 30);
  std::printf("initialised a %s from %s (seed %llu) in %s/%s\n", m->class_name().c_str(), args[0].c_str(),
              (unsigned long long)seed, args[1].c_str(), file.c_str());
  return 0;
}

// convert: any naming in, one out (alpha kept per module; diffusers gets it in the metadata).
// merge: W + (alpha / rank) B A into each module, written as a diffusers folder.
int lora(std::vector<std::string> args) {
  if (args.empty()) return usage();
  const std::string what = args[0];
  args.erase(args.begin());
  if (what == "convert") {
    const std::string format = opt(args, "--format", "");
    if (args.size() != 2 || (format != "diffusers" && format != "comfyui" && format != "kohya")) return usage();
    const auto in = read_lora_file(args[0]);
    write_lora_file(args[1], in, format);
    std::printf("converted %s (%s naming, %zu modules, rank %lld) to %s (%s)\n", args[0].c_str(), in.naming.c_str(),
                in.modules.size(), (long long)in.rank, args[1].c_str(), format.c_str());
    return 0;
  }
  if (what == "merge") {
    const std::string dtype = opt(args, "--dtype", "bf16");
    at::ScalarType t;
    if (args.size() != 3 || !parse_save_dtype(dtype, &t)) return usage();
    torch::NoGradGuard ng;
    auto m = open_dit(args[0], torch::kCPU);
    const auto file = read_lora(args[1], m->module());
    const auto linears = linear_modules(m->module());
    for (const auto &[name, lm] : file.modules)
      linears.at(name)->weight.add_(torch::matmul(lm.b, lm.a) * (file.alpha_of(lm) / static_cast<double>(lm.a.size(0))));
    const std::string out = m->save(args[2], t, uint64_t(5) << 30);
    std::printf("merged %s (%zu modules) into %s: %s/%s (%s)\n", args[1].c_str(), file.modules.size(), args[0].c_str(),
                args[2].c_str(), out.c_str(), dtype.c_str());
    return 0;
  }
  return usage();
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 3) return usage();
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (cmd == "info" && args.size() == 1) return info(args[0]);
    if (cmd == "forward") return forward(args);
    if (cmd == "export") return export_folder(args);
    if (cmd == "init") return init(args);
    if (cmd == "lora") return lora(args);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "videotrain-model %s: %s\n", cmd.c_str(), first_line(e.what()).c_str());
    return 1;
  }
  return usage();
}
