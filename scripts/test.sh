#!/usr/bin/env bash
# Fresh Debian bookworm machine to green tests: deps, build, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
rc=0
meson test -C build --print-errorlogs --num-processes "$(nproc)" "$@" || rc=$?
# One closing line that any CI reads: counts of gtest cases over all test programs (a test
# program that is not gtest counts as one case).
python3 - <<'PY' || true
import json, re
passed = failed = skipped = 0
try:
    for line in open("build/meson-logs/testlog.json"):
        t = json.loads(line)
        out = t.get("stdout") or ""
        p = re.search(r"\[  PASSED  \] (\d+) test", out)
        f = re.search(r"\[  FAILED  \] (\d+) test", out)
        k = re.search(r"\[  SKIPPED \] (\d+) test", out)
        if p or f or k:
            passed += int(p.group(1)) if p else 0
            failed += int(f.group(1)) if f else 0
            skipped += int(k.group(1)) if k else 0
        elif t.get("result") in ("OK", "EXPECTEDFAIL"):  # an expected failure is a pass (a checker's self-test)
            passed += 1
        elif t.get("result") == "SKIP":
            skipped += 1
        else:
            failed += 1
except FileNotFoundError:
    pass
print(f"tests: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
PY
exit $rc
