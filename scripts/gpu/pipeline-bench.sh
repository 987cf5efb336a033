#!/usr/bin/env bash
# The whole training pipeline on one device against the DiT step alone: how well video decoding,
# VAE encoding and text encoding overlap training, and the peak memory (docs/gpu-benchmarks.md).
#
#   bash scripts/gpu/pipeline-bench.sh            # GPU machine: builds build-gpu/ (scripts/gpu/build.sh,
#                                                 # the .debs of scripts/gpu/fetch-debs.sh), then runs
#   bash scripts/gpu/pipeline-bench.sh --smoke --build build   # here, on CPU, tiny models (a minute)
# Options: --build DIR (default build-gpu, built by scripts/gpu/build.sh unless --no-build; with --smoke
# default build, never built), --device cuda:0|cpu, --clips N (one clip a step), --steps N,
# --text-encoder wide|tiny (default: wide on the GPU, tiny with --smoke), --work DIR, --keep.
#
# GPU sizes: N videos made with GStreamer (videotestsrc ! vp8enc ! matroskamux, 832x480, 81 frames);
# csvvideosrc ! vaeencoder device=D (a Wan 2.1 VAE of the real layout, random weights:
# videotrain-make-vae --family wan21) ! textencoder device=D (umT5 of the real width, d_model 4096,
# 64 heads, d_ff 10240, cut to 2 layers, random weights: bench/t5_peer.py --write; tokenizer the
# reference umt5_tiny's; max-length 512: its cost per caption is small next to a step and the
# second run takes it from the cache) ! queue ! microbatcher batch 1 ! ddptrainsink device=D with
# the real Wan 2.1 1.3B transformer config (random bf16 weights: videotrain-model init), bf16,
# gradient checkpointing, AdamW, no checkpoints. Run twice: with a fresh cache-dir (every clip
# decoded and encoded, captions encoded) and again over the filled one (latents and text from the
# cache). Then wan-bench on the same transformer folder at the same latent shape (21x60x104, text
# 512, checkpointing, AdamW): the DiT step alone. Step time: the median of the gaps between the
# steps' metrics lines after the first `warm` steps. Peak memory: nvidia-smi's memory.used of the
# device, polled (CUDA context and the caching allocator's reserve included), or peak RSS on CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD
smoke=0 build='' device='' clips='' steps='' work='' keep=0 nobuild=0 te=''
while (($#)); do
  case $1 in
    --smoke) smoke=1; shift ;;
    --build) build=$2; shift 2 ;;
    --no-build) nobuild=1; shift ;;
    --device) device=$2; shift 2 ;;
    --clips) clips=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --text-encoder) te=$2; shift 2 ;;
    *) echo "pipeline-bench.sh: unknown option $1 (see the head of the script)" >&2; exit 2 ;;
  esac
done
t_start=$(date +%s)
if ((smoke)); then
  build=${build:-build} device=${device:-cpu} clips=${clips:-4} steps=${steps:-4} warm=1 te=${te:-tiny}
  W=64 H=64 F=9 LF=3 LH=8 LW=8 TEXT=16 dtype=float32
  py=${PYTHON:-python3}
  command -v gst-launch-1.0 >/dev/null || { echo "pipeline-bench.sh: no gst-launch-1.0 on PATH" >&2; exit 1; }
else
  build=${build:-build-gpu} device=${device:-cuda:0} clips=${clips:-6} steps=${steps:-6} warm=2 te=${te:-wide}
  W=832 H=480 F=81 LF=21 LH=60 LW=104 TEXT=512 dtype=bfloat16
  # GStreamer and the build's packages from .gpu/ (fetch-debs.sh) where the machine has none.
  if ! command -v gst-launch-1.0 >/dev/null || [[ -d ${VT_GPU_DEBS:-.gpu} ]]; then
    source scripts/gpu/env.sh "${VT_GPU_DEBS:-.gpu}"
  fi
  py=${VT_PYTHON:-python3}
  if ((!nobuild)); then
    echo "== build ($build): the plugin, videotrain-model, videotrain-make-vae, wan-bench"
    VT_GPU_BUILD=$build bash scripts/gpu/build.sh plugins/videotrain/libgstvideotrain.so tools/videotrain-model \
      tools/videotrain-make-vae bench/wan-bench
  fi
fi
for t in plugins/videotrain/libgstvideotrain.so tools/videotrain-model tools/videotrain-make-vae bench/wan-bench; do
  [[ -e $build/$t ]] || { echo "pipeline-bench.sh: $build/$t is not built" >&2; exit 1; }
