#!/usr/bin/env bash
# Builds the libFuzzer targets of the parsers (fuzz/) with clang and runs them.
# Usage: scripts/fuzz.sh [manifest|safetensors|vae_config|all] [seconds per target, default 60]
# Seeds and regression inputs: fuzz/corpus/<target>/ (the meson test fuzz-corpus-<target>
# runs them all). New inputs go to build-fuzz/corpus/<target>/, crashes to
# build-fuzz/crashes/<target>/: copy a crash into fuzz/corpus/<target>/ once it is fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-all}
seconds=${2:-60}
CXX=${CXX_FUZZ:-$(command -v clang++ || command -v clang++-14 || true)}
[[ -n "$CXX" ]] || { echo "fuzz.sh needs clang++ (apt-get install clang libclang-rt-dev)" >&2; exit 1; }
targets=(manifest safetensors vae_config)
[[ "$target" == all ]] || targets=("$target")
out=build-fuzz
mkdir -p "$out"
flags=(-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined,float-cast-overflow -fno-sanitize-recover=all
       -Ielements -Ielements/common -Ifuzz)
for t in "${targets[@]}"; do
  case $t in
    manifest) srcs=(elements/csvvideosrc/manifest.cpp); extra=($(pkg-config --cflags --libs glib-2.0)) ;;
    safetensors) srcs=(elements/common/safetensors.cpp); extra=() ;;
    vae_config) srcs=(elements/vaeencoder/vae_config.cpp elements/common/safetensors.cpp); extra=() ;;
    *) echo "unknown target '$t' (manifest, safetensors, vae_config, all)" >&2; exit 1 ;;
  esac
  echo "== $t: building $out/fuzz-$t"
  "$CXX" "${flags[@]}" "fuzz/fuzz_$t.cpp" "${srcs[@]}" "${extra[@]}" -o "$out/fuzz-$t"
  mkdir -p "$out/corpus/$t" "$out/crashes/$t"
  echo "== $t: fuzzing for ${seconds}s"
  # -rss_limit_mb: a config that makes the parser grow memory without bound is a finding.
  nice -n 10 "$out/fuzz-$t" -max_total_time="$seconds" -rss_limit_mb=1024 -max_len=4096 -timeout=10 \
    -artifact_prefix="$out/crashes/$t/" -print_final_stats=1 "$out/corpus/$t" "fuzz/corpus/$t"
done
