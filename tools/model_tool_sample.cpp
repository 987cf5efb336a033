/* videotrain-model sample: ddpsampler's loop on a transformer folder (or Wan 2.2 A14B's two experts)
 * from given prompt embeddings and the pipelines' seeded noise, for checks against WanPipeline. */
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <sstream>

#include "model_tool.h"
#include "models/expert_pair.h"
#include "models/native_model.h"
#include "models/samplers.h"

using namespace videotrain::models;

namespace videotrain::model_tool {

int sample_command(std::vector<std::string> args) {
  SamplerOptions so;
  so.kind = parse_sampler(opt(args, "--sampler", "unipc"));
  so.steps = std::stoi(opt(args, "--steps", "50"));
  so.flow_shift = std::stod(opt(args, "--shift", "3"));
  const double guidance = std::stod(opt(args, "--guidance", "5"));
  const std::string g2 = opt(args, "--guidance-2", "");
  const std::string dir2 = opt(args, "--model-2", "");
  double boundary = std::stod(opt(args, "--boundary-ratio", "0"));
  const uint64_t seed = std::stoull(opt(args, "--seed", "42"));
  const std::string latent = opt(args, "--latent", "");
  if (args.size() != 3 || latent.empty()) return usage();
  if (std::string(sampler_family(so.kind)) != "wan") throw std::invalid_argument("sample takes Wan's samplers: euler, unipc");
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
  std::unique_ptr<DitModel> low;
  if (!dir2.empty()) low = open_dit(dir2, torch::kCPU);
  auto s = Sampler::make(so);
  // The pipelines' noise: torch.randn(shape) from a CPU generator seeded with the seed.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor noise = at::randn(shape, gen, at::TensorOptions(at::kFloat));
  std::vector<at::Tensor> steps;
  auto keep = [&](int, const at::Tensor &x) { steps.push_back(x.clone()); };
  const at::Tensor out = low ? sample_latents_2(*high, *low, boundary, *s, noise, pe, ne, guidance,
                                                g2.empty() ? guidance : std::stod(g2), gen, keep)
                             : sample_latents(*high, *s, noise, pe, ne, guidance, gen, keep);
  write_outputs(args[2],
                {output_tensor("initial_noise", noise), output_tensor("latents_after_step", torch::stack(steps)),
                 output_tensor("latents", out)},
                args[0]);
  std::printf("sampled %d %s steps%s to %s\n", s->steps(), sampler_name(so.kind),
              low ? (" through two experts (boundary " + std::to_string(boundary) + ")").c_str() : "", args[2].c_str());
  return 0;
}

}  // namespace videotrain::model_tool
