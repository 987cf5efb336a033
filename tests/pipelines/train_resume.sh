#!/usr/bin/env bash
# Whole pipeline, 2 ranks, plain gst-launch-1.0 pipelines: a run stopped at step 10 and resumed
# with resume=true (nothing else changed) reaches step 20 with the same losses and the same final
# parameters as an uninterrupted run; the checkpoint carries every rank's data position to
# csvvideosrc through the resume query.
# With the argument `buckets`, the source mixes sizes and lengths (4 size buckets, 2 frame buckets; the
# corrupt row is replaced within its bucket): the ranks run equal steps of one shape each, and resume
# stays exact. With `liar`, the same plus a row whose columns lie about its video: num_frames 79
# for 40 frames and 120x40 for 160x120. Epoch 0 finds its length (the stand-ins tried for its
# 9-frame bucket, too short, must not be banned for the run); it moves to the 5-frame bucket from
# epoch 1, its real size shows and it moves to the 32x24 bucket from epoch 2, on both ranks; the run
# resumed in epoch 3 has it there too, from the checkpoint's row facts, and repeats the losses.
set -euo pipefail
mode=${1:-plain}
shape="num-frames=5 width=32 height=32"
if [[ $mode == buckets || $mode == liar ]]; then
  shape="buckets=32x24,32x32,48x24,24x32 frame-buckets=9,5 frame-stride=8"
  export GST_DEBUG=microbatcher:6  # its log names each micro-batch's shape
fi
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-resume-XXXXXX")
trap '[[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 6 >/dev/null
if [[ $mode == liar ]]; then  # clip000 has 40 frames
  # Shifted columns: num_frames 79, height 40, width 120 for a 160x120 video of 40 frames.
  awk -F, 'NR == 2 { $2 = "\"a liar\""; $3 = 79; print }' OFS=, "$work/data/train.csv" >> "$work/data/train.csv"
  grep -q '"a liar",79' "$work/data/train.csv" || { cat "$work/data/train.csv"; echo "no liar row"; exit 1; }
fi
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
half=10
ranks=2 batch=2 quiet=-q
run() {  # run NAME MAX_STEPS RESUME
  "$build/tools/videotrain-launch" -n $ranks $quiet -- gst-launch-1.0 $quiet \
    csvvideosrc location="$work/data/train.csv" $shape num-epochs=0 prefetch=1 seed=5 ! \
    vaeencoder model="$work/vae" ! queue ! microbatcher batch-size=$batch micro-batch-size=1 ! \
    ddptrainsink model=builtin:tiny-unet3d seed=9 max-steps="$2" resume="$3" log-every=1 \
      checkpoint-dir="$work/$1" checkpoint-every=100 metrics-file="$work/$1.jsonl" timeout=60 \
    > "$work/$1.log" 2>&1 || { cat "$work/$1.log"; echo "run $1 failed"; exit 1; }
}
if [[ $mode == ranks ]]; then
  # A 2-rank checkpoint (step 10) resumed on 1 rank with batch-size 4, the same samples per step.
  # Position p of an epoch's order is clip p / 2 of rank p % 2 on 2 ranks and clip p on 1: the
  # resumed rank goes on from the samples both ranks had seen, with the rows the 2-rank run took.
  export GST_DEBUG=csvvideosrc:6
  quiet=  # every rank's log lines, and the trainer's warnings
  run full $((2 * half)) false
  run part "$half" false
  ranks=1 batch=4
  run part $((2 * half)) true
  grep -q "WARNING.*was written by 2 rank(s), this run has 1" "$work/part.log" \
    || { grep -i "warn\|error" "$work/part.log" | grep -v "replacing row" | head; echo "ranks: no warning saying the rank count changed"; exit 1; }
  /usr/bin/python3 - "$work" "$half" <<'PY'
import json, math, re, sys
work, half = sys.argv[1], int(sys.argv[2])
clip_re = re.compile(r"\[rank (\d)\].*clip (\d+) of epoch (\d+): row (\d+)")
def clips(path):
    out = []
    for line in open(path):
        m = clip_re.search(line)
        if m:
            out.append(tuple(int(x) for x in m.groups()))  # rank, clip, epoch, row
    return out
ck = json.load(open(f"{work}/part/{'step-%08d' % half}/trainer.json"))
pos = {p["rank"]: (p["epoch"], p["clip"]) for p in ck["positions"]}
assert ck["world_size"] == 2 and len(pos) == 2, ck["positions"]
epoch = min(e for e, c in pos.values())
seen = 2 * min(c for e, c in pos.values() if e == epoch)
rows = 6
want_epoch, want_clip = (epoch + 1, 0) if seen >= rows else (epoch, seen)
resumed = clips(f"{work}/part.log")[:2]
assert resumed and (resumed[0][2], resumed[0][1]) == (want_epoch, want_clip), \
    f"checkpoint at epoch {epoch}, clips {pos}: the resumed rank starts at {resumed[:1]}, want clip {want_clip} of epoch {want_epoch}"
