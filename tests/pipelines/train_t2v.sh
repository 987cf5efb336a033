#!/usr/bin/env bash
# Text-conditioned training as users run it: pipelines/train-t2v.pipeline (csvvideosrc ! vaeencoder !
# textencoder ! queue ! microbatcher ! ddptrainsink model=builtin:tiny-t2v) on 2 ranks, with a
# validation branch whose textencoder feeds ddpvalsink on both ranks (fast steps: the validators
# join at different steps, and must still validate the same ones). Checks that
#  - the run ends at max-steps although no textencoder batch ever fills (3 clips per rank and epoch,
#    batch-size 8: the held buffers leave on the epoch event, and downstream's EOS must reach the
#    source from there; this hung before),
#  - every step and the validation passes have finite losses, and resume=true continues from the
#    checkpoint (tiny-t2v is rebuilt at start from the checkpoint's text_dim),
#  - a model that takes captions is an error at start when the stream carries embeddings.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-t2v-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
export OMP_NUM_THREADS=1
bash "$src/scripts/make_dataset.sh" "$work/data" 6 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
/usr/bin/python3 "$src/scripts/make_text_encoder.py" "$work/text" --captions "$work/data/train.csv" >/dev/null 2>&1
run() {  # run NAME STEPS RESUME MODEL: 2 ranks of train-t2v.pipeline plus a validation branch
  cat "$src/pipelines/train-t2v.pipeline" - > "$work/$1.pipeline" <<'VAL'
csvvideosrc location=${DATA}/val.csv num-epochs=0 shuffle=false clip-start=center num-frames=${FRAMES} \
    width=${WIDTH} height=${HEIGHT} prefetch=1 \
  ! vaeencoder model=${VAE} latent=mode \
  ! textencoder tokenizer=${TOKENIZER} model=${TEXT_ENCODER} max-length=${MAX_LENGTH} \
  ! queue ! ddpvalsink trainer=trainer every=2 num-shards=1 shard-index=0
VAL
  timeout 240 "$build/tools/videotrain-launch" -n 2 -q -f "$work/$1.pipeline" \
    -D DATA="$work/data" -D VAE="$work/vae" -D TOKENIZER="$work/text/spiece.model" \
    -D TEXT_ENCODER="$work/text/text_encoder.pt" -D MAX_LENGTH=24 -D FRAMES=5 -D WIDTH=32 -D HEIGHT=32 \
    -D PREFETCH=1 -D BATCH=2 -D MICRO=1 -D STEPS="$2" -D RESUME="$3" -D MODEL="$4" -D CKPT="$work/ckpt-$1" \
    -D CKPT_EVERY=100 -D METRICS="$work/$1.jsonl" > "$work/$1.log" 2>&1
}
run t2v 4 false builtin:tiny-t2v || { cat "$work/t2v.log"; echo "FAIL: the 2-rank text-conditioned run did not end (rc $?)"; exit 1; }
run t2v 6 true builtin:tiny-t2v || { cat "$work/t2v.log"; echo "FAIL: the resumed run did not end (rc $?)"; exit 1; }
/usr/bin/python3 - "$work/t2v.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r["step"] for r in rows if r.get("type", "step") == "step" and "loss" in r]
losses = [r["loss"] for r in rows if r.get("type", "step") == "step" and "loss" in r]
vals = [r for r in rows if r.get("type") == "validation"]
assert steps == list(range(1, 7)), f"steps of the first run and its resumption: {steps}"
assert all(math.isfinite(l) for l in losses), f"losses: {losses}"
assert vals and all(math.isfinite(v["loss"]) and v["samples"] > 0 for v in vals), f"validation records: {vals}"
print(f"t2v: steps 1-4 then 5-6 after resume, losses {[round(l, 3) for l in losses]}, "
      f"{len(vals)} validation passes (loss {vals[-1]['loss']:.3f} on {vals[-1]['samples']} samples)")
PY
if run captions 2 false builtin:tiny-unet3d; then
  cat "$work/captions.log"; echo "FAIL: a captions model trained on a stream with text embeddings"; exit 1
fi
grep -q "takes captions.*textencoder" "$work/captions.log" || {
  cat "$work/captions.log"; echo "FAIL: the error does not name the conditioning mismatch"; exit 1; }
if grep -Eq "ddptrainsink-step|^\[rank [0-9]+\] step [0-9]+ \|" "$work/captions.log"; then
  echo "FAIL: the mismatch was found only after training steps"; exit 1
fi
echo "t2v: builtin:tiny-unet3d on a textencoder stream fails at start naming the mismatch"
echo "2 passed, 0 failed"
