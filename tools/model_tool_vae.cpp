/* videotrain-model on diffusers VAE folders (AutoencoderKLCogVideoX, AutoencoderKLWan 2.1 / 2.2):
 * info, and encode / decode as diffusers' encode() and decode() do, through the same engine and
 * decoder that vaeencoder and vaedecoder run; and the samplers' schedules and steps (ddpsampler's),
 * so that both can be held against diffusers from Python. */
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <stdexcept>

#include "model_tool.h"
#include "models/diffusers_folder.h"
#include "models/samplers.h"
#include "models/schedules.h"
#include "models/vae/vae_decoder.h"
#include "models/weights_io.h"
#include "vaeencoder/vae_engine.h"
#include "vaeencoder/vae_engine_tensors.h"

using namespace videotrain::models;
using namespace videotrain::vae;

namespace videotrain::model_tool {
namespace {

std::unique_ptr<VaeEngine> open_engine(const std::string &dir, const std::string &device, const std::string &dtype) {
  EngineOptions o;
  o.model = dir;
  o.device = device;
  o.dtype = dtype;
  o.latent = LatentKind::Mode;
  o.allow_any_length = true;  // diffusers encodes any length; the caller's clip is its business
  o.tune_malloc = false;
  o.retain_frames = 0;
  std::string err;
  auto e = VaeEngine::create(o, &err);
  if (!e) throw std::runtime_error(err);
  if (!e->native()) throw std::runtime_error("'" + dir + "' is not a VAE folder");
  return e;
}

// encode: IN `sample` [B, 3, T, H, W] in [-1, 1] -> OUT `moments` (latent_dist.parameters: mean and
// log-variance on channels), `mean` (latent_dist.mode()) and `latents` (the mode as the pipelines and
// vaeencoder hand it to the transformer: CogVideoX * scaling_factor, Wan (mean - latents_mean) / latents_std).
int vae_encode(const std::string &dir, const std::string &in_path, const std::string &out_path, const std::string &device,
               const std::string &dtype) {
  std::string err;
  auto in = SafetensorsFile::open(in_path, &err);
  if (!in) throw std::runtime_error(err);
  const at::Tensor x = input_tensor(*in, "sample", true, "a VAE encode's input: sample [B, 3, T, H, W] in [-1, 1]")
                           .to(torch::kFloat);
  if (x.dim() != 5 || x.size(1) != 3)
    throw std::runtime_error("'" + in_path + "': sample must be [B, 3, T, H, W] (RGB video in [-1, 1])");
  auto eng = open_engine(dir, device, dtype);
  const std::string why = eng->check_clip(static_cast<int>(x.size(2)), static_cast<int>(x.size(4)),
                                          static_cast<int>(x.size(3)));
  if (!why.empty()) throw std::runtime_error("'" + in_path + "': " + why);
  std::vector<at::Tensor> moments, latents;
  for (int64_t b = 0; b < x.size(0); b++) {
    const at::Tensor raw = encode_raw(*eng, x.narrow(0, b, 1));
    moments.push_back(raw);
    latents.push_back(latent_from_raw(*eng, raw, 0).unsqueeze(0));
  }
  const at::Tensor m = torch::cat(moments);
  write_outputs(out_path,
                {output_tensor("moments", m), output_tensor("mean", m.narrow(1, 0, m.size(1) / 2)),
                 output_tensor("latents", torch::cat(latents))},
                dir);
  return 0;
}

// decode: IN `latents` [B, C, t, h, w], the decoder's input as diffusers' decode(z) takes it (with
// --normalized: the transformer's latents, denormalized first as the pipelines do) -> OUT `sample`.
int vae_decode(const std::string &dir, const std::string &in_path, const std::string &out_path, const std::string &device,
               const std::string &dtype, bool normalized) {
  std::string err;
  auto in = SafetensorsFile::open(in_path, &err);
  if (!in) throw std::runtime_error(err);
  at::Tensor z = input_tensor(*in, "latents", true, "a VAE decode's input: latents [B, C, t, h, w]").to(torch::kFloat);
  const c10::Device dev(device);
  auto dec = VaeDecoder::load(dir, dev, dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat);
  if (z.dim() != 5 || z.size(1) != dec->latent_channels())
    throw std::runtime_error("'" + in_path + "': latents must be [B, " + std::to_string(dec->latent_channels()) +
                             ", t, h, w] for this VAE");
  torch::NoGradGuard ng;
  z = z.to(dev);
  if (normalized) z = dec->denormalize(z);
  std::vector<at::Tensor> frames;
  for (int64_t b = 0; b < z.size(0); b++) frames.push_back(dec->decode_all(z.narrow(0, b, 1)).cpu());
  write_outputs(out_path, {output_tensor("sample", torch::cat(frames))}, dir);
  return 0;
}

}  // namespace

int vae_info(const std::string &dir) {
  DiffusersFolder folder;
  std::string err;
  if (!open_diffusers_folder(dir, "diffusion_pytorch_model", &folder, &err)) throw std::runtime_error(err);
  uint64_t enc = 0, dec = 0, other = 0, bytes = 0;
  for (const auto &[name, e] : folder.tensors) {
    uint64_t n = 1;
    for (int64_t d : e->shape) n *= static_cast<uint64_t>(d);
    bytes += e->nbytes;
    (name.rfind("encoder.", 0) == 0 || name.rfind("quant_conv.", 0) == 0   ? enc
     : name.rfind("decoder.", 0) == 0 || name.rfind("post_quant_conv.", 0) == 0 ? dec
                                                                                  : other) += n;
  }
  auto eng = open_engine(dir, "cpu", "float32");  // both halves loaded strictly
  auto d = VaeDecoder::load(dir, torch::kCPU, torch::kFloat);
  std::printf("folder: %s\nclass: %s (%s)\nweights: %s (%s)\n", dir.c_str(), folder.class_name.c_str(),
              VaeDecoder::family_name(d->family()), folder.weights_description().c_str(), human(bytes).c_str());
  std::printf("latent channels %d, compression %dx in time and %dx%d in space\n", d->latent_channels(),
              eng->temporal_compression(), eng->spatial_compression(), eng->spatial_compression());
  std::printf("parameters: encoder %llu, decoder %llu%s (%.3f B)\n", (unsigned long long)enc, (unsigned long long)dec,
              other ? (", other " + std::to_string(other)).c_str() : "", (enc + dec + other) / 1e9);
  std::printf("vae encode: sample [B, 3, T, H, W] -> moments, mean, latents; vae decode: latents [B, %d, t, h, w] -> sample\n",
              d->latent_channels());
  return 0;
}

int vae_command(std::vector<std::string> args) {
  const std::string device = opt(args, "--device", "cpu"), dtype = opt(args, "--dtype", "float32");
  const bool normalized = flag(args, "--normalized");
  if (args.size() != 4 || (args[0] != "encode" && args[0] != "decode") ||
      (dtype != "float32" && dtype != "bfloat16"))
    return usage();
  std::string cls;
  if (folder_kind(args[1], &cls) != FolderKind::Vae)
    throw std::runtime_error("'" + args[1] + "' holds a " + cls + ", not a VAE (AutoencoderKL*)");
  if (args[0] == "encode") return vae_encode(args[1], args[2], args[3], device, dtype);
  return vae_decode(args[1], args[2], args[3], device, dtype, normalized);
}

// scheduler KIND OUT: the schedule of N steps (timesteps as the model gets them; flow sigmas;
// CogVideoX's alphas_cumprod); with --in IN (`sample` and `model_outputs` [n, ...], n <= N) also
// `samples` [n + 1, ...]: the start, then each step's result, DPM's noise from a CPU generator
// seeded --seed as the pipelines' torch.Generator.
int scheduler_command(std::vector<std::string> args) {
  SamplerOptions o;
  o.steps = std::stoi(opt(args, "--steps", "50"));
  const double shift = std::stod(opt(args, "--shift", "3"));
  o.flow_shift = o.snr_shift_scale = shift;
  const uint64_t seed = std::stoull(opt(args, "--seed", "0"));
  const std::string in_path = opt(args, "--in", "");
  if (args.size() != 2) return usage();
  o.kind = parse_sampler(args[0]);
  if (o.steps < 1 || o.steps > 1000) throw std::invalid_argument("--steps must be 1..1000");
  auto s = Sampler::make(o);
  const StepSchedule &sch = s->schedule();
  std::vector<SafetensorsOutTensor> out;
  out.push_back(output_tensor(
      "timesteps", at::tensor(sch.timesteps, at::kDouble).to(sch.integer_timesteps ? at::kLong : at::kFloat)));
  if (!sch.sigmas.empty()) out.push_back(output_tensor("sigmas", at::tensor(sch.sigmas, at::kDouble).to(at::kFloat)));
  if (std::string(sampler_family(o.kind)) == "cogvideox")
    out.push_back(output_tensor("alphas_cumprod", at::tensor(cogvideox_alphas_cumprod(shift), at::kDouble)));
  if (!in_path.empty()) {
    std::string err;
    auto in = SafetensorsFile::open(in_path, &err);
    if (!in) throw std::runtime_error(err);
    const std::string give = "a scheduler's inputs: sample [...] and model_outputs [n, ...] (n <= steps)";
    at::Tensor x = input_tensor(*in, "sample", true, give).to(at::kFloat);
    const at::Tensor v = input_tensor(*in, "model_outputs", true, give).to(at::kFloat);
    if (v.dim() != x.dim() + 1 || v.sizes().slice(1) != x.sizes() || v.size(0) > s->steps())
      throw std::runtime_error("'" + in_path + "': model_outputs must be [n, <sample's shape>], n <= --steps");
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    std::vector<at::Tensor> xs{x};
    torch::NoGradGuard ng;
    for (int k = 0; k < v.size(0); k++) xs.push_back(x = s->step(k, v[k], x, gen));
    out.push_back(output_tensor("samples", torch::stack(xs)));
  }
  write_outputs(args[1], out, std::string("scheduler ") + sampler_name(o.kind));
  return 0;
}

}  // namespace videotrain::model_tool