full = {(r, c, e): row for r, c, e, row in clips(f"{work}/full.log")}
for _, c, e, row in resumed:
    other = full.get((c % 2, c // 2, e))
    assert other == row, f"clip {c} of epoch {e} on 1 rank took row {row}; the 2-rank run took row {other} there"
steps = {}
for line in open(f"{work}/part.jsonl"):
    r = json.loads(line)
    if r.get("type", "step") == "step" and "loss" in r:
        steps[r["step"]] = r["loss"]
assert sorted(steps) == list(range(1, 2 * half + 1)), f"steps {sorted(steps)}"
assert all(math.isfinite(v) for v in steps.values()), steps
print(f"ranks: a 2-rank checkpoint (epoch {epoch}, clips {sorted(pos.items())}) resumed on 1 rank at clip "
      f"{want_clip} of epoch {want_epoch}, the global position, with the 2-rank run's rows; steps {half + 1}..{2 * half}")
PY
  echo "1 passed, 0 failed"
  exit 0
fi
run full $((2 * half)) false
run part "$half" false
run part $((2 * half)) true
/usr/bin/python3 - "$work/full.jsonl" "$work/part.jsonl" "$half" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type", "step") == "step" and "loss" in r:
            out[r["step"]] = r["loss"]
    return out
full, part, half = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
assert sorted(full) == list(range(1, 2 * half + 1)), f"uninterrupted steps: {sorted(full)}"
assert sorted(part) == list(range(1, 2 * half + 1)), f"stopped + resumed steps: {sorted(part)}"
bad = [(s, full[s], part[s]) for s in full if abs(full[s] - part[s]) > 1e-5 * max(1.0, abs(full[s]))]
assert not bad, f"losses differ after resume (step, uninterrupted, resumed): {bad}"
print(f"resume: steps {half + 1}..{2 * half} repeat the uninterrupted run's losses")
PY
if [[ $mode == liar ]]; then
  # Row 6 holds 40 frames (found in epoch 0) of 160x120 (epoch 1); the checkpoints say so.
  for c in part/step-00000010 full/step-00000020 part/step-00000020; do
    /usr/bin/python3 -c 'import json, sys; f = json.load(open(sys.argv[1]))["row_facts"].split("\n")
assert "6 0 40 0 0" in f and "6 1 -1 160 120" in f, f"{sys.argv[1]}: row facts {f}"
assert len(set(f)) == len(f), f"{sys.argv[1]}: row facts repeated {f}"' "$work/$c/trainer.json"
  done
  echo "liar: its length and size are in the checkpoints' row facts; the resumed run moved it as the uninterrupted one"
fi
if [[ $mode == buckets || $mode == liar ]]; then
  shapes=$(grep -ho 'samples \[[0-9, ]*\]' "$work/full.log" | sort -u | wc -l)
  ((shapes >= 3)) || { echo "buckets: the uninterrupted run trained $shapes latent shapes, expected several"; exit 1; }
  echo "buckets: $shapes latent shapes trained"
fi
final=$(printf 'step-%08d' $((2 * half)))
for r in full part; do
  [[ -f $work/$r/$final/model.safetensors ]] || { ls -R "$work/$r"; echo "$r: no final checkpoint $final"; exit 1; }
done
# Final weights, read straight from safetensors (no torch needed): same names, shapes and values.
/usr/bin/python3 - "$work/full/$final/model.safetensors" "$work/part/$final/model.safetensors" <<'PY'
import json, struct, sys
FMT = {"F32": "f", "F64": "d", "I64": "q", "I32": "i"}
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head, data = json.loads(f.read(n)), f.read()
    out = {}
    for name, e in head.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        fmt = FMT[e["dtype"]]
        out[name] = (e["shape"], struct.unpack(f"<{(b - a) // struct.calcsize(fmt)}{fmt}", data[a:b]))
    return out
full, part = tensors(sys.argv[1]), tensors(sys.argv[2])
assert full.keys() == part.keys(), f"parameter names differ: {sorted(full.keys() ^ part.keys())}"
worst, where = 0.0, None
for name, (shape, x) in full.items():
    assert part[name][0] == shape, f"{name}: shape {shape} vs {part[name][0]}"
    # Relative to the tensor's scale, so that entries near zero do not dominate.
    scale = max(max(abs(v) for v in x), 1e-12) if x else 1.0
    diff = max((abs(u - v) for u, v in zip(x, part[name][1])), default=0.0) / scale
    if diff > worst:
        worst, where = diff, name
assert worst <= 1e-5, f"final parameters differ after resume: max relative difference {worst:.3g} in {where}"
print(f"resume: final parameters match ({len(full)} tensors, max relative difference {worst:.3g})")
print("2 passed, 0 failed")
PY
