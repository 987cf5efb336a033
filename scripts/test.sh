#!/usr/bin/env bash
# Fresh Debian bookworm machine to green tests: deps, build, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
rc=0
meson test -C build --print-errorlogs --num-processes "$(nproc)" "$@" || rc=$?
/usr/bin/python3 scripts/test_summary.py build/meson-logs/testlog.json || true
exit $rc
