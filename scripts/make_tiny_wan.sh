#!/usr/bin/env bash
# A tiny Wan 2.1-layout text-to-video transformer (diffusers folder, seeded weights) for the demo and
# the tests: the real architecture at toy widths (2 heads x 16, 2 layers), made by videotrain-model init.
# Usage: scripts/make_tiny_wan.sh OUT_DIR [--latent-channels 4] [--text-dim 32] [--seed 0] [--build build]
set -euo pipefail
out=${1:?usage: make_tiny_wan.sh OUT_DIR [--latent-channels N] [--text-dim D] [--seed S] [--build DIR]}
shift
channels=4 text=32 seed=0 build=build
while (($#)); do
  case $1 in
    --latent-channels) channels=$2; shift 2 ;;
    --text-dim) text=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "make_tiny_wan.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
cat > "$out/wan-tiny-config.json" <<JSON
{
  "_class_name": "WanTransformer3DModel",
  "added_kv_proj_dim": null,
  "attention_head_dim": 16,
  "cross_attn_norm": true,
  "eps": 1e-06,
  "ffn_dim": 64,
  "freq_dim": 32,
  "image_dim": null,
  "in_channels": $channels,
  "num_attention_heads": 2,
  "num_layers": 2,
  "out_channels": $channels,
  "patch_size": [1, 2, 2],
  "pos_embed_seq_len": null,
  "qk_norm": "rms_norm_across_heads",
  "rope_max_seq_len": 1024,
  "text_dim": $text
}
JSON
"$build/tools/videotrain-model" init "$out/wan-tiny-config.json" "$out" --seed "$seed" --dtype fp32
rm "$out/wan-tiny-config.json"
