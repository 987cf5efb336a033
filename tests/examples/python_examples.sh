#!/usr/bin/env bash
# examples/python/train_app.py with the model of examples/models/video_model_template.py:
#  - run 1 trains with a validation branch, stops at step 3 (max-steps) and writes the final
#    checkpoint of that step; validation results arrive on the bus with finite losses;
#  - run 2 (--resume) starts at the step after that checkpoint and stops at its own target;
#  - runs 3 and 4 (validation every step) are stopped by SIGINT and SIGTERM while validation
#    runs: they end cleanly (a cut pass dropped with a message, no error) and exit 130 and 143;
#  - run 5, rank 0 of 2 whose rank 1 never starts, ends within 5 s of Ctrl-C with 130.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
py=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-examples-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 6 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
"$py" "$src/examples/models/video_model_template.py" "$work/model.pt" --latent-channels 4 --width 8 >/dev/null
app() {  # app LOG ARGS...: runs the example; the summary is its last line
  local log=$1; shift
  "$py" "$src/examples/python/train_app.py" --data "$work/data/train.csv" --vae "$work/vae" \
    --model "$work/model.pt" --frames 5 --width 32 --height 32 --batch-size 2 --micro-batch-size 1 \
    --checkpoint-dir "$work/ckpt" "$@" > "$work/$log" 2>&1 || { cat "$work/$log"; echo "train_app.py $* failed"; exit 1; }
  tail -1 "$work/$log"
}
check() {  # check SUMMARY PYTHON-EXPRESSION MESSAGE
  "$py" -c 'import json,math,sys; s=json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' "$1" "$2" ||
    { cat "$work"/*.log; echo "$3 (summary: $1)"; exit 1; }
}
s1=$(app run1.log --steps 3 --val "$work/data/val.csv" --val-every 2)
check "$s1" 's["ok"] and s["first_step"] == 1 and s["last_step"] == 3' "run 1 did not train steps 1..3 and stop at 3"
check "$s1" 's["checkpoints"] and s["checkpoints"][-1]["step"] == s["last_step"]' "run 1: no final checkpoint of its last step"
check "$s1" '"2" in s["val_losses"] and all(math.isfinite(v) for v in s["val_losses"].values())' "run 1: no finite validation result at step 2"
grep -q '^step 1 | epoch 0 | loss [0-9.]* |' "$work/run1.log" || { cat "$work/run1.log"; echo "no progress line"; exit 1; }
last1=$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["last_step"])' "$s1")
[[ -d $work/ckpt/$(printf 'step-%08d' "$last1") ]] || { ls "$work/ckpt"; echo "no step-$last1 folder"; exit 1; }
echo "run 1: steps 1..$last1, validation, final checkpoint step $last1"
s2=$(app run2.log --steps $((last1 + 2)) --resume)
check "$s2" "s['ok'] and s['first_step'] == $last1 + 1 and s['last_step'] == $last1 + 2" "run 2 did not resume after step $last1 and stop at $((last1 + 2))"
check "$s2" 's["checkpoints"][-1]["step"] == s["last_step"]' "run 2: no final checkpoint"
echo "run 2: resumed at step $((last1 + 1)), stopped at $("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["last_step"])' "$s2")"
stopped() {  # stopped LOG SIGNAL EXIT-CODE: a long run with validation every step, stopped by SIGNAL
  # (the validation set has several clips, so that the stop lands in a pass or between passes)
  local log=$1 sig=$2 want=$3
  "$py" "$src/examples/python/train_app.py" --data "$work/data/train.csv" --vae "$work/vae" \
    --model "$work/model.pt" --frames 5 --width 32 --height 32 --batch-size 2 --micro-batch-size 1 \
    --checkpoint-dir "$work/ckpt-$sig" --steps 100000 --val "$work/data/train.csv" --val-every 1 > "$work/$log" 2>&1 &
  local pid=$! waited=0
  until grep -q '^validation at step 2:' "$work/$log"; do
    sleep 0.2; waited=$((waited + 1))
    ((waited < 1500)) || { kill -KILL $pid; cat "$work/$log"; echo "$log: no validation result in 300 s"; exit 1; }
  done
  kill -"$sig" $pid
  local rc=0
  wait $pid || rc=$?
  local s; s=$(tail -1 "$work/$log")
  [[ $rc == "$want" ]] || { cat "$work/$log"; echo "$log: exit $rc after SIG$sig, not $want"; exit 1; }
  check "$s" 's["ok"] and s["error"] is None and s["checkpoints"][-1]["step"] == s["last_step"]' \
    "$log: the stop by SIG$sig was not clean"
  ! grep -q '^error from' "$work/$log" || { cat "$work/$log"; echo "$log: an error after SIG$sig"; exit 1; }
  echo "$log: SIG$sig at step $("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["last_step"])' "$s"), exit $rc"
}
stopped run3.log INT 130
stopped run4.log TERM 143
# Rank 1 never starts: rank 0 waits at rendezvous (in its state change); Ctrl-C ends it at once.
MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + RANDOM % 20000)) RANK=0 WORLD_SIZE=2 \
  "$py" "$src/examples/python/train_app.py" --data "$work/data/train.csv" --vae "$work/vae" \
  --model "$work/model.pt" --frames 5 --width 32 --height 32 --checkpoint-dir "$work/ckpt-alone" > "$work/run5.log" 2>&1 &
pid=$!
sleep 3
kill -0 $pid 2>/dev/null || { cat "$work/run5.log"; echo "run 5 ended before the signal"; exit 1; }
t0=$(date +%s%N)
kill -INT $pid
rc=0
for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -0 $pid 2>/dev/null && { kill -KILL $pid; cat "$work/run5.log"; echo "run 5: still waiting 10 s after Ctrl-C"; exit 1; }
wait $pid || rc=$?
took_ms=$((($(date +%s%N) - t0) / 1000000))
((rc == 130 && took_ms < 5000)) || { cat "$work/run5.log"; echo "run 5: exit $rc after $took_ms ms (wanted 130 within 5 s)"; exit 1; }
grep -q 'nothing was trained' "$work/run5.log" || { cat "$work/run5.log"; echo "run 5: no message"; exit 1; }
echo "run 5: Ctrl-C while waiting for rank 1 ended it in $took_ms ms, exit 130"