done
if [[ -z $work ]]; then work=$(mktemp -d "${TMPDIR:-/tmp}/pipeline-bench-XXXXXX"); fi
mkdir -p "$work"
((keep)) || trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH=$src/$build/plugins/videotrain
[[ $build = /* ]] && export GST_PLUGIN_PATH=$build/plugins/videotrain
gpu_index=  # nvidia-smi's -i for cuda:N (cuda alone: 0)
if [[ $device == cuda* ]]; then gpu_index=${device#cuda}; gpu_index=${gpu_index#:}; gpu_index=${gpu_index:-0}; fi

echo "== data: $clips videos ${W}x${H}, $F frames (videotestsrc ! vp8enc ! matroskamux)"
mkdir -p "$work/data/videos"
patterns=(smpte ball snow zone-plate pinwheel spokes colors checkers-8 circular gradient bar smpte75)
echo "path,text,num_frames,height,width,aspect_ratio,resolution,fps,split" >"$work/data/train.csv"
for ((i = 0; i < clips; i++)); do
  p=${patterns[$((i % ${#patterns[@]}))]}
  echo "videos/clip$i.mkv,\"a test pattern called $p, clip $i\",$F,$H,$W,$(awk "BEGIN{printf \"%.3f\", $H/$W}"),${H}p,16,train" \
    >>"$work/data/train.csv"
  echo "$i $p"
done | xargs -P "$(nproc)" -n 2 sh -c 'gst-launch-1.0 -q videotestsrc num-buffers='"$F"' pattern=$1 ! \
  video/x-raw,format=I420,width='"$W"',height='"$H"',framerate=16/1 ! vp8enc deadline=1 keyframe-max-dist=16 ! \
  matroskamux ! filesink location='"$work"'/data/videos/clip$0.mkv >/dev/null 2>&1 || echo "video $0 failed" >&2' 
ls "$work"/data/videos/*.mkv >/dev/null

echo "== models"
tokenizer=$src/tests/reference/text_encoder/umt5_tiny
text_dim=32 text_what="the reference umt5_tiny (d_model 32)" text_encoder=$tokenizer
if [[ $te == wide ]]; then
  text_dim=4096 text_what="umT5 d_model 4096 x 2 layers" text_encoder=$work/umt5
  "$py" bench/t5_peer.py --write "$work/umt5" --layers 2 --vocab 1024 >/dev/null &
elif [[ $te != tiny ]]; then
  echo "pipeline-bench.sh: --text-encoder $te is not wide or tiny" >&2; exit 2
fi
if ((smoke)); then
  bash scripts/make_tiny_wan.sh "$work/dit" --latent-channels 4 --text-dim $text_dim --build "$build" >/dev/null
  "$build/tools/videotrain-make-vae" "$work/vae" --family wan21 --tiny >/dev/null
  what="tiny Wan DiT (2 layers, 2x16 heads), tiny Wan 2.1 VAE"
else
  cat >"$work/wan-1.3b.json" <<'JSON'
{"_class_name": "WanTransformer3DModel", "added_kv_proj_dim": null, "attention_head_dim": 128, "cross_attn_norm": true,
 "eps": 1e-06, "ffn_dim": 8960, "freq_dim": 256, "image_dim": null, "in_channels": 16, "num_attention_heads": 12,
 "num_layers": 30, "out_channels": 16, "patch_size": [1, 2, 2], "pos_embed_seq_len": null,
 "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "text_dim": 4096}
JSON
  "$build/tools/videotrain-model" init "$work/wan-1.3b.json" "$work/dit" --dtype bf16 >/dev/null
  "$build/tools/videotrain-make-vae" "$work/vae" --family wan21 >/dev/null
  what="Wan 2.1 1.3B DiT (30 layers), Wan 2.1 VAE (real layout)"
fi
wait  # the text encoder
what="$what, $text_what; random weights"
echo "   $what ($(( $(date +%s) - t_start )) s so far)"

# Runs CMD, its peak memory (MiB) into FILE: nvidia-smi's peak memory.used on a GPU, else peak RSS.
measure() {
  local out=$1; shift
  if [[ -n $gpu_index ]] && command -v nvidia-smi >/dev/null; then
    nvidia-smi -i "$gpu_index" --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$out.smi" &
    local smi=$!
    local rc=0
    "$@" || rc=$?
    kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null || true
    sort -n "$out.smi" | tail -1 >"$out"
    return $rc
  fi
  "$py" -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024))
sys.exit(rc)' "$out" "$@"
}

run_pipeline() {  # NAME
  measure "$work/$1.mem" gst-launch-1.0 -m \
    csvvideosrc location="$work/data/train.csv" buckets="${W}x${H}" frame-buckets=$F num-frames=$F width=$W \
      height=$H fps=0 num-epochs=0 prefetch=2 seed=0 \
    ! vaeencoder model="$work/vae" device="$device" latent=sample cache-dir="$work/cache" \
    ! textencoder tokenizer="$tokenizer" model="$text_encoder" max-length=$TEXT caption-dropout=0 device="$device" \
      cache-dir="$work/cache" \
    ! queue max-size-buffers=16 \
    ! microbatcher batch-size=1 micro-batch-size=1 \
    ! ddptrainsink model="$work/dit" device="$device" lr=1e-5 max-steps="$steps" seed=0 gradient-checkpointing=true \
      checkpoint-dir='""' log-every=1 metrics-file="$work/$1.jsonl" timeout=900 \
    >"$work/$1.log" 2>&1 || { tail -30 "$work/$1.log"; echo "pipeline-bench.sh: the $1 run failed" >&2; exit 1; }
}
echo "== pipeline, fresh cache (every clip decoded and VAE-encoded, captions encoded): $steps steps"
run_pipeline fresh
echo "== pipeline again over the filled cache (latents and text from it): $steps steps"
run_pipeline cached
echo "== the DiT step alone: wan-bench on the same folder, latents ${LF}x${LH}x${LW}, text $TEXT"
measure "$work/dit.mem" "$build/bench/wan-bench" --weights "$work/dit" --peer none --device "$device" --dtype $dtype \
  --latent-frames $LF --latent-height $LH --latent-width $LW --text $TEXT --checkpointing full --optimizer adamw \
  --warmup 2 --steps 5 --workdir "$work/wan-bench" >"$work/dit.log" 2>&1 || {
  cat "$work/dit.log"; echo "pipeline-bench.sh: wan-bench failed" >&2; exit 1; }
sed 's/^/   /' "$work/dit.log"

"$py" - "$work" "$warm" "$steps" "${gpu_index:+GPU}" "$(( $(date +%s) - t_start ))" <<'PY'
import json, re, statistics, sys
work, warm, steps, gpu, elapsed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
mem_kind = "peak GPU memory.used (nvidia-smi)" if gpu else "peak RSS"
def mem(name):
    try:
        return float(open(f"{work}/{name}.mem").read().strip())
    except (OSError, ValueError):
        return float("nan")
def run(name):
    rows = [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
    rows = [r for r in rows if r.get("type") == "step"]
    if len(rows) != steps:
        sys.exit(f"pipeline-bench: the {name} run logged {len(rows)} steps, not {steps}")
    gaps = [b["time"] - a["time"] for a, b in zip(rows, rows[1:])][warm - 1:]
    m = re.search(r"csvvideosrc-epoch, epoch=\(uint\)0, .*?decoded=\(guint64\)(\d+), cached=\(guint64\)(\d+)",
                  open(f"{work}/{name}.log").read())
    clips = "epoch 0: %s decoded, %s from the cache" % m.groups() if m else "no epoch message"
    return statistics.median(gaps), statistics.mean(r["data_wait"] for r in rows[warm:]), rows[-1]["loss"], clips
log = open(f"{work}/dit.log").read()
m = re.search(r"ours .*?median step ([0-9.]+) s", log)
dit = float(m.group(1)) if m else float("nan")
print(f"\npipeline-bench summary ({elapsed} s in all; steps {warm + 1}..{steps} of each run; {mem_kind}, MiB):")
print(f"  DiT step alone (wan-bench)          {dit:7.3f} s/step                      {mem('dit'):9.0f} MiB")
for name, what in (("fresh", "pipeline, decode + encode"), ("cached", "pipeline, latent cache")):
    s, wait, loss, clips = run(name)
    print(f"  {what:35s} {s:7.3f} s/step  data wait {100 * wait:5.1f}%   {mem(name):9.0f} MiB"
          f"   pipeline/DiT {s / dit:.3f}  ({clips}; last loss {loss:.4g})")
print("  pipeline/DiT 1.00: decoding and encoding hidden behind training; above: the step waits for data")
PY
