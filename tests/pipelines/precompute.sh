#!/usr/bin/env bash
# pipelines/precompute.pipeline (issue 16, item 6): 2 ranks under videotrain-launch fill one latent
# cache, sharing the rows (each clip encoded once, one entry per clip); videotrain-cache stats counts
# them and verify passes; pipelines/train.pipeline on 2 ranks with that cache then decodes nothing
# (decoded=0 in every csvvideosrc-epoch message of both ranks). A precompute killed with SIGKILL
# while it writes leaves no torn entry (verify passes), and a second run completes the cache.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-precompute-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
launch="$build/tools/videotrain-launch"
tool="$build/tools/videotrain-cache"
bash "$src/scripts/make_dataset.sh" "$work/data" 8 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 5 --tiny >/dev/null
# Without the corrupt row (a replacement could race its row's write and be encoded twice), each
# row is one distinct clip with WINDOWS=1, encoded by exactly one rank.
grep -v corrupt "$work/data/train.csv" > "$work/train.csv"
mv "$work/train.csv" "$work/data/train.csv"
clips=$(( $(wc -l < "$work/data/train.csv") - 1 ))
defs=(-D "DATA=$work/data" -D "VAE=$work/vae" -D "CACHE=$work/cache" -D PROGRESS_EVERY=1)
fail() { echo "FAIL: $*"; exit 1; }
# field decoded|cached < lines: the counts of videotrain-run's epoch lines
# ('csvvideosrc: epoch 0 done: 6 clips (6 decoded, 0 from the latent cache, 0 replaced)').
field() {
  case $1 in
    decoded) sed -n 's/.* clips (\([0-9]*\) decoded, .*/\1/p' ;;
    cached) sed -n 's/.* decoded, \([0-9]*\) from the latent cache.*/\1/p' ;;
  esac
}

# 1. Two ranks fill the cache.
timeout -k 10 240 "$launch" -n 2 -f "$src/pipelines/precompute.pipeline" "${defs[@]}" > "$work/pre.log" 2>&1 \
  || { cat "$work/pre.log"; fail "precompute exited non-zero"; }
grep -q '^\[rank 0\] .*progressreport' "$work/pre.log" || { cat "$work/pre.log"; fail "no progress line"; }
for r in 0 1; do
  grep -q "^\[rank $r\] csvvideosrc[^:]*: epoch [0-9]* done" "$work/pre.log" || { cat "$work/pre.log"; fail "rank $r: no epoch message"; }
done
decoded=$(grep 'csvvideosrc[^:]*: epoch [0-9]* done' "$work/pre.log" | field decoded | awk '{s += $1} END {print s + 0}')
# The padding clip that evens out the ranks repeats a row of the other rank: decoded once more
# when both ranks look it up before either has written it.
(( decoded == clips || decoded == clips + 1 )) ||
  { cat "$work/pre.log"; fail "ranks decoded $decoded clips together, expected $clips (or one more)"; }
"$tool" stats "$work/cache" > "$work/stats.txt"
entries=$(sed -n 's/^entries \([0-9]*\)$/\1/p' "$work/stats.txt")
[[ $entries == "$clips" ]] || { cat "$work/stats.txt"; fail "$entries entries, expected $clips (one per clip)"; }
"$tool" verify "$work/cache" > "$work/verify.txt" || { cat "$work/verify.txt"; fail "verify after precompute"; }
grep -q "^$clips entries verified, 0 bad$" "$work/verify.txt" || { cat "$work/verify.txt"; fail "verify output"; }
echo "precompute: 2 ranks encoded $decoded clips, $entries entries, verified"

# 2. Training from the cache, 2 ranks: every epoch of both ranks decodes nothing.
timeout -k 10 300 "$launch" -n 2 -f "$src/pipelines/train.pipeline" "${defs[@]}" -D WINDOWS=1 -D STEPS=4 \
  -D CKPT="$work/ckpt" -D CKPT_EVERY=0 -D METRICS="$work/metrics.jsonl" > "$work/train.log" 2>&1 \
  || { cat "$work/train.log"; fail "training exited non-zero"; }
for r in 0 1; do
  epochs=$(grep "^\[rank $r\] csvvideosrc[^:]*: epoch [0-9]* done" "$work/train.log" || true)
  [[ -n $epochs ]] || { cat "$work/train.log"; fail "rank $r: no csvvideosrc-epoch message in training"; }
  if field decoded <<< "$epochs" | grep -v '^0$' > /dev/null; then
    cat "$work/train.log"; fail "rank $r decoded clips while training from a full cache"
  fi
  cached=$(echo "$epochs" | field cached | awk '{s += $1} END {print s + 0}')
  (( cached > 0 )) || { cat "$work/train.log"; fail "rank $r: no clip from the cache"; }
  echo "train rank $r: $(echo "$epochs" | wc -l) epochs, decoded=0, $cached clips from the cache"
done
"$tool" verify "$work/cache" > /dev/null || fail "verify after training"

# 3. SIGKILL in the middle of a precompute (one rank, 3 epochs of 3 windows: more entries to write),
# as soon as its first entries are there; then verify, and a second run completes the cache.
k=(-D "DATA=$work/data" -D "VAE=$work/vae" -D "CACHE=$work/killed" -D EPOCHS=3 -D WINDOWS=3)
RANK=0 WORLD_SIZE=1 "$build/tools/videotrain-run" -f "$src/pipelines/precompute.pipeline" "${k[@]}" \
  > "$work/killed.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  n=$({ find "$work/killed" -type f 2>/dev/null || true; } | wc -l)
  (( n >= 2 )) && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.05
done
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
"$tool" verify "$work/killed" > "$work/killed-verify.txt" \
  || { cat "$work/killed-verify.txt"; fail "verify after kill -9"; }
grep -q ' 0 bad$' "$work/killed-verify.txt" || { cat "$work/killed-verify.txt"; fail "bad entries after kill -9"; }
echo "kill -9: $(cat "$work/killed-verify.txt")"
RANK=0 WORLD_SIZE=1 timeout -k 10 240 "$build/tools/videotrain-run" -f "$src/pipelines/precompute.pipeline" "${k[@]}" \
  > "$work/again.log" 2>&1 || { cat "$work/again.log"; fail "precompute after the kill"; }
"$tool" verify "$work/killed" > "$work/killed-verify.txt" || { cat "$work/killed-verify.txt"; fail "verify"; }
grep -q ' 0 bad$' "$work/killed-verify.txt" || { cat "$work/killed-verify.txt"; fail "bad entries"; }
echo "after a second run: $(cat "$work/killed-verify.txt")"
