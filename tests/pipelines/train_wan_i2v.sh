#!/usr/bin/env bash
# vaeencoder condition=first-frame end to end (issue 43 item 3): csvvideosrc ! vaeencoder (tiny Wan 2.1
# VAE, 4 latent channels) condition=first-frame ! textencoder ! microbatcher ! ddptrainsink on a tiny
# Wan folder of the I2V layout (in_channels 12 = 4 noisy + 4 mask + 4 condition latents) trains a few
# steps with finite losses; a text-to-video run (condition=none) on that folder is an error naming
# the property to set. Wan 2.1 I2V (a folder with an image path, image_dim 32): pipelines/train-wan-i2v.pipeline
# (imageencoder, tiny CLIP) trains the same on 1 and 2 ranks, its image path included; without imageencoder,
# or with text shorter than the 512 rows diffusers' attention counts on, it is an error naming the fix;
# a ddpvalsink branch validates it.
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
# Wan 2.1 I2V as users run it: pipelines/train-wan-i2v.pipeline on a folder laid out as the published
# ones (M/vae, image_encoder, image_processor, tokenizer, text_encoder, transformer: here the tiny parts),
# 1 rank x batch 4 and 2 ranks x batch 2 (also under sharding=full) end at the same weights, and so does a run
# resumed from its step-1 checkpoint (issue 43 item 5).
m="$work/M"; mkdir -p "$m"
ln -s "$ref/wan_vae/tiny_wan21" "$m/vae"; ln -s "$ref/clip_vision/vit_tiny" "$m/image_encoder"
ln -s "$ref/clip_vision/image_processor" "$m/image_processor"; ln -s "$ref/text_encoder/umt5_tiny" "$m/tokenizer"
ln -s "$ref/text_encoder/umt5_tiny" "$m/text_encoder"; ln -s "$work/dit21" "$m/transformer"
bash "$src/scripts/make_dataset.sh" "$work/data8" 8 >/dev/null  # 8 rows: 4 a rank on 2 ranks, and a validation split
launch() {  # launch NAME RANKS BATCH MICRO [EXTRA]
  timeout 300 "$build/tools/videotrain-launch" -n "$2" -q -f "$src/pipelines/train-wan-i2v.pipeline" \
    -D DATA="$work/data8" -D M="$m" -D BUCKETS=32x32 -D FRAME_BUCKETS=5 -D FPS=0 -D FRAMES=5 \
    -D WIDTH=32 -D HEIGHT=32 -D PREFETCH=1 -D BATCH="$3" -D MICRO="$4" -D STEPS=2 -D CKPT="$work/ckpt-$1" \
    -D CKPT_EVERY=0 -D LR=1e-3 -D SEED=1 -D LATENT=mode -D CAPTION_DROPOUT=0 -D SAVE_DTYPE=fp32 \
    -D METRICS="$work/$1.jsonl" -D TIMEOUT=120 -D EXTRA="${5:-}" > "$work/$1.log" 2>&1
}
launch wan21 1 4 2 || { cat "$work/wan21.log"; echo "FAIL: the Wan 2.1 I2V run (1 rank) did not end"; exit 1; }
launch wan21-2 2 2 1 || { cat "$work/wan21-2.log"; echo "FAIL: the Wan 2.1 I2V run (2 ranks) did not end"; exit 1; }
launch wan21-full 2 2 1 sharding=full || { cat "$work/wan21-full.log"; echo "FAIL: the Wan 2.1 I2V run (2 ranks, sharding=full) did not end"; exit 1; }
# Resume: a run stopped at step 1 (its checkpoint) and resumed to step 2 ends at the uninterrupted run's weights.
launch wan21-res 1 4 2 "max-steps=1 checkpoint-every=1" || { cat "$work/wan21-res.log"; echo "FAIL: the I2V run to step 1 did not end"; exit 1; }
launch wan21-res 1 4 2 "resume=true checkpoint-every=1" || { cat "$work/wan21-res.log"; echo "FAIL: the resumed I2V run did not end"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, math, struct, sys
import torch
w = sys.argv[1]
def weights(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n)); data = f.read()
    return {k: torch.frombuffer(bytearray(data[v["data_offsets"][0]:v["data_offsets"][1]]), dtype=torch.float32).reshape(v["shape"])
            for k, v in h.items() if k != "__metadata__"}
