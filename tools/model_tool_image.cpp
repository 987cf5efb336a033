/* videotrain-model on transformers image-encoder folders (CLIPVisionModel, CLIPVisionModelWithProjection:
 * Wan 2.1 I2V / FLF2V's image_encoder/): info, and forward as transformers runs it (pixel_values ->
 * hidden_states.<i>, last_hidden_state, pooler_output, image_embeds), optionally from 8-bit images
 * through the image_processor/ folder's CLIPImageProcessor. */
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "model_tool.h"
#include "models/clip_image_processor.h"
#include "models/clip_vision.h"
#include "models/diffusers_folder.h"
#include "models/i2v_inputs.h"
#include "models/weights_io.h"

using namespace videotrain::models;

namespace videotrain::model_tool {

int image_info(const std::string &dir) {
  const ClipVisionConfig c = ClipVisionEncoder::read_config(dir);  // throws naming the key this port does not take
  DiffusersFolder folder;
  std::string err;
  if (!open_diffusers_folder(dir, "model", &folder, &err)) throw std::runtime_error(err);
  const StoredParams stored = stored_params(folder);
  {
    torch::NoGradGuard ng;
    ClipVisionEncoder::open(dir, torch::kCPU, torch::kBFloat16);  // checks every tensor's name and shape
  }
  std::printf("folder: %s\nclass: %s (CLIP vision transformer%s)\nweights: %s\n", dir.c_str(), c.class_name.c_str(),
              c.with_projection ? " with visual_projection" : "", folder.weights_description().c_str());
  std::printf("sizes: hidden_size %lld, num_hidden_layers %lld, num_attention_heads %lld, intermediate_size %lld "
              "(%s), image_size %lld, patch_size %lld: %lld tokens (class + %lldx%lld patches), layer_norm_eps %g%s\n",
              (long long)c.hidden_size, (long long)c.num_hidden_layers, (long long)c.num_attention_heads,
              (long long)c.intermediate_size, c.hidden_act.c_str(), (long long)c.image_size, (long long)c.patch_size,
              (long long)c.num_positions(), (long long)c.grid(), (long long)c.grid(), c.layer_norm_eps,
              c.with_projection ? (", projection_dim " + std::to_string(c.projection_dim)).c_str() : "");
  print_stored_params(stored);
  const double p = static_cast<double>(stored.total);
  std::printf("memory of the weights (inference; activations extra): bf16 %s, fp32 %s\n", human(p * 2).c_str(),
              human(p * 4).c_str());
  std::printf("forward: pixel_values [B, %lld, %lld, %lld] (or images U8 [N, H, W, 3] through the image processor) -> "
              "hidden_states.0..%lld, last_hidden_state [B, %lld, %lld]; Wan 2.1 I2V / FLF2V take hidden_states.%lld\n",
              (long long)c.num_channels, (long long)c.image_size, (long long)c.image_size, (long long)c.num_hidden_layers,
              (long long)c.num_positions(), (long long)c.hidden_size, (long long)c.num_hidden_layers - 1);
  const std::string proc = sibling_image_processor(dir);
  if (!proc.empty()) {
    const ClipImageProcessor processor = ClipImageProcessor::open(proc);  // kept: config() is a reference into it
    const auto &pc = processor.config();
    std::printf("image processor: %s: ", proc.c_str());
    if (!pc.do_resize) std::printf("no resize");
    else if (pc.shortest_edge) std::printf("shortest edge to %lld", (long long)pc.shortest_edge);
    else std::printf("resize to %lldx%lld", (long long)pc.resize_width, (long long)pc.resize_height);
    std::printf(" (%s), %s, %s, %s\n", pc.resample == 3 ? "bicubic" : "bilinear",
                pc.do_center_crop ? ("center crop " + std::to_string(pc.crop_width) + "x" + std::to_string(pc.crop_height)).c_str()
                                  : "no crop",
                pc.do_rescale ? "rescale" : "no rescale", pc.do_normalize ? "normalise by mean/std" : "no normalisation");
  }
  return 0;
}

int image_forward(std::vector<std::string> args) {
  const std::string dtype = opt(args, "--dtype", "float32"), device_name = opt(args, "--device", "cpu");
  std::string proc_dir = opt(args, "--processor", "");
  if (flag(args, "--backward"))
    throw std::runtime_error("the image encoder runs inference only: --backward is for transformer folders");
  if (args.size() != 3 || (dtype != "float32" && dtype != "bfloat16")) return usage();
  const std::string give =
      "an image encoder's input: pixel_values [B, C, S, S] (float, the image processor's output), or images U8 "
      "[N, H, W, 3] (RGB, run through --processor DIR or the image_processor/ beside the encoder)";
  std::string err;
  auto in = SafetensorsFile::open(args[1], &err);
  if (!in) throw std::runtime_error(err);
  at::Tensor pixels = input_tensor(*in, "pixel_values", false, give);
  const at::Tensor images = pixels.defined() ? at::Tensor() : input_tensor(*in, "images", true, give);
  std::vector<SafetensorsOutTensor> out;
  if (images.defined()) {
    if (images.scalar_type() != at::kByte || images.dim() != 4 || images.size(3) != 3)
      throw std::runtime_error("'" + args[1] + "': images must be U8 [N, H, W, 3] (RGB), not " +
                               std::string(c10::toString(images.scalar_type())) + " " + c10::str(images.sizes()));
    if (proc_dir.empty()) proc_dir = sibling_image_processor(args[0]);
    if (proc_dir.empty())
      throw std::runtime_error("images need an image processor: give --processor DIR (a folder with "
                               "preprocessor_config.json, a pipeline's image_processor/)");
    const auto processor = ClipImageProcessor::open(proc_dir);
    std::vector<at::Tensor> each;
    for (int64_t i = 0; i < images.size(0); i++) each.push_back(processor.process(images[i]));
    pixels = torch::stack(each);
    out.push_back(output_tensor("pixel_values", pixels));
  }
  if (!at::isFloatingType(pixels.scalar_type()))
    throw std::runtime_error("'" + args[1] + "': pixel_values must be floating point (the processor's output)");
  torch::NoGradGuard ng;
  auto enc = ClipVisionEncoder::open(args[0], c10::Device(device_name), dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat);
  const auto hs = enc->hidden_states(pixels);
  for (size_t i = 0; i < hs.size(); i++) out.push_back(output_tensor("hidden_states." + std::to_string(i), hs[i]));
  out.push_back(output_tensor("last_hidden_state", hs.back()));
  const auto pooled = enc->pooled(hs.back());
  out.push_back(output_tensor("pooler_output", pooled));
  if (enc->config().with_projection) out.push_back(output_tensor("image_embeds", enc->image_embeds(pooled)));
  write_outputs(args[2], out, args[0]);
  return 0;
}

}  // namespace videotrain::model_tool
