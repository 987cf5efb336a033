/* videotrain-model: checks and converts model folders (diffusers transformer and VAE folders,
 * transformers T5 / umT5 encoder folders) and shows the samplers' numbers.
 *
 *   videotrain-model info DIR|LORA.safetensors|CONFIG.json   (a Wan config.json: parameters and memory only)
 *   videotrain-model forward DIR IN.safetensors OUT.safetensors [--backward] [--dtype float32|bfloat16]
 *                    [--device cpu|cuda:N] [--checkpointing [full|selective]] [--lora FILE]
 *                    [--attention-backend auto|flash|cudnn|efficient|math]
 *   videotrain-model vae encode|decode DIR IN.safetensors OUT.safetensors [--device D] [--dtype T]
 *   videotrain-model scheduler euler|unipc|ddim|dpm OUT.safetensors [--steps N] [--shift S] [--in IN] [--seed N]
 *   videotrain-model timesteps (--ids I,J,.. [--seed N] [--epoch E] | --draws X,Y,..) [--sampling S] [--logit-mean M]
 *                    [--logit-std S] [--mode-scale S] [--flow-shift S] [--range LO,HI] [--weighting W] [--latent CxTxHxW]
 *   videotrain-model export STEP_DIR|CHECKPOINT_DIR OUT_DIR [--dtype bf16|fp16|fp32] [--max-shard-bytes N]
 *                    [--format diffusers|comfyui|kohya]   (a LoRA run's step: its LoRA in that naming)
 *                    [--ema]   (the EMA weights the checkpoint holds, ddptrainsink ema-decay)
 *                    (a two-expert run's step, ddptrainsink model-2: OUT_DIR and OUT_DIR_2)
 *   videotrain-model sample DIR IN OUT --latent CxTxHxW [--model-2 DIR2 [--boundary-ratio B]]
 *                    [--sampler euler|unipc|ddim|dpm] (default: the family's) [--steps N] [--shift S] (flow_shift,
 *                    CogVideoX: snr_shift_scale) [--guidance G] [--guidance-2 G2] [--seed N]   (ddpsampler's loop; IN holds
 *                    prompt_embeds, negative_prompt_embeds; OUT initial_noise, latents_after_step, latents; CogVideoX's
 *                    frames first, padded in front to patch_size_t as its pipelines pad them)
 *                    [--vae DIR] [--image-encoder DIR [--processor DIR]]   (image-to-video: IN's image, last_image)
 *                    [--expand-timesteps]   (Wan 2.2 TI2V: the image's latents as the clean first frame)
 *   videotrain-model init CONFIG.json OUT_DIR [--seed N] [--dtype ...]
 *   videotrain-model lora convert IN OUT --format diffusers|comfyui|kohya
 *   videotrain-model lora merge BASE_DIR LORA OUT_DIR [--dtype bf16|fp16|fp32]
 *
 * The folder's kind comes from its config.json: `_class_name` for diffusers (a transformer, or an
 * AutoencoderKL* VAE: info; vae encode|decode), `architectures` / `model_type` for transformers (T5 /
 * umT5 encoders: info; forward takes input_ids [B, L] and optionally attention_mask [B, L] and gives
 * last_hidden_state [B, L, D] as T5EncoderModel does; CLIP vision encoders: info; forward takes
 * pixel_values [B, C, S, S], or images U8 [N, H, W, 3] with the image processor of --processor DIR or
 * of the image_processor/ beside the folder, and gives hidden_states.<i>, last_hidden_state,
 * pooler_output (image_embeds with a projection; pixel_values for images) as CLIPVisionModel does).
 *
 * forward on a transformer folder: IN holds the class's own inputs in diffusers' layout (Wan: hidden_states [B,C,T,H,W],
 * timestep [B] or [B, tokens], encoder_hidden_states [B,L,D], optionally encoder_attention_mask
 * [B,L] whose zeros zero those rows, as Wan's pipelines pass text; for Wan 2.1 I2V / FLF2V folders
 * (image_dim) also encoder_hidden_states_image [B,N,image_dim], FLF2V [2B,N,image_dim]; CogVideoX: hidden_states
 * [B,F,C,H,W], frames before channels (I2V: the image latents after the noisy ones on C), timestep [B],
 * encoder_hidden_states [B,226,D]: T5's output with no mask, rotary tables computed from the shape;
 * CogVideoX1.5-I2V also optionally ofs [1], 2.0 when absent as the pipeline passes it). OUT gets `output`; with
 * --backward, IN also holds `cotangent` and OUT gets grad.hidden_states, grad.encoder_hidden_states
 * (grad.encoder_hidden_states_image with an image input)
 * and grad.<parameter> of d(sum(output * cotangent)); with --lora FILE (diffusers, ComfyUI or kohya
 * naming) the base is frozen and the gradients are the LoRA tensors', in diffusers/PEFT naming
 * (grad.transformer.blocks.0.attn1.to_q.lora_A.weight), for the tensors as stored. Rotary tables come
 * from the shape. */
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "autocast_guard.h"
#include "first_line.h"
#include "model_tool.h"
#include "models/cogvideox_transformer.h"
#include "models/diffusers_folder.h"
#include "models/layers.h"
#include "models/lora.h"
#include "models/native_model.h"
#include "models/weights_io.h"
#include "regular_file.h"
#include "safetensors.h"

