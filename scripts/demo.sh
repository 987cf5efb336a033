#!/usr/bin/env bash
# The main job on a fresh Debian bookworm machine: installs what is missing, builds, makes a
# small dataset and a small random CogVideoX-architecture VAE, and trains the built-in latent
# video diffusion model on 2 CPU ranks for a few dozen steps, then the built-in text-conditioned
# model on caption embeddings from a small text encoder, printing the loss as it goes and where
# the checkpoints are; then a native Wan transformer from a diffusers folder, end to end, with
# sample videos (MP4) of two prompts before and after training.
#   STEPS=60 NPROC=2 bash scripts/demo.sh      (DATA=folder to keep the dataset elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
data=${DATA:-demo-data}
steps=${STEPS:-30}
nproc_=${NPROC:-2}
bash scripts/make_dataset.sh "$data" 12
[[ -f "$data/vae/config.json" ]] || build/tools/videotrain-make-vae "$data/vae" --seed 1 --tiny
ckpt="$data/checkpoints"
rm -rf "$ckpt" "$data/metrics.jsonl"
export GST_PLUGIN_PATH="$PWD/build/plugins/videotrain${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
echo "== training builtin:tiny-unet3d on $nproc_ CPU ranks for $steps steps (pipelines/train.pipeline)"
build/tools/videotrain-launch -n "$nproc_" -q -f pipelines/train.pipeline \
  -D DATA="$data" -D VAE="$data/vae" -D STEPS="$steps" -D CKPT="$ckpt" -D CKPT_EVERY=10 -D LOG_EVERY=1 \
  -D EPOCHS=0 -D METRICS="$data/metrics.jsonl"
loss_report() {  # METRICS_FILE
echo "== loss by step (rank 0, averaged over ranks)"
/usr/bin/python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r for r in rows if r.get("type", "step") == "step" and "loss" in r]
for r in steps:
    print(f"  step {r['step']:4d}  loss {r['loss']:.4f}")
if len(steps) >= 10:
    k = len(steps) // 3
    first = sum(r["loss"] for r in steps[:k]) / k
    last = sum(r["loss"] for r in steps[-k:]) / k
    print(f"  mean loss of the first {k} steps {first:.4f}, of the last {k} steps {last:.4f}"
          f" ({'down' if last < first else 'NOT down'})")
PY
}
loss_report "$data/metrics.jsonl"
echo "== checkpoints in $ckpt:"
ls -1 "$ckpt"

# Text-conditioned: a small T5-shaped tokenizer and encoder (scripts/make_text_encoder.py) give each
# caption's embedding in the pipeline (textencoder), and builtin:tiny-t2v attends to them.
[[ -f "$data/text/text_encoder.pt" ]] ||
  /usr/bin/python3 scripts/make_text_encoder.py "$data/text" --captions "$data/train.csv" 2>/dev/null
ckpt_t2v="$data/checkpoints-t2v"
rm -rf "$ckpt_t2v" "$data/metrics-t2v.jsonl"
echo "== training builtin:tiny-t2v on caption embeddings, $nproc_ CPU ranks, $steps steps (pipelines/train-t2v.pipeline)"
build/tools/videotrain-launch -n "$nproc_" -q -f pipelines/train-t2v.pipeline \
  -D DATA="$data" -D VAE="$data/vae" -D TOKENIZER="$data/text/spiece.model" \
  -D TEXT_ENCODER="$data/text/text_encoder.pt" -D MAX_LENGTH=32 -D STEPS="$steps" -D CKPT="$ckpt_t2v" \
  -D CKPT_EVERY=10 -D LOG_EVERY=1 -D EPOCHS=0 -D METRICS="$data/metrics-t2v.jsonl"
loss_report "$data/metrics-t2v.jsonl"
echo "== checkpoints in $ckpt_t2v:"
ls -1 "$ckpt_t2v"
# A native Wan 2.1 transformer (the real architecture at toy widths, scripts/make_tiny_wan.sh) on a
# tiny Wan 2.1 VAE, trained with Wan's rectified-flow objective through pipelines/train-wan.pipeline;
# the finished run exports a diffusers folder (bf16) that WanTransformer3DModel.from_pretrained loads.
rm -rf "$data/wan-vae"  # made each time: small, and older demo folders lack the decoder vaedecoder needs
build/tools/videotrain-make-vae "$data/wan-vae" --family wan21 --seed 1 --tiny
rm -rf "$data/wan-dit"
bash scripts/make_tiny_wan.sh "$data/wan-dit" --latent-channels 4 --text-dim 32 --seed 1 >/dev/null
ckpt_wan="$data/checkpoints-wan"
rm -rf "$ckpt_wan" "$data/metrics-wan.jsonl"
# Two prompts sampled at the start and at the end (rank i mod N samples prompt i): MP4s to look at.
printf '%s\n' "a person walking on a beach" "a red car driving through a city at night" > "$data/prompts.txt"
rm -rf "$data/samples-wan"
echo "== training a native Wan transformer (diffusers folder $data/wan-dit) on $nproc_ CPU ranks, $steps steps, sampling 2 prompts at start and end (pipelines/train-wan-samples.pipeline)"
build/tools/videotrain-launch -n "$nproc_" -q -f pipelines/train-wan-samples.pipeline \
  -D PROMPTS="$data/prompts.txt" -D SAMPLE_EVERY=0 -D SAMPLE_AT_START=true -D SAMPLE_STEPS=10 \
  -D SAMPLE_FRAMES=9 -D SAMPLE_WIDTH=64 -D SAMPLE_HEIGHT=64 -D SAMPLE_FPS=8 -D SAMPLES="$data/samples-wan" \
  -D DATA="$data" -D VAE="$data/wan-vae" -D MODEL="$data/wan-dit" -D TOKENIZER="$data/text/spiece.model" \
  -D TEXT_ENCODER="$data/text/text_encoder.pt" -D MAX_LENGTH=32 -D BUCKETS=64x64,96x64,64x96 \
  -D FRAME_BUCKETS=9,5 -D FPS=0 -D BATCH=2 -D MICRO=1 -D LR=1e-3 -D STEPS="$steps" -D CKPT="$ckpt_wan" \
  -D CKPT_EVERY=10 -D LOG_EVERY=1 -D EPOCHS=0 -D METRICS="$data/metrics-wan.jsonl"
loss_report "$data/metrics-wan.jsonl"
echo "== checkpoints in $ckpt_wan (transformer/: the exported diffusers folder):"
ls -1 "$ckpt_wan"
build/tools/videotrain-model info "$ckpt_wan/transformer" | sed -n '1,3p;/^parameters/,/stored/p'
echo "== sample videos (step 0 = before training, step $steps = after; H.264 MP4, 9 frames at 64x64):"
find "$data/samples-wan" -name '*.mp4' | sort
