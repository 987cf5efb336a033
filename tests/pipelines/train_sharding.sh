#!/usr/bin/env bash
# ddptrainsink sharding=optimizer|full (ZeRO-2 / FSDP over the run's c10d group) on a tiny native Wan
# through pipelines/train-wan.pipeline, as train_wan.sh runs it. Checks that
#  - 2 ranks with sharding=optimizer and with sharding=full (gradient accumulation, grad-clip; no, full
#    and selective checkpointing; the last with gather-prefetch=true) train
#    to the weights of 1 rank without sharding (the exported float32 folders, within float rounding),
#  - their checkpoints hold one shard per rank, sealed by one manifest,
#  - sharding=full's step-2 checkpoint resumes on 1 rank without sharding, and a 2-rank optimizer run
#    from a 1-rank checkpoint, reaching the same weights,
#  - every run keeps an EMA (ema-decay; sharded runs: each rank of its slices) whose export
#    (export-ema) equals the 1-rank run's, and whose checkpoint a 1-rank run resumes,
#  - ddpvalsink follows a sharding=full run: its validation losses (raw weights, gathered on every
#    rank at the steps it validates) equal those of the run without sharding, and with weights=ema
#    those of the 1-rank run resumed from the sharded checkpoint,
#  - an optimizer whose state is not per element is refused at start, naming the choice.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
ref=${VIDEOTRAIN_REFERENCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-shard-XXXXXX")
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
export OMP_NUM_THREADS=1
bash "$src/scripts/make_dataset.sh" "$work/data" 8 >/dev/null
bash "$src/scripts/make_tiny_wan.sh" "$work/dit" --latent-channels 4 --text-dim 32 --seed 3 --build "$build" >/dev/null
{ head -5 "$work/data/train.csv"; tail -1 "$work/data/val.csv"; } > "$work/data/val5.csv"  # 5 clips: both ranks validate
# VAL=raw|ema: train-wan.pipeline with a validation branch (every 2 steps, those weights).
cat "$src/pipelines/train-wan.pipeline" - > "$work/val.pipeline" <<'VAL'
csvvideosrc location=${DATA}/val5.csv num-epochs=0 shuffle=false clip-start=center buckets=${BUCKETS} \
    frame-buckets=${FRAME_BUCKETS} fps=${FPS} num-frames=${FRAMES} width=${WIDTH} height=${HEIGHT} prefetch=1 \
  ! vaeencoder model=${VAE} latent=mode \
  ! textencoder tokenizer=${TOKENIZER} model=${TEXT_ENCODER} max-length=${MAX_LENGTH} caption-dropout=0 \
  ! queue ! ddpvalsink trainer=trainer every=2 weights=${VAL}
VAL
run() {  # run NAME RANKS BATCH MICRO STEPS RESUME CKPT [EXTRA ddptrainsink properties]
  local pipeline="$src/pipelines/train-wan.pipeline"
  [ -z "${VAL:-}" ] || pipeline="$work/val.pipeline"
  timeout 300 "$build/tools/videotrain-launch" -n "$2" -q -f "$pipeline" -D VAL="${VAL:-}" \
    -D DATA="$work/data" -D VAE="$ref/wan_vae/tiny_wan21" -D TOKENIZER="$ref/text_encoder/umt5_tiny" \
    -D TEXT_ENCODER="$ref/text_encoder/umt5_tiny" -D MAX_LENGTH=16 -D BUCKETS=32x32 -D FRAME_BUCKETS=5 -D FPS=0 \
    -D FRAMES=5 -D WIDTH=32 -D HEIGHT=32 -D PREFETCH=1 -D BATCH="$3" -D MICRO="$4" -D STEPS="$5" -D RESUME="$6" \
    -D MODEL="$work/dit" -D CKPT="$work/$7" -D CKPT_EVERY=2 -D LR=1e-3 -D SEED=1 -D LATENT=mode \
    -D CAPTION_DROPOUT=0 -D METRICS="$work/$1.jsonl" -D TIMEOUT=120 -D CHECKPOINTING="${CK:-true}" \
    -D EXTRA="save-dtype=fp32 grad-clip=0.05 ema-decay=0.9 export-ema=true ${8:-}" > "$work/$1.log" 2>&1
}
fail() { cat "$work/$1.log"; echo "FAIL: $2"; exit 1; }
VAL=raw run one 1 4 2 4 false ck-one || fail one "the 1-rank run without sharding did not end"
# optimizer without checkpointing (its gradients reduced after the whole backward), full with none
# (raised to true, said so) and with selective (a block's weights gathered for each recomputed segment,
# the next block's gather issued ahead: gather-prefetch=true).
CK=false run opt 2 2 1 4 false ck-opt "sharding=optimizer" || fail opt "the 2-rank sharding=optimizer run did not end"
CK=false VAL=raw run full 2 2 1 4 false ck-full "sharding=full" || fail full "the 2-rank sharding=full run did not end"
CK=selective VAL=ema run fsel 2 2 1 4 false ck-fsel "sharding=full gather-prefetch=true" || fail fsel "the 2-rank sharding=full selective run did not end"
grep -q "gradient-checkpointing=true is used" "$work/full.log" || fail full "sharding=full did not say it recomputes blocks"
for r in opt full; do
  for f in shard-00000.pt shard-00001.pt ema.safetensors manifest.json trainer.json; do
    [ -s "$work/ck-$r/step-00000002/$f" ] || { ls -l "$work/ck-$r/step-00000002"; echo "FAIL: $r's checkpoint has no $f"; exit 1; }
  done
  grep -q "shard-00001.pt" "$work/ck-$r/step-00000002/manifest.json" || { echo "FAIL: the manifest does not seal rank 1's shard"; exit 1; }
done
# sharding=full's step 2 on 1 rank without sharding; a 1-rank step 2 on 2 ranks with sharding=optimizer.
mkdir -p "$work/ck-r1" "$work/ck-r2"
cp -r "$work/ck-full/step-00000002" "$work/ck-r1/"
cp -r "$work/ck-one/step-00000002" "$work/ck-r2/"
VAL=ema run r1 1 4 2 4 true ck-r1 || fail r1 "the 1-rank resume of a sharding=full checkpoint did not end"
grep -q "resum" "$work/r1.log" || fail r1 "the run did not resume"
run r2 2 2 1 4 true ck-r2 "sharding=optimizer" || fail r2 "the 2-rank sharding=optimizer resume of a 1-rank checkpoint did not end"
PYTHONPATH="$src/tests/pipelines" /usr/bin/python3 - "$work" <<'PY'
import sys
from st_weights import weights, flat
w = sys.argv[1]
base = weights(f"{w}/dit/diffusion_pytorch_model.safetensors")
runs = ("one", "opt", "full", "fsel", "r1", "r2")
got = {r: weights(f"{w}/ck-{r}/transformer/diffusion_pytorch_model.safetensors") for r in runs}
ema = {r: weights(f"{w}/ck-{r}/transformer_ema/diffusion_pytorch_model.safetensors") for r in runs}
one = got["one"]
moved = max((one[k] - base[k]).abs().max().item() for k in base)
assert moved > 1e-4, f"training did not change the weights (max change {moved})"
lag = max((ema["one"][k] - one[k]).abs().max().item() for k in one)
assert lag > 1e-5, f"the EMA export equals the weights (max difference {lag})"
out = []
for what, of in (("weights", got), ("EMA", ema)):
    for r in runs[1:]:
        assert sorted(of[r]) == sorted(of["one"]), f"{r} exports other tensors ({what})"
        d = ((flat(of[r]) - flat(of["one"])).norm() / flat(of["one"]).norm()).item()
        worst = max((of[r][k] - of["one"][k]).abs().max().item() for k in one)
        assert d < 1e-6 and worst < 1e-5, f"{r}'s {what}: rel L2 {d}, worst {worst} against 1 rank without sharding"
        out.append(f"{r} {what} rel L2 {d:.2g}")
print(f"sharding: weights moved {moved:.3g}, EMA {lag:.3g} from them; " + "; ".join(out))
PY
# ddpvalsink on sharding=full: the same validation losses as without sharding (raw: full against
# one; weights=ema: fsel against r1, which resumed full's checkpoint and its EMA on 1 rank).
/usr/bin/python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
def val(r):
    rows = [json.loads(l) for l in open(f"{w}/{r}.jsonl") if l.strip()]
    return {v["step"]: v["loss"] for v in rows if v.get("type") == "validation"}
out = []
for a, b in (("full", "one"), ("fsel", "r1")):
    va, vb = val(a), val(b)
    assert 4 in va and 4 in vb, f"no validation of step 4: {a} {va}, {b} {vb}"
    for s in sorted(set(va) & set(vb)):
        assert abs(va[s] - vb[s]) <= 1e-5 * abs(vb[s]), f"step {s}: {a}'s validation loss {va[s]}, {b}'s {vb[s]}"
        out.append(f"{a}/{b} step {s} {va[s]:.6g}/{vb[s]:.6g}")
print("sharding: ddpvalsink on sharding=full: " + "; ".join(out))
PY
# videotrain-model export of a sharded checkpoint-dir writes the run's own export.
"$build/tools/videotrain-model" export "$work/ck-full" "$work/exp-full" --dtype fp32 > "$work/export.log" 2>&1 \
  || { cat "$work/export.log"; echo "FAIL: export of a sharded checkpoint-dir"; exit 1; }
grep -q "from the shards of 2 ranks, sharding=full" "$work/export.log" || { cat "$work/export.log"; echo "FAIL: export did not read the shards"; exit 1; }
cmp "$work/exp-full/diffusion_pytorch_model.safetensors" "$work/ck-full/transformer/diffusion_pytorch_model.safetensors" \
  || { echo "FAIL: export of the sharded checkpoint-dir differs from the run's export"; exit 1; }
"$build/tools/videotrain-model" export "$work/ck-full" "$work/exp-full-ema" --dtype fp32 --ema > "$work/export.log" 2>&1 \
  || { cat "$work/export.log"; echo "FAIL: export --ema of a sharded checkpoint-dir"; exit 1; }
cmp "$work/exp-full-ema/diffusion_pytorch_model.safetensors" "$work/ck-full/transformer_ema/diffusion_pytorch_model.safetensors" \
  || { echo "FAIL: export --ema of the sharded checkpoint-dir differs from the run's EMA export"; exit 1; }
echo "sharding: export (and --ema) of the sharded checkpoint-dir equals the run's export"
if run bad 2 2 1 1 false ck-bad "sharding=full optimizer=adafactor"; then echo "FAIL: adafactor was sharded"; exit 1; fi
grep -q "sharding=full needs optimizer=adamw or sgd" "$work/bad.log" || fail bad "the refusal does not say why"
echo "sharding: optimizer=adafactor is refused, naming adamw and sgd"
