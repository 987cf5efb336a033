#!/usr/bin/env bash
# A clone alone passes its tests: no test, bench, script, pipeline or element reads the workspace's
# ../shared folder (reference data lives in tests/reference/). Usage: no_outside_files.sh ROOT.
# Lists each offending line and exits 1 when there is one.
set -u
root=${1:?usage: no_outside_files.sh ROOT}
cd "$root" || exit 2
hits=$(grep -rnE '\.\./shared|shared/reference' --include='*.cpp' --include='*.h' --include='*.c' --include='*.py' \
  --include='*.sh' --include='*.build' --include='*.pipeline' --include='*.txt' \
  tests bench scripts elements tools pipelines examples fuzz plugins 2>/dev/null |
  grep -v -e '^tests/layout/no_outside_files.sh:' -e '^tests/layout/bad/')
if [[ -n $hits ]]; then
  echo "files that read ../shared (copy the data into tests/reference/ and read it there):"
  echo "$hits"
  exit 1
fi
exit 0
