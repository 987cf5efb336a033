#!/usr/bin/env bash
# A tiny CogVideoX transformer (diffusers folder, seeded weights) for the demo and the
# tests: the real architecture of a published layout at toy widths (2 heads x 16, 2 layers), made by
# videotrain-model init. --layout 2b: sincos positions (CogVideoX-2b); 5b: 3D rotary positions
# (CogVideoX-5b); 1.5: rotary with temporal patches of 2 (CogVideoX1.5-5B); 5b-i2v and 1.5-i2v: the
# image-to-video layouts (in_channels twice the latent channels; 5b-i2v learned positions at --sample
# and 49 frames, 1.5-i2v an ofs embedding). --text-len is max_text_seq_length (the sincos and learned
# tables' text rows: the textencoder's max-length must equal it).
# Usage: scripts/make_tiny_cogvideox.sh OUT_DIR [--layout 2b|5b|1.5|5b-i2v|1.5-i2v] [--latent-channels 4] [--text-dim 32]
#          [--text-len 226] [--sample HxW] [--seed 0] [--build build]
set -euo pipefail
out=${1:?usage: make_tiny_cogvideox.sh OUT_DIR [--layout 2b|5b|1.5|5b-i2v|1.5-i2v] [--latent-channels N] [--text-dim D] [--text-len L] [--sample HxW] [--seed S] [--build DIR]}
shift
layout=2b channels=4 text=32 text_len=226 sample=60x90 seed=0 build=build
while (($#)); do
  case $1 in
    --layout) layout=$2; shift 2 ;;
    --latent-channels) channels=$2; shift 2 ;;
    --text-dim) text=$2; shift 2 ;;
    --text-len) text_len=$2; shift 2 ;;
    --sample) sample=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "make_tiny_cogvideox.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
in_channels=$channels learned=false ofs=null
case $layout in
  2b) rotary=false patch_t=null patch_bias=true ;;
  5b) rotary=true patch_t=null patch_bias=true ;;
  1.5) rotary=true patch_t=2 patch_bias=false ;;
  5b-i2v) rotary=true patch_t=null patch_bias=true in_channels=$((2 * channels)) learned=true ;;
  1.5-i2v) rotary=true patch_t=2 patch_bias=false in_channels=$((2 * channels)) ofs=32 ;;
  *) echo "make_tiny_cogvideox.sh: --layout is 2b, 5b, 1.5, 5b-i2v or 1.5-i2v, not $layout" >&2; exit 2 ;;
esac
mkdir -p "$out"
cat > "$out/cogvideox-tiny-config.json" <<JSON
{
  "_class_name": "CogVideoXTransformer3DModel",
  "activation_fn": "gelu-approximate",
  "attention_bias": true,
  "attention_head_dim": 16,
  "dropout": 0.0,
  "flip_sin_to_cos": true,
  "freq_shift": 0,
  "in_channels": $in_channels,
  "max_text_seq_length": $text_len,
  "norm_elementwise_affine": true,
  "norm_eps": 1e-05,
  "num_attention_heads": 2,
  "num_layers": 2,
  "ofs_embed_dim": $ofs,
  "out_channels": $channels,
  "patch_bias": $patch_bias,
  "patch_size": 2,
  "patch_size_t": $patch_t,
  "sample_frames": 49,
  "sample_height": ${sample%x*},
  "sample_width": ${sample#*x},
  "spatial_interpolation_scale": 1.875,
  "temporal_compression_ratio": 4,
  "temporal_interpolation_scale": 1.0,
  "text_embed_dim": $text,
  "time_embed_dim": 32,
  "timestep_activation_fn": "silu",
  "use_learned_positional_embeddings": $learned,
  "use_rotary_positional_embeddings": $rotary
}
JSON
"$build/tools/videotrain-model" init "$out/cogvideox-tiny-config.json" "$out" --seed "$seed" --dtype fp32
rm "$out/cogvideox-tiny-config.json"
