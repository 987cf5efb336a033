#!/usr/bin/env bash
# Makes a small video dataset with GStreamer itself (no downloads):
#   scripts/make_dataset.sh OUTDIR [COUNT]
# OUTDIR gets COUNT mp4/mkv videos of test patterns (sizes, lengths and aspect ratios vary),
# train.csv (Open-Sora columns, with a split column), val.csv, and one corrupt file that
# the manifest lists on purpose, to show replacement of bad samples.
set -euo pipefail
out=${1:?usage: make_dataset.sh OUTDIR [COUNT]}
count=${2:-12}
mkdir -p "$out/videos"
patterns=(smpte ball snow zone-plate circular pinwheel spokes gradient colors checkers-8 smpte75 bar)
captions=("colour bars with a moving noise strip" "a white ball bouncing on black"
          "television static" "a zone plate of rings moving outwards" "concentric circles"
          "a turning pinwheel" "spokes of a wheel" "a vertical grey gradient" "vertical colour stripes"
          "a fine checkerboard" "colour bars at 75 percent" "a white bar moving across")
sizes=("160x120" "128x128" "192x108" "96x128")
echo "path,text,num_frames,height,width,aspect_ratio,resolution,fps,split" > "$out/manifest.csv"
for ((i = 0; i < count; i++)); do
  p=${patterns[$((i % ${#patterns[@]}))]}
  cap=${captions[$((i % ${#captions[@]}))]}
  size=${sizes[$((i % ${#sizes[@]}))]}
  w=${size%x*}; h=${size#*x}
  frames=$((40 + (i * 7) % 40))
  # H.264 in MP4 mostly (openh264), VP8 in Matroska for every fourth.
  ext=mp4; enc="openh264enc gop-size=8 ! h264parse ! mp4mux"
  if ((i % 4 == 3)); then ext=mkv; enc="vp8enc deadline=1 keyframe-max-dist=8 ! matroskamux"; fi
  f="videos/clip$(printf %03d "$i").$ext"
  if [[ ! -s "$out/$f" ]]; then
    gst-launch-1.0 -q videotestsrc num-buffers=$frames pattern=$p ! \
      video/x-raw,format=I420,width=$w,height=$h,framerate=8/1 ! $enc ! filesink location="$out/$f" \
      >/dev/null 2>&1
  fi
  split=train; if ((i % 6 == 5)); then split=val; fi
  ar=$(awk "BEGIN{printf \"%.3f\", $h/$w}")
  echo "$f,\"$cap, clip $i\",$frames,$h,$w,$ar,${h}p,8,$split" >> "$out/manifest.csv"
done
head -c 3000 /dev/urandom > "$out/videos/corrupt.mp4"
echo "videos/corrupt.mp4,\"a file that is not a video\",40,120,160,0.75,120p,8,train" >> "$out/manifest.csv"
grep -E ',(train)$|^path' "$out/manifest.csv" > "$out/train.csv"
grep -E ',(val)$|^path' "$out/manifest.csv" > "$out/val.csv"
echo "dataset: $out ($(($(wc -l < "$out/train.csv") - 1)) train rows, $(($(wc -l < "$out/val.csv") - 1)) val rows)"
