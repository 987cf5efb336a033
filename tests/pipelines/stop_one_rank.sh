#!/usr/bin/env bash
# Stopping (issue 38 items 8 and 13), 2 ranks of pipelines/train.pipeline (steps of 4 clips, 3 clips an
# epoch on each rank, so that steps close at epoch ends):
#  1. max-steps ends the run: the sources stop once the trainer is done (microbatcher passed the
#     trainer's EOS upstream only for steps it closed itself; those closed at an epoch end never told,
#     and the sources decoded on for ever);
#  2. SIGTERM to one rank: its peer stops at the same step boundary within seconds (not after the
#     collective timeout), the run's final checkpoint is written, the signalled rank exits 143.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-stop-XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 6 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run NAME STEPS
  "$build/tools/videotrain-launch" -n 2 -f "$src/pipelines/train.pipeline" -D DATA="$work/data" -D VAE="$work/vae" \
    -D STEPS="$2" -D CKPT="$work/$1" -D CKPT_EVERY=100000 -D METRICS="$work/$1.jsonl" -D TIMEOUT=120 \
    -D WIDTH=32 -D HEIGHT=32 -D FRAMES=5
}
start=$(date +%s)
timeout 120 bash -c "$(declare -f run); build=$build src=$src work=$work; run steps 5" >"$work/steps.log" 2>&1 \
  || { tail -20 "$work/steps.log"; fail "max-steps=5 did not end the 2-rank run (rc $?)"; }
[[ -f $work/steps/step-00000005/manifest.json ]] || fail "no final checkpoint at step 5"
echo "ok: max-steps ends a 2-rank run whose steps close at epoch ends ($(( $(date +%s) - start )) s)"

run long 100000 >"$work/long.log" 2>&1 &
launcher=$!
for _ in $(seq 600); do
  grep -q "^\[rank 0\] step 3 |" "$work/long.log" 2>/dev/null && break
  sleep 0.2
done
grep -q "^\[rank 0\] step 3 |" "$work/long.log" || { cat "$work/long.log"; fail "the long run did not reach step 3"; }
rank0=""
for p in $(pgrep -f "videotrain-run .*DATA=$work/data" || true); do
  tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx "RANK=0" && rank0=$p
done
[[ -n $rank0 ]] || fail "rank 0's process not found"
t0=$(date +%s.%N)
kill -TERM "$rank0"
rc=0
wait "$launcher" || rc=$?
took=$(/usr/bin/python3 -c "import time; print(round(time.time() - $t0, 1))")
grep -q "status 143" "$work/long.log" || { tail -20 "$work/long.log"; fail "rank 0 did not exit 143"; }
grep -q "all: \[143, 0\]" "$work/long.log" || { tail -20 "$work/long.log"; fail "rank 1 did not end cleanly"; }
/usr/bin/python3 - "$took" <<'PY' || fail "the ranks took ${took} s to stop after SIGTERM"
import sys
sys.exit(0 if float(sys.argv[1]) < 30 else 1)
PY
step=$(grep -o "a peer's data ended at step [0-9]*" "$work/long.log" | grep -o "[0-9]*$" | head -1)
[[ -n $step ]] || { tail -20 "$work/long.log"; fail "rank 1 did not say its peer stopped"; }
final=$(printf "step-%08d" "$step")
[[ -f $work/long/$final/manifest.json ]] || { ls "$work/long"; tail -20 "$work/long.log"; fail "no final checkpoint $final"; }
echo "ok: SIGTERM to rank 0: both ranks stopped at step $step within $took s, checkpoint $final, exits [143, 0]"
echo "2 passed, 0 failed"
