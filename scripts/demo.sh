#!/usr/bin/env bash
# The main job on a fresh Debian bookworm machine: installs what is missing, builds, makes a
# small dataset and a small random CogVideoX-architecture VAE, and trains the built-in latent
# video diffusion model on 2 CPU ranks for a few dozen steps, printing the loss as it goes and
# where the checkpoint is.
#   STEPS=60 NPROC=2 bash scripts/demo.sh      (DATA=folder to keep the dataset elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
data=${DATA:-demo-data}
steps=${STEPS:-30}
nproc_=${NPROC:-2}
bash scripts/make_dataset.sh "$data" 12
[[ -f "$data/vae/config.json" ]] || build/elements/vaeencoder/videotrain-make-vae "$data/vae" --seed 1 --tiny
ckpt="$data/checkpoints"
rm -rf "$ckpt" "$data/metrics.jsonl"
export GST_PLUGIN_PATH="$PWD/build/plugins/videotrain${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
echo "== training builtin:tiny-unet3d on $nproc_ CPU ranks for $steps steps (pipelines/train.pipeline)"
build/tools/videotrain-launch -n "$nproc_" -q -f pipelines/train.pipeline \
  -D DATA="$data" -D VAE="$data/vae" -D STEPS="$steps" -D CKPT="$ckpt" -D CKPT_EVERY=10 -D LOG_EVERY=1 \
  -D EPOCHS=0 -D METRICS="$data/metrics.jsonl"
echo "== loss by step (rank 0, averaged over ranks)"
/usr/bin/python3 - "$data/metrics.jsonl" <<'PY'
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
echo "== checkpoints in $ckpt:"
ls -1 "$ckpt"
