#!/usr/bin/env bash
# The project on PyPI's current torch: .venv-torch2/ with the pinned packages of
# scripts/torch2-requirements.txt (torch with CUDA and NCCL, diffusers, transformers, peft, ...),
# and build-torch2/ built against that LibTorch with the CUDA and NCCL paths compiled and linked.
#   bash scripts/torch2.sh            installs what is missing, configures once, builds
#   bash scripts/torch2.sh test [ARGS]  the same, then the torch2 suite (meson test ARGS) on the CPU
# On a GPU machine that has apt this is also the build to use: the same build runs the CUDA paths
# there (tests/gpu). scripts/gpu/ is for GPU machines without GStreamer or network.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=build
if [[ ${1:-} == test ]]; then
  mode=test
  shift
fi

bash scripts/deps.sh --torch2

# The venv: Debian's python3 (whose gi, GStreamer's bindings, the tests use) with the pinned
# packages over its own; reinstalled when the requirements file changes.
venv=.venv-torch2
req=scripts/torch2-requirements.txt
stamp=$venv/.requirements
if [[ ! -x $venv/bin/python ]] || ! cmp -s "$req" "$stamp"; then
  echo "torch2: installing $req into $venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req"
  cp "$req" "$stamp"
fi
py=$PWD/$venv/bin/python
torch_dir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
site=$(dirname "$torch_dir")

# The CUDA headers that LibTorch's CUDA headers include: the wheel keeps them apart (cuda runtime,
# cuBLAS, cuSPARSE, cuSOLVER, NCCL under site-packages/nvidia), else the CUDA toolkit's.
inc=()
for d in "$site"/nvidia/cu*/include "$site"/nvidia/*/include /usr/local/cuda/include; do
  [[ -d $d ]] && inc+=("$d")
done
incs=$(IFS=,; echo "${inc[*]}")

build=build-torch2
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build" -Dcpp_std=c++20 -Dtorch_prefix="$torch_dir" -Dcuda=enabled -Dnccl=enabled -Dinterop=enabled \
    -Dtorch_extra_includes="$incs" -Dtest_python="$py"
fi
ninja -C "$build"
[[ $mode == test ]] || exit 0

export LD_LIBRARY_PATH=$torch_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
rc=0
meson test -C "$build" --print-errorlogs --num-processes "$(nproc)" --suite torch2 "$@" || rc=$?
/usr/bin/python3 scripts/test_summary.py "$build/meson-logs/testlog.json" torch2 || true
exit $rc
