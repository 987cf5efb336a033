#!/usr/bin/env bash
# The main job on a fresh Debian bookworm machine: installs what is missing, builds, makes a
# small dataset and a small random CogVideoX-architecture VAE, and trains the built-in latent
# video diffusion model on 2 CPU ranks for a few dozen steps, then the built-in text-conditioned
# model on caption embeddings from a small text encoder, printing the loss as it goes and where
# the checkpoints are.
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
