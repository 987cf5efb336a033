/* videotrain-model sample: ddpsampler's loop on a transformer folder (or Wan 2.2 A14B's two experts)
 * from given prompt embeddings and the pipelines' seeded noise, for checks against WanPipeline and
 * CogVideoXPipeline; for an image-to-video folder with --vae (and --image-encoder where it takes image
 * embeddings) the condition is built from IN's image (and last_image) as ddpsampler builds it, for
 * WanImageToVideoPipeline and CogVideoXImageToVideoPipeline. */
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <sstream>

#include "model_tool.h"
#include "models/clip_image_processor.h"
#include "models/clip_vision.h"
#include "models/expert_pair.h"
#include "models/i2v_inputs.h"
#include "models/image_condition.h"
#include "models/native_model.h"
#include "models/samplers.h"
#include "models/vae/cogvideox_encoder.h"
#include "models/vae/vae_encoder.h"

using namespace videotrain::models;

namespace videotrain::model_tool {

int sample_command(std::vector<std::string> args) {
  SamplerOptions so;
  const std::string sampler = opt(args, "--sampler", "");
  so.steps = std::stoi(opt(args, "--steps", "50"));
  so.flow_shift = so.snr_shift_scale = std::stod(opt(args, "--shift", "3"));
  const double guidance = std::stod(opt(args, "--guidance", "5"));
  const std::string g2 = opt(args, "--guidance-2", "");
  const std::string dir2 = opt(args, "--model-2", "");
  double boundary = std::stod(opt(args, "--boundary-ratio", "0"));
  const uint64_t seed = std::stoull(opt(args, "--seed", "42"));
  const std::string latent = opt(args, "--latent", "");
  const std::string vae_dir = opt(args, "--vae", ""), encoder_dir = opt(args, "--image-encoder", "");
  std::string processor_dir = opt(args, "--processor", "");
  const bool expand_flag = flag(args, "--expand-timesteps");
  if (args.size() != 3 || latent.empty()) return usage();
  std::vector<int64_t> shape{1};
  std::stringstream ls(latent);
  for (std::string d; std::getline(ls, d, 'x');) shape.push_back(std::stoll(d));
  if (shape.size() != 5) throw std::invalid_argument("--latent is CxTxHxW, e.g. 4x3x8x12");
  if (!dir2.empty() && boundary == 0) {
    std::string why;
    boundary = pipeline_boundary_ratio(args[0], &why);
    if (boundary == 0) throw std::runtime_error("--model-2: " + why + ": give --boundary-ratio");
  }
  std::string err;
  auto in = SafetensorsFile::open(args[1], &err);
  if (!in) throw std::runtime_error(err);
  const std::string give = "prompt_embeds and negative_prompt_embeds [1, L, D] (zero-padded as Wan's pipelines pass them)";
  const at::Tensor pe = input_tensor(*in, "prompt_embeds", true, give).to(at::kFloat);
  const at::Tensor ne = input_tensor(*in, "negative_prompt_embeds", true, give).to(at::kFloat);
  auto high = open_dit(args[0], torch::kCPU);
  const ModelFamily &family = high->descriptor();
  so.kind = parse_sampler(sampler.empty() ? family.default_sampler : sampler);
  if (family.name != std::string(sampler_family(so.kind)))
    throw std::invalid_argument(args[0] + " is " + family.title + ": its samplers are " + family.samplers);
  const bool frames_first = family.layout == LatentLayout::kFramesFirst;
  // CogVideoX: noise [1, F, C, h, w], F the latent frames padded in front to patch_size_t as the pipeline pads them.
  const int64_t pt = frames_first ? high->temporal_patch() : 1, extra = (pt - shape[2] % pt) % pt;
  const std::vector<int64_t> noise_shape =
      frames_first ? std::vector<int64_t>{1, shape[2] + extra, shape[1], shape[3], shape[4]} : shape;
  // The pipelines' generator: CogVideoX I2V draws its image's posterior from it before the noise.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::unique_ptr<DitModel> low;
  if (!dir2.empty()) low = open_dit(dir2, torch::kCPU);
  // Image-to-video: the condition from IN's image(s) through the VAE, the image embeddings through the encoder.
  ImageInputs image;
  // Wan 2.2 TI2V 5B: the pipeline's expand_timesteps (its model_index.json, or --expand-timesteps).
  const bool expand = expand_flag || pipeline_expand_timesteps(args[0]);
  if (expand) {
    const at::Tensor first = input_tensor(*in, "image", false, "");
    if (first.defined()) {
      if (vae_dir.empty()) throw std::runtime_error("an image for TI2V (expand_timesteps): give --vae DIR");
      auto vae = vae::VaeEncoder::load(vae_dir, torch::kCPU, torch::kFloat);
      const LatentEncode encode = [&](const at::Tensor &v) { return vae->latent(vae->encode(v)); };
      const int64_t sc = vae->spatial_compression();
      image.first_frame = ti2v_first_frame(preprocess_image(first, shape[3] * sc, shape[4] * sc), encode);
    }
  } else if (frames_first && high->condition_channels() > 0) {
    const at::Tensor first = input_tensor(*in, "image", true, "image U8 [H, W, 3] for an image-to-video model");
    if (vae_dir.empty()) throw std::runtime_error(args[0] + " takes an image's latents: give --vae DIR (its VAE)");
    auto vae = vae::CogVideoXEncoder::load(vae_dir, torch::kCPU, torch::kFloat);
    const int64_t sc = vae->spatial_compression();
    const at::Tensor moments = vae->encode(preprocess_image(first, shape[3] * sc, shape[4] * sc).unsqueeze(2));
    const double scale = cogvideox_image_scale(vae->config().scaling_factor, vae->config().invert_scale_latents);
    image.condition = cogvideox_i2v_condition(moments, shape[2], pt, scale, gen);
  } else if (high->condition_channels() > 0 || high->image_dim() > 0) {
    const std::string give_image = "image (and last_image for FLF2V) U8 [H, W, 3] for an image-to-video model";
    const at::Tensor first = input_tensor(*in, "image", true, give_image);
    const at::Tensor last = input_tensor(*in, "last_image", false, give_image);
    if (high->condition_channels() > 0) {
      if (vae_dir.empty()) throw std::runtime_error(args[0] + " takes a condition: give --vae DIR (its VAE)");
      auto vae = vae::VaeEncoder::load(vae_dir, torch::kCPU, torch::kFloat);
      const int64_t sc = vae->spatial_compression(), tc = vae->temporal_compression();
      const int64_t H = shape[3] * sc, W = shape[4] * sc, F = (shape[2] - 1) * tc + 1;
      const LatentEncode encode = [&](const at::Tensor &v) { return vae->latent(vae->encode(v)); };
      image.condition = i2v_condition(preprocess_image(first, H, W),
                                      last.defined() ? preprocess_image(last, H, W) : at::Tensor(), F, tc, encode);
    }
    if (high->image_dim() > 0) {
      if (encoder_dir.empty()) throw std::runtime_error(args[0] + " takes image embeddings: give --image-encoder DIR");
      if (processor_dir.empty()) processor_dir = sibling_image_processor(encoder_dir);
      if (processor_dir.empty()) throw std::runtime_error("no image_processor/ beside " + encoder_dir + ": give --processor DIR");
      auto enc = ClipVisionEncoder::open(encoder_dir, torch::kCPU, torch::kFloat);
      const auto proc = ClipImageProcessor::open(processor_dir);
      std::vector<at::Tensor> imgs{first};
      if (last.defined()) imgs.push_back(last);
      image.image_embeds = i2v_image_embeds(*enc, proc, imgs, torch::kCPU);
    }
  }
  auto s = Sampler::make(so);
  // The pipelines' noise: torch.randn(shape) from the CPU generator seeded with the seed.
  const at::Tensor noise = at::randn(noise_shape, gen, at::TensorOptions(at::kFloat));
  std::vector<at::Tensor> steps;
  auto keep = [&](int, const at::Tensor &x) { steps.push_back(x.clone()); };
  const at::Tensor out = low ? sample_latents_2(*high, *low, boundary, *s, noise, pe, ne, guidance,
                                                g2.empty() ? guidance : std::stod(g2), gen, keep, image)
                             : sample_latents(*high, *s, noise, pe, ne, guidance, gen, keep, image);
  write_outputs(args[2],
                {output_tensor("initial_noise", noise), output_tensor("latents_after_step", torch::stack(steps)),
                 output_tensor("latents", out)},
                args[0]);
  std::printf("sampled %d %s steps%s to %s\n", s->steps(), sampler_name(so.kind),
              low ? (" through two experts (boundary " + std::to_string(boundary) + ")").c_str() : "", args[2].c_str());
  return 0;
}

}  // namespace videotrain::model_tool
