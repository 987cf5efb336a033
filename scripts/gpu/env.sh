# Sourced on a GPU machine without GStreamer: unpacks the Debian packages that
# scripts/gpu/fetch-debs.sh downloaded into a private prefix (never over /, whose
# own libraries may be newer) and points pkg-config, the loader and GStreamer at it.
#   source scripts/gpu/env.sh [DEBS_DIR]   (default $VT_GPU_DEBS, else .gpu)
# Only a folder is taken as DEBS_DIR: a script that sources this file passes its own
# arguments on unless it names one, and those are not ours (`build.sh -j 16`).
_vt_debs=${VT_GPU_DEBS:-.gpu}
if [[ $# -ge 1 && -d $1 ]]; then
  _vt_debs=$1
fi
export VT_GPU_ROOT=${VT_GPU_ROOT:-/tmp/vt-gpu-root}
# Unpacked again whenever the set of .debs changes (one added, one updated): the stamp
# holds their names and sizes.
_vt_set=$(cd "$_vt_debs" 2>/dev/null && ls -l -- *.deb 2>/dev/null | awk '{print $5, $NF}')
if [[ -z $_vt_set ]]; then
  echo "scripts/gpu/env.sh: no .deb files in '$_vt_debs' (run scripts/gpu/fetch-debs.sh where there is network)" >&2
  return 1 2>/dev/null || exit 1
fi
if [[ ! -f $VT_GPU_ROOT/.unpacked ]] || [[ $(cat "$VT_GPU_ROOT/.unpacked") != "$_vt_set" ]]; then
  mkdir -p "$VT_GPU_ROOT"
  for f in "$_vt_debs"/*.deb; do dpkg -x "$f" "$VT_GPU_ROOT"; done
  # Debian's .pc files say /usr: make them name the prefix; nothing here links
  # statically, so the private requirements (whose .pc files are not carried) go.
  find "$VT_GPU_ROOT" -name '*.pc' -path '*pkgconfig*' -exec sed -i \
    -e '/^Requires.private:/d' -e "s|=/usr|=$VT_GPU_ROOT/usr|g" -e "s|-I/usr|-I$VT_GPU_ROOT/usr|g" -e "s|-L/usr|-L$VT_GPU_ROOT/usr|g" {} +
  printf '%s\n' "$_vt_set" >"$VT_GPU_ROOT/.unpacked"
fi
_vt_lib=$VT_GPU_ROOT/usr/lib/x86_64-linux-gnu
export PATH=$VT_GPU_ROOT/usr/bin:$PATH
export LD_LIBRARY_PATH=$_vt_lib:$VT_GPU_ROOT/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG=$VT_GPU_ROOT/usr/bin/pkgconf
export PKG_CONFIG_LIBDIR=$_vt_lib/pkgconfig:$VT_GPU_ROOT/usr/share/pkgconfig
export GST_PLUGIN_SYSTEM_PATH_1_0=$_vt_lib/gstreamer-1.0
export GST_PLUGIN_SCANNER_1_0=$_vt_lib/gstreamer1.0/gstreamer-1.0/gst-plugin-scanner
export GST_REGISTRY_1_0=$VT_GPU_ROOT/registry.bin
# The pip LibTorch (with CUDA and NCCL) of the python3 on PATH.
VT_TORCH_PREFIX=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
VT_PYTHON=$(command -v python3)
export VT_TORCH_PREFIX VT_PYTHON
export LD_LIBRARY_PATH=$VT_TORCH_PREFIX/lib:$LD_LIBRARY_PATH
unset _vt_debs _vt_lib _vt_set
