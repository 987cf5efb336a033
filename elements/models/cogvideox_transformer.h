/* CogVideoX transformer (diffusers' CogVideoXTransformer3DModel: CogVideoX-2b, -5b and 1.5-5B layouts
 * and their image-to-video ones, 5b-I2V and 1.5-5B-I2V) in LibTorch with diffusers' parameter names, so that a diffusers folder loads by name
 * and shape. Text and video tokens go through the blocks as one sequence (text first), each half
 * modulated by its own AdaLN-Zero terms. Positions are computed from each input's shape the way
 * diffusers does: the sincos table of CogVideoXPatchEmbed (2b), or the 3D rotary tables
 * CogVideoXPipeline._prepare_rotary_positional_embeddings makes (5b, 1.5). Torch TUs only. */
#pragma once

#include <torch/torch.h>

#include <map>
#include <mutex>
#include <tuple>

#include "cogvideox_transformer_config.h"
#include "layers.h"
#include "model_options.h"

namespace videotrain::models {

// diffusers' CogVideoXLayerNormZero: linear(silu(temb)) -> shift, scale, gate for the video tokens
// and for the text tokens; one LayerNorm (norm) for both.
struct CogVideoXNormZeroImpl : torch::nn::Module {
  CogVideoXNormZeroImpl(int64_t time_dim, int64_t dim, double eps);
  // x [B, L + S, dim] (text first); returns the modulated norm and, through gate, [B, L + S, dim] gates.
  at::Tensor forward(const at::Tensor &x, const at::Tensor &temb, int64_t text_len, at::Tensor *gate);
  // forward's two steps: linear(silu(temb)) [B, 6 dim], and the norm modulated by it (gate may be null).
  at::Tensor modulation(const at::Tensor &temb);
  at::Tensor modulate(const at::Tensor &x, const at::Tensor &mod, int64_t text_len, at::Tensor *gate);
  Linear linear{nullptr};
  LayerNorm32 norm{nullptr};
};
TORCH_MODULE(CogVideoXNormZero);

struct CogVideoXBlockImpl : torch::nn::Module {
  explicit CogVideoXBlockImpl(const CogVideoXConfig &c);
  // x [B, L + S, dim] (text then video); temb [B, time_embed_dim]; rope [L + S, 1, head_dim / 2]
  // (rotary_table's, text rows 1: unturned) or undefined.
  at::Tensor forward(const at::Tensor &x, const at::Tensor &temb, int64_t text_len, const at::Tensor &rope);
  // forward = tail(x, mod1, mod2, attention(q, k, v)) with {q, k, v, mod1, mod2} = head(x, temb): head
  // holds the norms' modulations, norm1 and q, k, v [B, H, L + S, D]; tail the rest (selective
  // checkpointing recomputes these two, not attention).
  std::vector<at::Tensor> head(const at::Tensor &x, const at::Tensor &temb, int64_t text_len, const at::Tensor &rope);
  at::Tensor tail(const at::Tensor &x, const at::Tensor &mod1, const at::Tensor &mod2, int64_t text_len,
                  const at::Tensor &o);
  int64_t heads;
  AttentionBackend backend = AttentionBackend::automatic;  // set by the transformer's forward
  CogVideoXNormZero norm1{nullptr}, norm2{nullptr};
  Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, to_out{nullptr};  // attn1.*
  torch::nn::LayerNorm norm_q{nullptr}, norm_k{nullptr};                 // attn1.norm_q/k over head_dim
  Linear ff_in{nullptr}, ff_out{nullptr};                                 // ff.net.0.proj, ff.net.2
};
TORCH_MODULE(CogVideoXBlock);

struct CogVideoXTransformerImpl : torch::nn::Module {
  explicit CogVideoXTransformerImpl(const CogVideoXConfig &c);
  // hidden_states [B, F, C, H, W] (frames before channels; for 1.5 F a multiple of patch_size_t; for
  // I2V C = 2 C_out: the noisy latents, then the image latents), timestep [B] (any numeric dtype),
  // encoder_hidden_states [B, L, text_embed_dim] (L = max_text_seq_length for the sincos and learned
  // layouts), ofs [1] or [B] for an ofs_embed_dim model (undefined: 2.0, the value CogVideoX1.5-I2V's
  // pipeline and its authors' fine-tuning pass); a model without ofs takes none. Returns [B, F, C_out,
  // H, W]. Throws std::invalid_argument naming the input whose shape does not fit.
  at::Tensor forward(const at::Tensor &hidden_states, const at::Tensor &timestep,
                     const at::Tensor &encoder_hidden_states, const at::Tensor &ofs = {});
  // The rotary tables (cos, sin) [F' h w, head_dim] the pipeline computes for latents of F frames and
  // H x W (F' = F, or ceil(F / patch_size_t) for 1.5); float32 on the CPU.
  std::pair<at::Tensor, at::Tensor> rotary_tables(int64_t frames, int64_t height, int64_t width) const;
  // The sincos table [F h w, dim] CogVideoXPatchEmbed adds to the video tokens (float32, CPU).
  at::Tensor sincos_table(int64_t frames, int64_t height, int64_t width) const;
  CogVideoXConfig cfg;
  Checkpointing checkpointing = Checkpointing::none;
  BlockHooks *block_hooks = nullptr;  // sharded training's (block_hooks.h); not owned
  AttentionBackend attention_backend = AttentionBackend::automatic;
  torch::nn::Conv2d patch_conv{nullptr};  // patch_embed.proj (1.0)
  Linear patch_linear{nullptr};           // patch_embed.proj (1.5)
  Linear text_proj{nullptr}, time_1{nullptr}, time_2{nullptr}, out_mod{nullptr}, proj_out{nullptr};
  Linear ofs_1{nullptr}, ofs_2{nullptr};  // ofs_embedding.linear_1/2 (1.5-I2V)
  // patch_embed.pos_embedding [1, max_text_seq_length + F h w, dim] at the sample size (5b-I2V; a
  // persistent buffer: loaded and saved, not trained, as in diffusers).
  at::Tensor pos_embedding;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm norm_final{nullptr}, out_norm{nullptr};

 private:
  // Position tables by (frames, h, w, device), computed once per bucket shape.
  std::map<std::tuple<int64_t, int64_t, int64_t, std::string>, std::vector<at::Tensor>> positions_;
  std::mutex positions_mutex_;
  std::vector<at::Tensor> positions(int64_t frames, int64_t height, int64_t width, const c10::Device &device);
};
TORCH_MODULE(CogVideoXTransformer);

}  // namespace videotrain::models