a = [json.loads(l)["loss"] for l in open(f"{w}/wan21.jsonl") if '"loss"' in l]
assert len(a) >= 2 and all(math.isfinite(l) for l in a), a
base = weights(f"{w}/dit21/diffusion_pytorch_model.safetensors")
one = weights(f"{w}/ckpt-wan21/transformer/diffusion_pytorch_model.safetensors")
two = weights(f"{w}/ckpt-wan21-2/transformer/diffusion_pytorch_model.safetensors")
full = weights(f"{w}/ckpt-wan21-full/transformer/diffusion_pytorch_model.safetensors")
img = [k for k in one if "image_embedder" in k or "add_k_proj" in k or "add_v_proj" in k]
assert img, sorted(one)
moved = min((one[k] - base[k]).abs().max().item() for k in img)
assert moved > 1e-5, f"the image path did not train (smallest max change {moved})"
flat = lambda ws: torch.cat([ws[k].flatten() for k in sorted(ws)])
d = ((flat(one) - flat(two)).norm() / flat(one).norm()).item()
assert d < 1e-6, f"1 rank x 4 and 2 ranks x 2 differ: rel L2 {d}"
res = weights(f"{w}/ckpt-wan21-res/transformer/diffusion_pytorch_model.safetensors")
dres = max((one[k] - res[k]).abs().max().item() for k in one)
assert dres == 0, f"the resumed I2V run's weights differ from the uninterrupted run's by {dres}"
df = ((flat(one) - flat(full)).norm() / flat(one).norm()).item()
assert df < 1e-6, f"1 rank x 4 and 2 ranks x 2 under sharding=full differ: rel L2 {df}"
print(f"wan 2.1 i2v (train-wan-i2v.pipeline): losses {[round(l, 4) for l in a]}; the image path moved; "
      f"1 rank x 4 vs 2 ranks x 2 rel L2 {d:.2g}, with sharding=full {df:.2g}; resumed at step 1: identical")
PY
clip="! imageencoder model=$ref/clip_vision/vit_tiny processor=$ref/clip_vision/image_processor"
if run wan21-noimage first-frame "$work/dit21"; then echo "FAIL: a Wan 2.1 I2V folder trained without image_embeds"; exit 1; fi
grep -q "put an imageencoder" "$work/wan21-noimage.log" \
  || { cat "$work/wan21-noimage.log"; echo "FAIL: the error does not name imageencoder"; exit 1; }
echo "wan 2.1 i2v: without imageencoder the run is refused naming it"
# Text of 16 rows: diffusers would read the image tokens as text; refused naming max-length.
if run wan21-short first-frame "$work/dit21" "$clip"; then echo "FAIL: a Wan 2.1 I2V folder trained on 16 text rows"; exit 1; fi
grep -q "max-length=512" "$work/wan21-short.log" \
  || { cat "$work/wan21-short.log"; echo "FAIL: the error does not name max-length=512"; exit 1; }
echo "wan 2.1 i2v: text shorter than 512 rows is refused naming max-length"
# Validation takes the same tensors: a ddpvalsink branch (its own vaeencoder and imageencoder) reports a
# finite loss after each of 2 steps. A sampling branch samples image-to-video from a prompt file's image
# (promptsrc image column, ddpsampler vae= image-encoder=) at step 2, and samplesink writes its MP4.
gst-launch-1.0 -q videotestsrc num-buffers=1 pattern=ball ! video/x-raw,format=RGB,width=32,height=32 ! pngenc \
  ! filesink location="$work/first.png"
printf 'prompt,image\n"a ball",first.png\n' > "$work/prompts.csv"
enc="vaeencoder model=$ref/wan_vae/tiny_wan21 latent=mode condition=first-frame $clip ! textencoder \
  tokenizer=$ref/text_encoder/umt5_tiny model=$ref/text_encoder/umt5_tiny max-length=512 caption-dropout=0"
timeout 120 gst-launch-1.0 -m csvvideosrc location="$work/data/train.csv" num-frames=5 width=32 height=32 fps=0 \
    prefetch=1 seed=1 num-epochs=0 ! $enc ! queue ! microbatcher batch-size=2 micro-batch-size=1 \
  ! ddptrainsink name=trainer model="$work/dit21" lr=1e-3 max-steps=2 seed=1 timeout=60 \
  csvvideosrc location="$work/data8/val.csv" num-frames=5 width=32 height=32 fps=0 num-epochs=0 shuffle=false \
    prefetch=1 ! $enc ! queue ! ddpvalsink trainer=trainer every=1 \
  promptsrc location="$work/prompts.csv" ! textencoder tokenizer=$ref/text_encoder/umt5_tiny \
    model=$ref/text_encoder/umt5_tiny max-length=512 caption-dropout=0 ! ddpsampler trainer=trainer every=2 \
    at-start=false steps=2 num-frames=5 width=32 height=32 vae=$ref/wan_vae/tiny_wan21 \
    image-encoder=$ref/clip_vision/vit_tiny image-processor=$ref/clip_vision/image_processor ! queue \
  ! vaedecoder model=$ref/wan_vae/tiny_wan21 framerate=8 ! samplesink trainer=trainer \
    location="$work/samples/step-%08d/prompt-%02d.mp4" > "$work/wan21-val.log" 2>&1 \
  || { cat "$work/wan21-val.log"; echo "FAIL: the Wan 2.1 I2V run with validation did not end"; exit 1; }
