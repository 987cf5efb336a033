/* Wan 2.1 / 2.2 transformer (diffusers' WanTransformer3DModel: text-to-video, and Wan 2.1 I2V /
 * FLF2V's image path), in LibTorch with
 * diffusers' parameter names, so that a diffusers folder loads by name and shape. Read top to
 * bottom as the data flows: config, attention, block, model. Torch TUs only. */
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "layers.h"
#include "model_options.h"
#include "wan_transformer_config.h"

namespace videotrain::models {

// diffusers' WanAttnProcessor takes the context's last 512 rows as text ("the context length of the text
// encoder") and the rows before them as the image's, so an image model needs its text padded to 512.
constexpr int64_t kWanImageModelTextRows = 512;

// Self- or cross-attention with q/k RMS norms across heads (to_q, to_k, to_v, to_out.0, norm_q, norm_k).
// With added_kv_proj_dim (I2V's cross-attention) also add_k_proj, add_v_proj, norm_added_k: the rows
// before the context's last 512 are the image's, attended to on their own and added to the text's.
struct WanAttentionImpl : torch::nn::Module {
  WanAttentionImpl(int64_t dim, int64_t heads, double eps, int64_t added_kv_proj_dim = 0);
  // x [B, S, dim], context [B, L, dim]; rope: rotary_table's [S, 1, head_dim / 2] or undefined
  // (cross-attention).
  at::Tensor forward(const at::Tensor &x, const at::Tensor &context, const at::Tensor &rope);
  // forward's two halves around attention(): q, k, v [B, H, S|L, D] (views of [B, S|L, H, D], as
  // SDPA takes them without a copy); the output projection of o [B, H, S, D].
  std::vector<at::Tensor> qkv(const at::Tensor &x, const at::Tensor &context, const at::Tensor &rope);
  at::Tensor out(const at::Tensor &o);
  int64_t heads;
  AttentionBackend backend = AttentionBackend::automatic;  // set by the transformer's forward
  Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  Linear add_k_proj{nullptr}, add_v_proj{nullptr};
  RMSNorm norm_added_k{nullptr};
  torch::nn::ModuleList to_out;
  RMSNorm norm_q{nullptr}, norm_k{nullptr};
};
TORCH_MODULE(WanAttention);

struct WanBlockImpl : torch::nn::Module {
  explicit WanBlockImpl(const WanConfig &c);
  // x [B, S, dim]; context [B, L, dim] (embedded text); mod [B, 1 or S, 6, dim] (time projection);
  // rope [S, 1, head_dim / 2] (rotary_table).
  at::Tensor forward(const at::Tensor &x, const at::Tensor &context, const at::Tensor &mod, const at::Tensor &rope);
  // forward = tail(x, context, mod, attention(head(x, mod))): head is norm1, modulation and the self-
  // attention's q, k, v; tail the rest (selective checkpointing recomputes these two, not attention).
  std::vector<at::Tensor> head(const at::Tensor &x, const at::Tensor &mod, const at::Tensor &rope);
  at::Tensor tail(const at::Tensor &x, const at::Tensor &context, const at::Tensor &mod, const at::Tensor &o);
  std::vector<at::Tensor> modulation(const at::Tensor &mod);
  LayerNorm32 norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  WanAttention attn1{nullptr}, attn2{nullptr};
  torch::nn::ModuleList ffn_net;  // registered as ffn.net (0: GELU-tanh projection, 2: output)
  at::Tensor scale_shift_table;
};
TORCH_MODULE(WanBlock);

struct WanTransformerImpl : torch::nn::Module {
  explicit WanTransformerImpl(const WanConfig &c);
  // hidden_states [B, C, T, H, W]; timestep [B] or [B, tokens] (Wan 2.2's per-token timesteps, token
  // order t, h, w), any numeric dtype; encoder_hidden_states [B, L, text_dim]; with an image path (and
  // only then) encoder_hidden_states_image [B, N, image_dim], for FLF2V [2B, N, image_dim] (each
  // sample's first then last frame, 2N = pos_embed_seq_len), as diffusers takes them.
  // Returns [B, C_out, T, H, W]. Throws std::invalid_argument naming the input whose shape does not fit.
  at::Tensor forward(const at::Tensor &hidden_states, const at::Tensor &timestep,
                     const at::Tensor &encoder_hidden_states, const at::Tensor &encoder_hidden_states_image = {});
  WanConfig cfg;
  Checkpointing checkpointing = Checkpointing::none;
  BlockHooks *block_hooks = nullptr;  // sharded training's (block_hooks.h); not owned
  AttentionBackend attention_backend = AttentionBackend::automatic;
  torch::nn::Conv3d patch_embedding{nullptr};
  torch::nn::ModuleList blocks;
  Linear proj_out{nullptr};
  at::Tensor scale_shift_table;
  // condition_embedder.{time_embedder.linear_1/2, time_proj, text_embedder.linear_1/2}
  Linear time_1{nullptr}, time_2{nullptr}, time_proj{nullptr}, text_1{nullptr}, text_2{nullptr};
  // condition_embedder.image_embedder.{norm1, ff.net.0.proj, ff.net.2, norm2, pos_embed} (image path only)
  LayerNorm32 image_norm1{nullptr}, image_norm2{nullptr};
  Linear image_1{nullptr}, image_2{nullptr};
  at::Tensor image_pos_embed;

 private:
  // Throws std::invalid_argument unless `image` fits the image path (undefined without one).
  void check_image(const at::Tensor &image, int64_t B) const;
  at::Tensor rope_angles_[3];  // float64 angles [rope_max_seq_len, axis dim / 2] for t, h, w
};
TORCH_MODULE(WanTransformer);

}  // namespace videotrain::models
