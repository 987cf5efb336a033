#!/usr/bin/python3
"""Compiles the CUDA and NCCL paths on a machine whose LibTorch has no CUDA.

The sources guard those paths with VIDEOTRAIN_HAVE_CUDA and USE_C10D_NCCL, so a CPU
build never compiles them. Here every source that uses either macro (and
tests/gpu/test_cuda_paths.cpp) is compiled with -fsyntax-only, both macros defined,
against the same LibTorch headers plus the CUDA toolkit's (cuda_runtime_api.h and
nccl.h): a typo or an API that this LibTorch lacks fails the test instead of the first
GPU machine. Nothing is linked or run.

  compile_cuda_paths.py BUILD_DIR SOURCE_DIR

Exit 77 (skipped) where no CUDA toolkit headers exist (CUDA_HOME, /usr/local/cuda*),
or where the build has CUDA already (the build itself compiles those paths).
"""
import concurrent.futures
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

MACROS = ("VIDEOTRAIN_HAVE_CUDA", "USE_C10D_NCCL")


def cuda_includes():
    roots = [os.environ.get("CUDA_HOME", "")] + sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    dirs = []
    for r in roots:
        inc = os.path.join(r, "include") if r else ""
        if inc and os.path.exists(os.path.join(inc, "cuda_runtime_api.h")):
            dirs.append(inc)
            break
    if not dirs:
        return None
    if not os.path.exists(os.path.join(dirs[0], "nccl.h")):
        found = glob.glob("/usr/include/nccl.h") + glob.glob("/usr/local/cuda*/include/nccl.h")
        if not found:
            return None
        dirs.append(os.path.dirname(found[0]))
    return dirs


def syntax_command(entry, extra):
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MQ", "-MT"):
            skip = True
            continue
        if a in ("-MD", "-MMD", "-c"):
            continue
        out.append(a)
    return out + ["-fsyntax-only"] + [f"-D{m}=1" for m in MACROS] + extra


def main():
    build, source = sys.argv[1], sys.argv[2]
    entries = json.load(open(os.path.join(build, "compile_commands.json")))
    if any("-DVIDEOTRAIN_HAVE_CUDA=1" in (e.get("command") or " ".join(e.get("arguments", []))) for e in entries):
        print("SKIP: this build has CUDA, so it compiles the CUDA paths itself")
        return 77
    inc = cuda_includes()
    if inc is None:
        print("SKIP: no CUDA toolkit headers (cuda_runtime_api.h and nccl.h under CUDA_HOME or /usr/local/cuda*)")
        return 77
    guarded = re.compile("|".join(MACROS))
    chosen = []
    for e in entries:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if not path.endswith(".cpp") or not os.path.realpath(path).startswith(os.path.realpath(source) + os.sep):
            continue
        text = open(path, encoding="utf-8").read()
        if guarded.search(text) or path.endswith("tests/gpu/test_cuda_paths.cpp"):
            chosen.append((path, e))
    if not chosen:
        print("FAIL: no source uses " + " or ".join(MACROS) + "; is compile_commands.json complete?")
        return 1
    with tempfile.TemporaryDirectory() as stub:
        # Generated at LibTorch's build time, and left out by packages without CUDA.
        os.makedirs(os.path.join(stub, "c10/cuda/impl"))
        with open(os.path.join(stub, "c10/cuda/impl/cuda_cmake_macros.h"), "w") as f:
            f.write("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        extra = [f"-I{d}" for d in inc] + [f"-I{stub}"]

        def compile_one(item):
            path, e = item
            r = subprocess.run(syntax_command(e, extra), cwd=e["directory"], capture_output=True, text=True)
            return path, r.returncode, r.stderr

        failed = 0
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            for path, rc, err in pool.map(compile_one, chosen):
                rel = os.path.relpath(path, source)
                if rc == 0:
                    print(f"ok    {rel}")
                else:
                    failed += 1
                    errors = [l for l in err.splitlines() if "error" in l]
                    print(f"FAIL  {rel}\n" + "\n".join(errors[:20]))
    print(f"{len(chosen) - failed} of {len(chosen)} sources compile with {' and '.join(MACROS)} "
          f"(CUDA headers from {', '.join(inc)})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
