/* videotrain-model on transformers text-encoder folders (T5EncoderModel, UMT5EncoderModel): info and
 * forward as transformers runs them (input_ids, attention_mask -> last_hidden_state). */
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <stdexcept>

#include "model_tool.h"
#include "models/diffusers_folder.h"
#include "models/t5_encoder.h"
#include "models/weights_io.h"

using namespace videotrain::models;

namespace videotrain::model_tool {

int text_info(const std::string &dir) {
  const T5Config c = T5Encoder::read_config(dir);  // throws naming the key this port does not take
  DiffusersFolder folder;
  std::string err;
  if (!open_diffusers_folder(dir, "model", &folder, &err)) throw std::runtime_error(err);
  // transformers counts a tied tensor once: encoder.embed_tokens is shared.
  const bool tied = folder.tensors.count("shared.weight") != 0;
  const StoredParams stored = stored_params(folder, tied ? "encoder.embed_tokens.weight" : "");
  const uint64_t params = stored.total;
  {
    torch::NoGradGuard ng;
    T5Encoder::open(dir, torch::kCPU, torch::kBFloat16);  // checks every tensor's name and shape
  }
  std::printf("folder: %s\nclass: %s (%s)\nweights: %s\n", dir.c_str(), c.class_name.c_str(),
              c.umt5 ? "umT5: a relative-attention bias in every block" : "T5 v1.1: block 0's relative-attention bias shared",
              folder.weights_description().c_str());
  std::printf("sizes: vocab_size %lld, d_model %lld, num_layers %lld, num_heads %lld, d_kv %lld, d_ff %lld "
              "(gated-gelu), relative attention %lld buckets up to %lld, layer_norm_epsilon %g\n",
              (long long)c.vocab_size, (long long)c.d_model, (long long)c.num_layers, (long long)c.num_heads,
              (long long)c.d_kv, (long long)c.d_ff, (long long)c.relative_attention_num_buckets,
              (long long)c.relative_attention_max_distance, c.layer_norm_epsilon);
  print_stored_params(stored);
  // As transformers' get_memory_footprint(): the weights in the dtype they are run in (no buffers).
  const double p = static_cast<double>(params);
  std::printf("memory of the weights (inference; activations extra): bf16 %s, fp32 %s\n", human(p * 2).c_str(),
              human(p * 4).c_str());
  std::printf("forward: input_ids [B, L] and optionally attention_mask [B, L] -> last_hidden_state [B, L, %lld]\n",
              (long long)c.d_model);
  return 0;
}

int text_forward(std::vector<std::string> args) {
  const std::string dtype = opt(args, "--dtype", "float32"), device_name = opt(args, "--device", "cpu");
  if (flag(args, "--backward"))
    throw std::runtime_error("the text encoder runs inference only: --backward is for transformer folders");
  if (args.size() != 3 || (dtype != "float32" && dtype != "bfloat16")) return usage();
  const std::string give =
      "a text encoder's inputs: input_ids [B, L] (integer token ids) and optionally attention_mask [B, L] "
      "(1 = token, 0 = padding)";
  std::string err;
  auto in = SafetensorsFile::open(args[1], &err);
  if (!in) throw std::runtime_error(err);
  const at::Tensor ids = input_tensor(*in, "input_ids", true, give);
  const at::Tensor mask = input_tensor(*in, "attention_mask", false, give);
  if (at::isFloatingType(ids.scalar_type()))
    throw std::runtime_error("'" + args[1] + "': input_ids is floating point; give integer token ids (I64 or I32)");
  if (ids.dim() != 2) throw std::runtime_error("'" + args[1] + "': input_ids must be [B, L]");
  if (mask.defined() && mask.sizes() != ids.sizes())
    throw std::runtime_error("'" + args[1] + "': attention_mask must have input_ids' shape [B, L]");
  const c10::Device device(device_name);
  torch::NoGradGuard ng;
  auto enc = T5Encoder::open(args[0], device, dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat);
  const at::Tensor h = enc->forward(ids, mask.defined() ? mask.to(torch::kLong) : mask);
  write_outputs(args[2], {output_tensor("last_hidden_state", h)}, args[0]);
  return 0;
}

}  // namespace videotrain::model_tool
