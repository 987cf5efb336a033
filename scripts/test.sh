#!/usr/bin/env bash
# Fresh Debian bookworm machine to green tests: deps, build, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
rc=0
meson test -C build --print-errorlogs --num-processes "$(nproc)" "$@" || rc=$?
# One closing line that any CI reads: counts of gtest cases over all test programs.
python3 - <<'PY' || true
import json, re
passed = failed = 0
try:
    for line in open("build/meson-logs/testlog.json"):
        t = json.loads(line)
        out = t.get("stdout") or ""
        p = re.search(r"\[  PASSED  \] (\d+) test", out)
        f = re.search(r"\[  FAILED  \] (\d+) test", out)
        if p or f:
            passed += int(p.group(1)) if p else 0
            failed += int(f.group(1)) if f else 0
        elif t.get("result") == "OK":
            passed += 1
        else:
            failed += 1
except FileNotFoundError:
    pass
print(f"tests: {passed} passed, {failed} failed")
PY
exit $rc
