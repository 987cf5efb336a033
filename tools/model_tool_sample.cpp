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
  // The pipelines' generator (an image-latents condition draws from it before the noise).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::unique_ptr<DitModel> low;
  if (!dir2.empty()) low = open_dit(dir2, torch::kCPU);
  // Image-to-video: the inputs from IN's image(s) as ddpsampler builds them (models::image_inputs).
  // Wan 2.2 TI2V 5B: the pipeline's expand_timesteps (its model_index.json, or --expand-timesteps).
  const bool expand = expand_flag || pipeline_expand_timesteps(args[0]);
  ImagePrompt ip;
  const std::string give_image = "image (and last_image for FLF2V) U8 [H, W, 3] for an image-to-video model";
  const bool i2v = !expand && (high->condition_channels() > 0 || high->image_dim() > 0);
  if (i2v || expand) ip.image = input_tensor(*in, "image", i2v, give_image);
  if (i2v) ip.last_image = input_tensor(*in, "last_image", false, give_image);
  // The video's pixels from the latent size through the VAE's compression.
  std::unique_ptr<vae::VaeEncoder> vae;
  if (!vae_dir.empty() && ip.image.defined()) vae = vae::VaeEncoder::load(vae_dir, torch::kCPU, torch::kFloat);
  const int64_t sc = vae ? vae->spatial_compression() : 1, tc = vae ? vae->temporal_compression() : 1;
  ip.frames = (shape[2] - 1) * tc + 1, ip.height = shape[3] * sc, ip.width = shape[4] * sc;
  ip.latent_frames = shape[2];
  ip.noise_shape = noise_shape;
  std::unique_ptr<ClipVisionEncoder> clip;
  std::unique_ptr<ClipImageProcessor> proc;
  ImageEncoders enc;
  enc.vae = [&](const std::string &why) -> const vae::VaeEncoder & {
    if (!vae) throw std::runtime_error(why + ": give --vae DIR (its VAE)");
    return *vae;
  };
  enc.clip = [&](const std::string &why) {
    if (encoder_dir.empty()) throw std::runtime_error(why + ": give --image-encoder DIR");
    if (processor_dir.empty()) processor_dir = sibling_image_processor(encoder_dir);
    if (processor_dir.empty()) throw std::runtime_error("no image_processor/ beside " + encoder_dir + ": give --processor DIR");
    clip = ClipVisionEncoder::open(encoder_dir, torch::kCPU, torch::kFloat);
    proc = std::make_unique<ClipImageProcessor>(ClipImageProcessor::open(processor_dir));
    return std::pair<const ClipVisionEncoder *, const ClipImageProcessor *>(clip.get(), proc.get());
  };
  ImageWords words;
  words.where = words.model = args[0];
  words.vae = vae_dir;
  words.set_vae = "give --vae";
  words.set_sizes = "give --latent in the VAE's compression";
  words.give_image = "give " + give_image;
  // Before the noise: an image-latents condition draws its posterior from the generator first.
  const ImageInputs image = image_inputs(*high, expand, ip, enc, words, gen, torch::kCPU);
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
