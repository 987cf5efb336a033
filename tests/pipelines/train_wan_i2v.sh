#!/usr/bin/env bash
# vaeencoder condition=first-frame end to end (issue 43 item 3): csvvideosrc ! vaeencoder (tiny Wan 2.1
# VAE, 4 latent channels) condition=first-frame ! textencoder ! microbatcher ! ddptrainsink on a tiny
# Wan folder of the I2V layout (in_channels 12 = 4 noisy + 4 mask + 4 condition latents) trains a few
# steps with finite losses; a text-to-video run (condition=none) on that folder is an error naming
# the property to set. Wan 2.1 I2V: the same with imageencoder (tiny CLIP) after vaeencoder on a folder
# with an image path (image_dim 32) trains; without the imageencoder it is an error naming it.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
ref=${VIDEOTRAIN_REFERENCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-wan-i2v-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
export OMP_NUM_THREADS=1
bash "$src/scripts/make_dataset.sh" "$work/data" 4 >/dev/null
sed -e 's/"in_channels": 4/"in_channels": 12/' > "$work/config.json" <<'JSON'
{"_class_name": "WanTransformer3DModel", "added_kv_proj_dim": null, "attention_head_dim": 16, "cross_attn_norm": true,
 "eps": 1e-06, "ffn_dim": 64, "freq_dim": 32, "image_dim": null, "in_channels": 4, "num_attention_heads": 2,
 "num_layers": 1, "out_channels": 4, "patch_size": [1, 2, 2], "pos_embed_seq_len": null,
 "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "text_dim": 32}
JSON
"$build/tools/videotrain-model" init "$work/config.json" "$work/dit" --seed 3 --dtype fp32 >/dev/null
sed -e 's/"image_dim": null/"image_dim": 32/' -e 's/"added_kv_proj_dim": null/"added_kv_proj_dim": 32/' \
  "$work/config.json" > "$work/config21.json"
"$build/tools/videotrain-model" init "$work/config21.json" "$work/dit21" --seed 3 --dtype fp32 >/dev/null
run() {  # run NAME CONDITION [DIT [ELEMENTS AFTER vaeencoder]]
  timeout 120 gst-launch-1.0 -q csvvideosrc location="$work/data/train.csv" num-frames=5 width=32 height=32 fps=0 \
    prefetch=1 seed=1 num-epochs=0 ! vaeencoder model="$ref/wan_vae/tiny_wan21" latent=mode condition="$2" cache-dir="$work/cache" \
    ${4:-} ! textencoder tokenizer="$ref/text_encoder/umt5_tiny" model="$ref/text_encoder/umt5_tiny" max-length=16 \
      caption-dropout=0 ! queue ! microbatcher batch-size=2 micro-batch-size=1 \
    ! ddptrainsink model="${3:-$work/dit}" lr=1e-3 max-steps=3 seed=1 checkpoint-dir="$work/ckpt-$1" checkpoint-every=0 log-every=1 \
      metrics-file="$work/$1.jsonl" timeout=60 > "$work/$1.log" 2>&1
}
run i2v first-frame || { cat "$work/i2v.log"; echo "FAIL: the I2V run did not end"; exit 1; }
# A second run reads every clip (latents and conditions) from the cache written by the first.
touch "$work/marker"
run cached first-frame || { cat "$work/cached.log"; echo "FAIL: the cached I2V run did not end"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, math, sys
w = sys.argv[1]
def losses(run):
    return [json.loads(l)["loss"] for l in open(f"{w}/{run}.jsonl") if '"loss"' in l]
a, b = losses("i2v"), losses("cached")
assert len(a) >= 3 and all(math.isfinite(l) for l in a), a
assert a == b, f"the run from the latent cache (conditions included) trained differently: {a} vs {b}"
print(f"wan i2v: losses {[round(l, 4) for l in a]}, the same from the cache")
PY
[ -n "$(ls "$work/cache")" ] && [ -z "$(find "$work/cache" -type f -newer "$work/marker")" ] \
  || { echo "FAIL: the second run did not take its clips from the cache"; exit 1; }
if run t2v none; then echo "FAIL: an I2V folder trained without a condition"; exit 1; fi
grep -q "condition=first-frame" "$work/t2v.log" || { cat "$work/t2v.log"; echo "FAIL: the error does not name condition="; exit 1; }
echo "wan i2v: condition=none on an I2V folder is refused naming vaeencoder condition="
# Wan 2.1 I2V: image_embeds from imageencoder beside the condition.
clip="! imageencoder model=$ref/clip_vision/vit_tiny processor=$ref/clip_vision/image_processor"
run wan21 first-frame "$work/dit21" "$clip" || { cat "$work/wan21.log"; echo "FAIL: the Wan 2.1 I2V run did not end"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, math, sys
a = [json.loads(l)["loss"] for l in open(f"{sys.argv[1]}/wan21.jsonl") if '"loss"' in l]
assert len(a) >= 3 and all(math.isfinite(l) for l in a), a
print(f"wan 2.1 i2v (imageencoder): losses {[round(l, 4) for l in a]}")
PY
[ -f "$work/ckpt-wan21/transformer/config.json" ] || { echo "FAIL: the Wan 2.1 I2V run exported no transformer"; exit 1; }
if run wan21-noimage first-frame "$work/dit21"; then echo "FAIL: a Wan 2.1 I2V folder trained without image_embeds"; exit 1; fi
grep -q "put an imageencoder" "$work/wan21-noimage.log" \
  || { cat "$work/wan21-noimage.log"; echo "FAIL: the error does not name imageencoder"; exit 1; }
echo "wan 2.1 i2v: without imageencoder the run is refused naming it"
# Validation takes the same tensors: a ddpvalsink branch (its own vaeencoder and imageencoder) reports a
# finite loss after each of 2 steps.
bash "$src/scripts/make_dataset.sh" "$work/data8" 8 >/dev/null  # 8 rows: a validation split
enc="vaeencoder model=$ref/wan_vae/tiny_wan21 latent=mode condition=first-frame $clip ! textencoder \
  tokenizer=$ref/text_encoder/umt5_tiny model=$ref/text_encoder/umt5_tiny max-length=16 caption-dropout=0"
timeout 120 gst-launch-1.0 -m csvvideosrc location="$work/data/train.csv" num-frames=5 width=32 height=32 fps=0 \
    prefetch=1 seed=1 num-epochs=0 ! $enc ! queue ! microbatcher batch-size=2 micro-batch-size=1 \
  ! ddptrainsink name=trainer model="$work/dit21" lr=1e-3 max-steps=2 seed=1 timeout=60 \
  csvvideosrc location="$work/data8/val.csv" num-frames=5 width=32 height=32 fps=0 num-epochs=0 shuffle=false \
    prefetch=1 ! $enc ! queue ! ddpvalsink trainer=trainer every=1 > "$work/wan21-val.log" 2>&1 \
  || { cat "$work/wan21-val.log"; echo "FAIL: the Wan 2.1 I2V run with validation did not end"; exit 1; }
/usr/bin/python3 - "$work/wan21-val.log" <<'PY'
import math, re, sys
r = [(int(s), float(l)) for s, l in re.findall(r"ddpvalsink-result.*?step=\(guint64\)(\d+), loss=\(double\)([-0-9.e+naif]+)", open(sys.argv[1]).read())]
assert [s for s, _ in r] == [1, 2] and all(math.isfinite(l) for _, l in r), r
print(f"wan 2.1 i2v: validation losses {r}")
PY