/usr/bin/python3 - "$work/wan21-val.log" <<'PY'
import math, re, sys
r = [(int(s), float(l)) for s, l in re.findall(r"ddpvalsink-result.*?step=\(guint64\)(\d+), loss=\(double\)([-0-9.e+naif]+)", open(sys.argv[1]).read())]
assert [s for s, _ in r] == [1, 2] and all(math.isfinite(l) for _, l in r), r
print(f"wan 2.1 i2v: validation losses {r}")
PY
mp4="$work/samples/step-00000002/prompt-00.mp4"
frames=$(ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=nb_read_frames,width,height \
  -of csv=p=0 "$mp4" 2>&1) || { ls -R "$work/samples" || true; echo "FAIL: no readable I2V sample $mp4"; exit 1; }
[ "$frames" = "32,32,5" ] || { echo "FAIL: the I2V sample has width,height,frames $frames, expected 32,32,5"; exit 1; }
echo "wan 2.1 i2v: an image-to-video sample of step 2 from the prompt file's image: $mp4 (32x32, 5 frames)"
# Wan 2.2 TI2V 5B: pipelines/train-wan.pipeline -D CONDITION=first-frame on a folder whose ../model_index.json says
# expand_timesteps (a copy: the trainer reads the folder's parent) trains image-to-video (the first latent frame
# clean, out of the loss: other losses than the same run without CONDITION, which trains text-to-video); without
# model_index.json the condition is refused naming expand_timesteps.
mkdir -p "$work/ti2v" && cp -r "$ref/dit/wan22_ti2v_tiny" "$work/ti2v/transformer"
echo '{"_class_name": "WanPipeline", "expand_timesteps": true}' > "$work/ti2v/model_index.json"
ti2v() {  # ti2v NAME CONDITION MODEL
  timeout 120 "$build/tools/videotrain-launch" -n 1 -q -f "$src/pipelines/train-wan.pipeline" \
    -D DATA="$work/data" -D VAE="$ref/wan_vae/tiny_wan22" -D TOKENIZER="$ref/text_encoder/umt5_tiny" \
    -D TEXT_ENCODER="$ref/text_encoder/umt5_tiny" -D MAX_LENGTH=16 -D BUCKETS=32x32 -D FRAME_BUCKETS=5 -D FPS=0 \
    -D FRAMES=5 -D WIDTH=32 -D HEIGHT=32 -D PREFETCH=1 -D BATCH=2 -D MICRO=2 -D STEPS=2 -D MODEL="$3" \
    -D CKPT="$work/ckpt-$1" -D CKPT_EVERY=0 -D LR=1e-3 -D SEED=1 -D LATENT=mode -D CAPTION_DROPOUT=0 \
    -D CONDITION="$2" -D METRICS="$work/$1.jsonl" -D TIMEOUT=60 > "$work/$1.log" 2>&1
}
ti2v ti2v first-frame "$work/ti2v/transformer" || { cat "$work/ti2v.log"; echo "FAIL: the TI2V run did not end"; exit 1; }
ti2v ti2v-t2v none "$work/ti2v/transformer" || { cat "$work/ti2v-t2v.log"; echo "FAIL: the TI2V folder's text-to-video run did not end"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, math, sys
w = sys.argv[1]
l = lambda r: [json.loads(x)["loss"] for x in open(f"{w}/{r}.jsonl") if '"loss"' in x]
a, b = l("ti2v"), l("ti2v-t2v")
assert len(a) >= 2 and len(b) >= 2 and all(math.isfinite(x) for x in a + b), (a, b)
assert abs(a[0] - b[0]) > 1e-6 * abs(b[0]), f"TI2V with a condition trained as text-to-video: {a} vs {b}"
print(f"wan 2.2 ti2v (train-wan.pipeline CONDITION=first-frame): losses {[round(x, 4) for x in a]}; "
      f"text-to-video on the same folder {[round(x, 4) for x in b]}")
PY
if ti2v ti2v-noindex first-frame "$ref/dit/wan22_ti2v_tiny"; then echo "FAIL: a condition trained a folder without expand_timesteps"; exit 1; fi
grep -q "expand_timesteps" "$work/ti2v-noindex.log" || { cat "$work/ti2v-noindex.log"; echo "FAIL: the error does not name expand_timesteps"; exit 1; }
echo "wan 2.2 ti2v: a condition for a folder without expand_timesteps is refused naming it"
