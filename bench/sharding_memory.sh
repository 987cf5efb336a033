#!/usr/bin/env bash
# Peak resident memory per rank of ddptrainsink sharding=none|optimizer|full (issue 42), measured on
# the CPU: a Wan transformer of the 1.3B widths (dim 1536, ffn 8960, 12 heads, text 4096) with 4
# layers and random weights, trained 4 AdamW steps by 2 Gloo ranks through pipelines/train-wan.pipeline
# (tiny Wan VAE, a 1-layer umT5 of width 4096 made here). Prints each rank's peak RSS (GNU time's
# maximum resident set) and the ratios to sharding=none, and checks that the three runs export the
# same weights. Usage: bench/sharding_memory.sh [--build build] [--frames 5] [--size 64] [--checkpointing true]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$src/build frames=5 size=64 ck=true
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --frames) frames=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --checkpointing) ck=$2; shift 2 ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
ref=$src/tests/reference
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-shardmem-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain" OMP_NUM_THREADS=1
bash "$src/scripts/make_dataset.sh" "$work/data" 8 >/dev/null
/usr/bin/python3 "$src/scripts/make_text_encoder.py" "$work/te" --captions "$work/data/train.csv" --format umt5 \
  --dim 4096 --layers 1 >/dev/null
/usr/bin/python3 - "$src/examples/models/wan_configs/wan21_t2v_1_3b.json" "$work/wan.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(num_layers=4, in_channels=4, out_channels=4)  # the tiny VAE's 4 latent channels
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
"$build/tools/videotrain-model" init "$work/wan.json" "$work/dit" --seed 1 --dtype fp32 >/dev/null
run() {  # run NAME SHARDING: both ranks under GNU time, peak RSS in KiB into NAME.rss.R
  local port=$((29600 + RANDOM % 2000))
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      /usr/bin/time -f "%M" -o "$work/$1.rss.$r" "$build/tools/videotrain-run" -f "$src/pipelines/train-wan.pipeline" \
      -D DATA="$work/data" -D VAE="$ref/wan_vae/tiny_wan21" -D TOKENIZER="$work/te" -D TEXT_ENCODER="$work/te/text_encoder" \
      -D MAX_LENGTH=32 -D BUCKETS="${size}x${size}" -D FRAME_BUCKETS="$frames" -D FPS=0 -D FRAMES="$frames" \
      -D WIDTH="$size" -D HEIGHT="$size" -D PREFETCH=1 -D BATCH=1 -D MICRO=1 -D STEPS=4 -D RESUME=false \
      -D MODEL="$work/dit" -D CKPT="$work/ck-$1" -D CKPT_EVERY=0 -D LR=1e-4 -D SEED=1 -D LATENT=mode \
      -D CAPTION_DROPOUT=0 -D METRICS="$work/$1.jsonl" -D TIMEOUT=600 -D CHECKPOINTING="$ck" \
      -D EXTRA="save-dtype=fp32 sharding=$2" > "$work/$1.log.$r" 2>&1 &
  done
  wait || { cat "$work/$1.log.0" "$work/$1.log.1"; echo "FAIL: sharding=$2"; exit 1; }
}
for s in none optimizer full; do run "$s" "$s"; done
PYTHONPATH="$src/tests/pipelines" /usr/bin/python3 - "$work" "$frames" "$size" "$ck" <<'PY'
import sys
from st_weights import folder_weights, flat
w, frames, size, ck = sys.argv[1:]
export = lambda s: folder_weights(f"{w}/ck-{s}/transformer")
rss = {s: [int(open(f"{w}/{s}.rss.{r}").read().split()[-1]) / 1024 for r in (0, 1)] for s in ("none", "optimizer", "full")}
ref = export("none")
n = sum(t.numel() for t in ref.values())
base = folder_weights(f"{w}/dit")
moved = max((ref[k] - base[k]).abs().max().item() for k in ref)
assert moved > 0, "training did not change the weights"
print(f"Wan 1.3B widths x 4 layers ({n / 1e6:.1f} M parameters), 2 CPU ranks, {frames} frames {size}x{size}, "
      f"gradient-checkpointing={ck}, 4 AdamW steps (weights moved up to {moved:.2g})")
for s in ("none", "optimizer", "full"):
    e = export(s)
    d = ((flat(e) - flat(ref)).norm() / flat(ref).norm()).item()
    ratio = [a / b for a, b in zip(rss[s], rss["none"])]
    print(f"  sharding={s:9s} peak RSS rank 0 {rss[s][0]:7.0f} MiB, rank 1 {rss[s][1]:7.0f} MiB; "
          f"x{max(ratio):.2f} of none; weights vs none rel L2 {d:.2g}")
PY