using namespace videotrain;
using namespace videotrain::models;

namespace videotrain::model_tool {

int usage() {
  std::fprintf(stderr,
               "usage: videotrain-model info DIR|LORA.safetensors|CONFIG.json\n"
               "       videotrain-model forward DIR IN.safetensors OUT.safetensors [--backward] "
               "[--dtype float32|bfloat16] [--device cpu|cuda:N] [--checkpointing [full|selective]] [--lora FILE]\n"
               "                 [--attention-backend auto|flash|cudnn|efficient|math] [--processor DIR] (image encoders)\n"
               "       videotrain-model vae encode|decode DIR IN.safetensors OUT.safetensors [--device cpu|cuda:N] "
               "[--dtype float32|bfloat16]\n"
               "       videotrain-model scheduler euler|unipc|ddim|dpm OUT.safetensors [--steps N] [--shift S] "
               "[--in IN.safetensors] [--seed N]\n"
               "       videotrain-model timesteps (--ids I,J,... [--seed N] [--epoch E] | --draws X,Y,...) "
               "[--sampling auto|uniform|logit-normal|mode|shifted] [--logit-mean M] [--logit-std S] [--mode-scale S] "
               "[--flow-shift S] [--range LO,HI] [--weighting none|sigma-sqrt|cosmap] [--latent CxTxHxW]\n"
               "       videotrain-model export STEP_DIR|CHECKPOINT_DIR OUT_DIR [--dtype bf16|fp16|fp32] [--max-shard-bytes N] "
               "[--format diffusers|comfyui|kohya] [--ema]\n"
               "       videotrain-model sample DIR IN OUT --latent CxTxHxW [--model-2 DIR2 [--boundary-ratio B]] "
               "[--sampler euler|unipc|ddim|dpm] [--steps N] [--shift S] [--guidance G] [--guidance-2 G2] [--seed N] "
               "[--vae DIR] [--image-encoder DIR [--processor DIR]] [--expand-timesteps]\n"
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

StoredParams stored_params(const DiffusersFolder &folder, const std::string &skip) {
  StoredParams p;
  for (const auto &[name, e] : folder.tensors) {
    if (name == skip) continue;
    uint64_t n = 1;
    for (int64_t d : e->shape) n *= static_cast<uint64_t>(d);
    p.total += n;
    p.by_dtype[e->dtype].first += n;
    p.by_dtype[e->dtype].second += e->nbytes;
  }
  return p;
}

void print_stored_params(const StoredParams &p) {
  std::printf("parameters: %llu (%.3f B)\n", (unsigned long long)p.total, p.total / 1e9);
  for (const auto &[dt, cb] : p.by_dtype)
    std::printf("  stored %s: %llu parameters, %s\n", dt.c_str(), (unsigned long long)cb.first, human(cb.second).c_str());
}

FolderKind folder_kind(const std::string &dir, std::string *class_name) {
  const std::string path = dir + "/config.json";
  const std::string takes =
      "videotrain-model takes a diffusers transformer or VAE folder, or a transformers T5 / umT5 or CLIP vision "
      "encoder folder";
  std::string text, err;
  if (!read_small_file(path, kMaxConfigBytes, &text, &err)) throw std::runtime_error(err + " (" + takes + ")");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception &e) {
    throw std::runtime_error("'" + path + "' is not JSON: " + first_line(e.what()));
  }
  if (!j.is_object()) throw std::runtime_error("'" + path + "' is not a JSON object");
  if (j.contains("_class_name") && j["_class_name"].is_string()) {
    *class_name = j["_class_name"].get<std::string>();
    return class_name->rfind("AutoencoderKL", 0) == 0 ? FolderKind::Vae : FolderKind::Dit;
  }
  if (j.contains("architectures") || j.contains("model_type")) {
    const auto &a = j.value("architectures", nlohmann::json());
    *class_name = a.is_array() && !a.empty() && a[0].is_string() ? a[0].get<std::string>()
                                                                 : j.value("model_type", std::string("?"));
    if (class_name->rfind("CLIPVision", 0) == 0 || j.value("model_type", nlohmann::json()) == "clip_vision_model")
      return FolderKind::ImageEncoder;  // parse_clip_vision_config names what it does not take
    return FolderKind::TextEncoder;  // parse_t5_config names what it does not take
  }
  throw std::runtime_error("'" + path + "' has neither '_class_name' (diffusers) nor 'architectures' / 'model_type' (transformers): " + takes);
}

at::Tensor input_tensor(const SafetensorsFile &f, const std::string &name, bool required, const std::string &what_to_give) {
  const auto *e = f.find(name);
  if (e) return tensor_of(*e);
  if (!required) return at::Tensor();
  std::string has;
  for (const auto &[k, v] : f.entries()) has += (has.empty() ? "" : ", ") + k;
  throw std::runtime_error("'" + f.path() + "' has no tensor '" + name + "' (it has: " + (has.empty() ? "none" : has) +
                           "); give " + what_to_give);
}

SafetensorsOutTensor output_tensor(const std::string &name, const at::Tensor &t) {
  const auto st = t.scalar_type();
  at::ScalarType dt = st == at::kDouble || st == at::kLong ? st : at::kFloat;
  const auto c = t.detach().to(at::kCPU, dt).contiguous();
  SafetensorsOutTensor o;
  o.name = name;
  o.dtype = dt == at::kDouble ? "F64" : dt == at::kLong ? "I64" : "F32";
  o.shape = c.sizes().vec();
  o.bytes.resize(c.numel() * c10::elementSize(dt));
  if (!o.bytes.empty()) std::memcpy(o.bytes.data(), c.data_ptr(), o.bytes.size());
  return o;
}

void write_outputs(const std::string &path, const std::vector<SafetensorsOutTensor> &out, const std::string &model) {
  std::string err;
  if (!write_safetensors(path, out, {{"format", "pt"}, {"model", model}}, &err)) throw std::runtime_error(err);
  std::printf("wrote %zu tensors to %s\n", out.size(), path.c_str());
}

}  // namespace videotrain::model_tool

using namespace videotrain::model_tool;

namespace {

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
  const StoredParams stored = stored_params(folder);
  const uint64_t params = stored.total;
  torch::NoGradGuard ng;
  auto m = open_dit(dir, torch::kCPU);  // checks the folder strictly
  std::printf("folder: %s\nclass: %s (family %s)\nweights: %s\n", dir.c_str(), m->class_name().c_str(),
              m->family().c_str(), folder.weights_description().c_str());
  std::printf("config: %s", nlohmann::json::parse(folder.config_text).dump(1).c_str());
  std::printf("\n");
  if (m->image_dim()) {
    const bool flf2v = nlohmann::json::parse(folder.config_text).value("pos_embed_seq_len", nlohmann::json()).is_number();
    std::printf("image-to-video (I2V%s): image_dim %lld, forward takes encoder_hidden_states_image; trains on "
                "vaeencoder condition=%s and imageencoder's image_embeds [%d, N, %lld] per sample\n",
                flf2v ? ", FLF2V: each sample's first and last frame" : "", (long long)m->image_dim(),
                flf2v ? "first-last-frame" : "first-frame", flf2v ? 2 : 1, (long long)m->image_dim());
  } else if (m->image_to_video() && m->family() == "cogvideox") {
    const auto cfg = nlohmann::json::parse(m->config_json());
    std::printf("image-to-video (CogVideoX%s I2V: %lld channels of the image latents beside the noisy latents%s); "
                "trains on vaeencoder condition=first-frame\n",
                cfg["patch_size_t"].is_number() ? "1.5" : "", (long long)m->condition_channels(),
                cfg["ofs_embed_dim"].is_number() ? "; forward takes ofs [1], 2.0 when not given, as the pipeline" : "");
  } else if (m->image_to_video()) {
    std::printf("image-to-video (%lld condition channels beside the noisy latents: mask and condition latents, no "
                "image encoder input: Wan 2.2 I2V); trains on vaeencoder condition=first-frame\n",
                (long long)m->condition_channels());
  } else if (models::pipeline_expand_timesteps(dir)) {
    std::printf("text- and image-to-video (Wan 2.2 TI2V: ../model_index.json sets expand_timesteps): trains "
                "image-to-video on vaeencoder condition=first-frame (the first latent frame clean at timestep 0, "
                "left out of the loss), text-to-video without a condition\n");
  }
  print_stored_params(stored);
  std::map<std::string, int> kinds;
  for (const auto &n : m->linear_names()) kinds[pattern_of(n)]++;
  std::printf("LoRA-targetable modules (Linear layers, diffusers names):\n");
  for (const auto &[k, n] : kinds) std::printf("  %s%s\n", k.c_str(), n > 1 ? ("  (x" + std::to_string(n) + ")").c_str() : "");
  // Per-GPU memory for the weights and optimizer (activations: docs/fine-tuning-wan.md, bench/wan_bench).
  ParamCounts counts;
  counts.total = params;
  for (auto &[name, l] : models::linear_modules(m->module())) counts.add_linear(name, l->in_features(), l->out_features());
  {
    std::map<std::string, uint64_t> per_block;  // "blocks.3" -> its parameters
    const std::string prefix = m->block_prefix();
    for (const auto &item : m->module().named_parameters()) {
      const std::string &n = item.key();
      if (n.rfind(prefix, 0) != 0) continue;
      per_block[n.substr(0, n.find('.', prefix.size()))] += static_cast<uint64_t>(item.value().numel());
    }
    for (const auto &[b, n] : per_block) counts.largest_block = std::max(counts.largest_block, n);
  }
  print_memory_table(counts);
  // What each block keeps for backward under gradient checkpointing (self-attention's width: to_q's).
  int64_t width = 0, blocks = 0;
  for (const auto &item : m->module().named_parameters())
    if (item.key().size() >= 17 && item.key().compare(item.key().size() - 17, 17, "attn1.to_q.weight") == 0)
      width = item.value().size(0), blocks++;
  if (width > 0)
    std::printf("gradient checkpointing (ddptrainsink gradient-checkpointing, forward --checkpointing), kept per block "
                "and token at 2 bytes a value (bf16; twice that in float32): true: the block's input, %s; selective: also "
                "self-attention's q, k, v and output (4 x %lld values, plus a float32 log-sum-exp per head from fused "
                "kernels), %s in all; x %lld blocks\n",
                human(2.0 * width).c_str(), (long long)width, human(2.0 * 5 * width).c_str(), (long long)blocks);
  return 0;
}

// A transformer's inputs: what a DiT takes, said when one is missing (say, text-encoder inputs).
at::Tensor entry_tensor(const SafetensorsFile &f, const std::string &name, bool required) {
  return input_tensor(f, name, required,
                      "a transformer's inputs: hidden_states, timestep, encoder_hidden_states (optionally "
                      "encoder_attention_mask; encoder_hidden_states_image for I2V; cotangent with --backward)");
}

void add_out(std::vector<SafetensorsOutTensor> *out, const std::string &name, const at::Tensor &t) {
  if (t.defined()) out->push_back(out_tensor(name, t));
}

int forward(std::vector<std::string> args) {
  const bool backward = flag(args, "--backward");
  // --checkpointing alone is full (as before); --checkpointing full|selective|none names the mode.
  Checkpointing ckpt = Checkpointing::none;
  for (size_t i = 0; i < args.size(); i++)
    if (args[i] == "--checkpointing") {
      const std::string v = i + 1 < args.size() ? args[i + 1] : "";
      const bool named = v == "full" || v == "selective" || v == "none";
      ckpt = v == "selective" ? Checkpointing::selective : v == "none" ? Checkpointing::none : Checkpointing::full;
      args.erase(args.begin() + i, args.begin() + i + (named ? 2 : 1));
      break;
    }
  const std::string dtype = opt(args, "--dtype", "float32"), device_name = opt(args, "--device", "cpu");
  const std::string lora_file = opt(args, "--lora", "");
  const std::string attention = opt(args, "--attention-backend", "auto");
  AttentionBackend backend;
  if (!parse_attention_backend(attention, &backend))
    throw std::runtime_error("--attention-backend " + attention + " is not one of auto, flash, cudnn, efficient, math");
  if (args.size() != 3 || (dtype != "float32" && dtype != "bfloat16")) return usage();
  const c10::Device device(device_name);
  if (std::string why = attention_backend_unavailable(backend, device, dtype == "bfloat16"); !why.empty())
    throw std::runtime_error(why);
  auto m = open_dit(args[0], device);
  m->set_checkpointing(ckpt);
  m->set_attention_backend(backend);
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
  auto image = entry_tensor(*in, "encoder_hidden_states_image", false);
  if (image.defined()) image = image.to(device, torch::kFloat);
  // CogVideoX1.5-I2V's ofs [1] (or [B]); without it the model takes the pipeline's 2.0.
  const auto ofs = entry_tensor(*in, "ofs", false);
  auto *cog = dynamic_cast<CogVideoXTransformerImpl *>(&m->module());
  if (ofs.defined() && !(cog && cog->cfg.ofs_embed_dim))
    throw std::runtime_error("IN holds ofs, an input of CogVideoX1.5-I2V folders (ofs_embed_dim) only");
  auto run = [&] {
    return ofs.defined() ? cog->forward(x, t, text, ofs.to(device, torch::kFloat)) : m->forward_image(x, t, text, image);
  };
  std::vector<SafetensorsOutTensor> out;
  if (!backward) {
    torch::NoGradGuard ng;
    AutocastGuard cast(dtype == "bfloat16", device.is_cuda());
    add_out(&out, "output", run());
  } else {
    x.requires_grad_(true);
    text.requires_grad_(true);
    if (image.defined()) image.requires_grad_(true);
    at::Tensor y;
    {
      AutocastGuard cast(dtype == "bfloat16", device.is_cuda());
      y = run();
    }
    const auto cot = entry_tensor(*in, "cotangent", true).to(device, torch::kFloat);
    if (cot.sizes() != y.sizes()) throw std::runtime_error("cotangent's shape differs from the output's");
    (y.to(torch::kFloat) * cot).sum().backward();
    add_out(&out, "output", y);
    add_out(&out, "grad.hidden_states", x.grad());
    add_out(&out, "grad.encoder_hidden_states", text.grad());
    if (image.defined()) add_out(&out, "grad.encoder_hidden_states_image", image.grad());
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
    if (args.size() != 2) return usage();
    if (format != "diffusers" && format != "comfyui" && format != "kohya") {
      std::fprintf(stderr, "videotrain-model lora convert: %s; the formats are diffusers (PEFT naming, "
                   "pytorch_lora_weights.safetensors), comfyui (the original Wan / CogVideoX naming) and kohya "
                   "(lora_unet_ names with alpha tensors)\n",
                   format.empty() ? "--format is missing" : ("--format " + format + " is not one").c_str());
      return 2;
    }
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
    if (cmd == "info" && args.size() == 1) {
      if (std::filesystem::is_regular_file(args[0]) && std::filesystem::path(args[0]).extension() == ".json")
        return config_info(args[0]);  // a Wan config.json: parameter counts and memory without weights
      if (std::filesystem::is_regular_file(args[0])) return lora_info(args[0]);  // a LoRA file
      std::string cls;
      switch (folder_kind(args[0], &cls)) {
        case FolderKind::TextEncoder: return text_info(args[0]);
        case FolderKind::ImageEncoder: return image_info(args[0]);
        case FolderKind::Vae: return vae_info(args[0]);
        case FolderKind::Dit: return info(args[0]);
      }
    }
    if (cmd == "forward" && !args.empty()) {
      std::string cls;
      const FolderKind kind = folder_kind(args[0], &cls);
      if (kind == FolderKind::TextEncoder) return text_forward(args);
      if (kind == FolderKind::ImageEncoder) return image_forward(args);
      if (kind == FolderKind::Vae)
        throw std::runtime_error("'" + args[0] + "' is a VAE (" + cls + "): use `videotrain-model vae encode|decode " +
                                 args[0] + " IN OUT`");
      return forward(args);
    }
    if (cmd == "vae") return vae_command(args);
    if (cmd == "scheduler") return scheduler_command(args);
    if (cmd == "timesteps") return timesteps_command(args);
    if (cmd == "export") return export_command(args);
    if (cmd == "sample") return sample_command(args);
    if (cmd == "init") return init(args);
    if (cmd == "lora") return lora(args);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "videotrain-model %s: %s\n", cmd.c_str(), first_line(e.what()).c_str());
    return 1;
  }
  return usage();
}
