#!/usr/bin/env bash
# pipelines/precompute.pipeline with -D TEXT (issue 31): the caption embeddings go into the same
# cache as the latents, from the native umT5 encoder (tests/reference/text_encoder/umt5_tiny); a
# second run finds every clip and caption cached, and its textencoder never loads the encoder
# (its textencoder-summary line: 0 encoded, the text encoder was never loaded).
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
ref=${VIDEOTRAIN_REFERENCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-precompute-text-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 6 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 5 --tiny >/dev/null
umt5="$ref/text_encoder/umt5_tiny"
text="! textencoder tokenizer=$umt5 model=$umt5 max-length=16 device=cpu dtype=float32 cache-dir=$work/cache"
fail() { echo "FAIL: $*"; exit 1; }
for pass in first second; do
  timeout -k 10 240 "$build/tools/videotrain-launch" -n 1 -f "$src/pipelines/precompute.pipeline" \
    -D "DATA=$work/data" -D "VAE=$work/vae" -D "CACHE=$work/cache" -D "TEXT=$text" > "$work/$pass.log" 2>&1 \
    || { cat "$work/$pass.log"; fail "$pass precompute exited non-zero"; }
  summary=$(grep 'textencoder: .* captions' "$work/$pass.log" || true)
  [[ -n $summary ]] || { cat "$work/$pass.log"; fail "$pass run: no textencoder-summary"; }
  echo "$pass: $summary"
done
grep 'textencoder: ' "$work/first.log" | grep -v 'never loaded' | grep -q '([1-9][0-9]* encoded, 0 from the cache)' ||
  fail "the first run did not encode its captions"
grep -q 'textencoder: [1-9][0-9]* captions (0 encoded, [1-9][0-9]* from the cache); the text encoder was never loaded' \
  "$work/second.log" ||
  fail "the second run encoded captions or loaded the encoder although cache-dir held them all"
echo "precompute-text: captions cached on the first run, the encoder not loaded on the second"
