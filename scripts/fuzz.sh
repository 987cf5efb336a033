#!/usr/bin/env bash
# Builds the libFuzzer targets of the parsers (fuzz/) with clang and runs them.
# Usage: scripts/fuzz.sh [TARGET|all] [seconds per target, default 60]
# The targets and their sources are listed once, in fuzz/targets.txt (fuzz/meson.build reads it
# too). Seeds and regression inputs: fuzz/corpus/<target>/ (the meson test fuzz-corpus-<target>
# runs them all). New inputs go to build-fuzz/corpus/<target>/, crashes to
# build-fuzz/crashes/<target>/: copy a crash into fuzz/corpus/<target>/ once it is fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-all}
seconds=${2:-60}
CXX=${CXX_FUZZ:-$(command -v clang++ || command -v clang++-14 || true)}
[[ -n "$CXX" ]] || { echo "fuzz.sh needs clang++ (scripts/deps.sh --fuzz, or apt-get install clang)" >&2; exit 1; }
declare -A deps srcs
targets=()
while read -r name dep files; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  targets+=("$name"); deps[$name]=$dep; srcs[$name]=$files
done < fuzz/targets.txt
if [[ "$target" != all ]]; then
  [[ -n "${srcs[$target]:-}" ]] || { echo "unknown target '$target' (${targets[*]}, all)" >&2; exit 1; }
  targets=("$target")
fi
out=build-fuzz
mkdir -p "$out"
flags=(-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined,float-cast-overflow -fno-sanitize-recover=all
       -Ielements -Ielements/common -Ifuzz)
results=()
failed=0
for t in "${targets[@]}"; do
  extra=()
  [[ ",${deps[$t]}," == *,glib,* ]] && extra+=($(pkg-config --cflags --libs glib-2.0))
  [[ ",${deps[$t]}," == *,json,* ]] && extra+=($(pkg-config --cflags nlohmann_json 2>/dev/null || true))
  echo "== $t: building $out/fuzz-$t"
  # shellcheck disable=SC2086  # the source list splits on spaces
  "$CXX" "${flags[@]}" "fuzz/fuzz_$t.cpp" ${srcs[$t]} "${extra[@]}" -o "$out/fuzz-$t"
  mkdir -p "$out/corpus/$t" "$out/crashes/$t"
  echo "== $t: fuzzing for ${seconds}s"
  # -rss_limit_mb: an input that makes the parser grow memory without bound is a finding.
  # A crash in one target does not stop the others: each is reported at the end.
  if nice -n 10 "$out/fuzz-$t" -max_total_time="$seconds" -rss_limit_mb=1024 -max_len=4096 -timeout=10 \
       -artifact_prefix="$out/crashes/$t/" -print_final_stats=1 "$out/corpus/$t" "fuzz/corpus/$t"; then
    results+=("$t: ok")
  else
    results+=("$t: FAILED (crash input in $out/crashes/$t/)")
    failed=$((failed + 1))
  fi
done
echo "== fuzz.sh: ${#targets[@]} target(s), $failed failed"
printf '   %s\n' "${results[@]}"
((failed == 0))
