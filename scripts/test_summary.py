#!/usr/bin/python3
"""One closing line that any CI reads: counts of gtest cases over all test programs of a meson
test log (a test program that is not gtest counts as one case).

  test_summary.py TESTLOG_JSON [LABEL]
"""
import json
import re
import sys

passed = failed = skipped = 0
try:
    for line in open(sys.argv[1]):
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
label = sys.argv[2] if len(sys.argv) > 2 else "tests"
print(f"{label}: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
