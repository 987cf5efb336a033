#!/usr/bin/env bash
# The public library as an app outside the tree sees it: `meson install` into a temporary
# folder, then
#  - examples/c/appsrc_encode.c compiled only with that folder's pkg-config file
#    (gstreamer-videotrain-1.0) and run against the installed library, and
#  - examples/python/appsrc_encode.py through the installed GstVideoTrain-1.0 typelib,
# each pushing 2 clips of 9 RGB 64x64 frames with clip metas through appsrc ! vaeencoder !
# appsink. Every latent's dims (tensor meta) must be the shape the tiny VAE's config.json
# implies, its bytes the buffer's size, its sample meta the clip's; C and Python read the
# same latents (equal sums).
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
py=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-appsrc-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
frames=9 size=64 clips=2
with_python=1
[[ ${1:-} == --no-python ]] && with_python=0  # configured without introspection: no typelib

meson install -C "$build" --no-rebuild --quiet --destdir "$work/dest" >/dev/null
pc=$(find "$work/dest" -name gstreamer-videotrain-1.0.pc)
[[ -n $pc ]] || { echo "meson install wrote no gstreamer-videotrain-1.0.pc"; exit 1; }
prefix=$(sed -n 's/^prefix=//p' "$pc")
# The pkg-config file names the configured prefix while the files are under DESTDIR: a copy
# with the prefix moved there (--define-variable would move gstreamer-1.0's prefix too).
mkdir "$work/pkgconfig"
sed "s|^prefix=.*|prefix=$work/dest$prefix|" "$pc" > "$work/pkgconfig/gstreamer-videotrain-1.0.pc"
export PKG_CONFIG_PATH="$work/pkgconfig"
libdir=$(pkg-config --variable=libdir gstreamer-videotrain-1.0)
[[ -f $(pkg-config --variable=includedir gstreamer-videotrain-1.0)/gstreamer-1.0/gst/videotrain/videotrain.h ]] ||
  { echo "no installed <gst/videotrain/videotrain.h>"; exit 1; }
typelib=$(find "$work/dest" -name GstVideoTrain-1.0.typelib)
[[ -n $typelib || $with_python == 0 ]] || { echo "meson install wrote no GstVideoTrain-1.0.typelib"; exit 1; }

# shellcheck disable=SC2046
cc -Wall -Wextra -Werror -o "$work/appsrc_encode" "$src/examples/c/appsrc_encode.c" \
  $(pkg-config --cflags --libs gstreamer-videotrain-1.0 gstreamer-app-1.0)
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# (ldd's output is kept first: with pipefail, grep -q closing the pipe early fails `ldd | grep -q`.)
libs=$(ldd "$work/appsrc_encode")
grep -q "libgstvideotrain-1.0.so.0 => $libdir/" <<< "$libs" ||
  { echo "$libs"; echo "appsrc_encode does not use the installed library"; exit 1; }

"$build/tools/videotrain-make-vae" "$work/vae" --seed 5 --tiny >/dev/null
"$work/appsrc_encode" "$work/vae" $frames $size $clips > "$work/c.txt" 2> "$work/c.err" ||
  { cat "$work/c.txt" "$work/c.err"; echo "appsrc_encode failed"; exit 1; }
# docs/sdk.md's command for the uninstalled build tree gives the same program.
# shellcheck disable=SC2046
cc -o "$work/appsrc_encode_uninstalled" "$src/examples/c/appsrc_encode.c" \
  $(PKG_CONFIG_PATH="$build/meson-uninstalled" pkg-config --cflags --libs gstreamer-videotrain-1.0 gstreamer-app-1.0)
LD_LIBRARY_PATH="$build/gst-libs/gst/videotrain" "$work/appsrc_encode_uninstalled" "$work/vae" $frames $size $clips \
  > "$work/c-uninstalled.txt" 2>&1 || { cat "$work/c-uninstalled.txt"; echo "the uninstalled build failed"; exit 1; }
cmp -s "$work/c.txt" "$work/c-uninstalled.txt" ||
  { diff "$work/c.txt" "$work/c-uninstalled.txt"; echo "uninstalled and installed apps differ"; exit 1; }
if ((with_python)); then
  GI_TYPELIB_PATH=$(dirname "$typelib") "$py" "$src/examples/python/appsrc_encode.py" "$work/vae" \
    --frames $frames --size $size --clips $clips > "$work/py.txt" 2> "$work/py.err" ||
    { cat "$work/py.txt" "$work/py.err"; echo "appsrc_encode.py failed"; exit 1; }
else
  cp "$work/c.txt" "$work/py.txt"
  echo "built without introspection: the Python example is not run"
fi
cat "$work/c.txt" "$work/py.txt"

"$py" - "$work/vae/config.json" "$work/c.txt" "$work/py.txt" $frames $size $clips <<'PY'
import json, re, sys
cfg_path, c_path, py_path = sys.argv[1:4]
frames, size, clips = map(int, sys.argv[4:7])
cfg = json.load(open(cfg_path))
# CogVideoX VAE: one 2x spatial downsampling per down block but the last; temporal
# compression keeps frame 0 and one latent frame per ratio frames after it.
spatial = 2 ** (len(cfg["block_out_channels"]) - 1)
ratio = cfg.get("temporal_compression_ratio", 4)
want = [cfg["latent_channels"], 1 + (frames - 1) // ratio, size // spatial, size // spatial]
line = re.compile(r"latent sample=(\d+) dims=\[([\d, ]+)\] dtype=(\w+) device=(\S+) bytes=(\d+) buffer=(\d+) "
                  r"sum=(\S+) caption=(.*)")
def read(path, who):
    got = [line.fullmatch(l.strip()) for l in open(path) if l.strip()]
    if len(got) != clips or not all(got):
        sys.exit(f"{who}: expected {clips} latent lines, got {open(path).read()!r}")
    out = []
    for i, m in enumerate(got):
        dims = [int(d) for d in m.group(2).split(",")]
        if dims != want:
            sys.exit(f"{who}: latent {i} has dims {dims}, the VAE config implies {want}")
        if int(m.group(1)) != i or m.group(8) != f"a colour ramp, clip {i}":
            sys.exit(f"{who}: latent {i} carries sample {m.group(1)} '{m.group(8)}'")
        n = 4
        for d in dims:
            n *= d
        if m.group(3) != "float32" or m.group(4) != "cpu" or int(m.group(5)) != n or int(m.group(6)) != n:
            sys.exit(f"{who}: latent {i}: {m.group(0)} (want float32 on cpu, {n} bytes)")
        out.append(float(m.group(7)))
    return out
c, p = read(c_path, "C"), read(py_path, "Python")
for a, b in zip(c, p):
    if abs(a - b) > 1e-4 * max(1.0, abs(a)):
        sys.exit(f"C and Python read different latents: sums {c} and {p}")
if c[0] == c[1]:
    sys.exit(f"both clips gave the same latent sum {c[0]}: the frames did not reach the encoder")
print(f"C and Python: {clips} latents of dims {want}, sums {c}")
PY
