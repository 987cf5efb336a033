"""Shared by the interop tests: the real diffusers, transformers and peft (PyPI, .venv-torch2)
compute the references live; our side runs through the built tools.

A test that cannot import a package skips (exit 77) saying which and how to get it, except in the
torch2 suite (VIDEOTRAIN_TORCH2=1, set by `meson setup -Dinterop=enabled`), where it fails."""
import importlib
import os
import subprocess
import sys
import tempfile

SKIP = 77


def need(*modules):
    """Imports and returns the modules, or ends the test: skipped outside the torch2 suite."""
    out = []
    for name in modules:
        try:
            out.append(importlib.import_module(name))
        except Exception as e:  # ImportError, or a package that imports but breaks
            msg = f"needs {name} ({type(e).__name__}: {e}); run it with `bash scripts/torch2.sh test`"
            if os.environ.get("VIDEOTRAIN_TORCH2") == "1":
                print("FAIL:", msg)
                sys.exit(1)
            print("SKIP:", msg)
            sys.exit(SKIP)
    return out[0] if len(out) == 1 else out


def tool(name):
    return os.path.join(os.environ["VIDEOTRAIN_BUILD_DIR"], "tools", name)


def run(*args, check=True):
    """Runs a command, printing it and its output; returns the CompletedProcess."""
    args = [str(a) for a in args]
    print("$", " ".join(args), flush=True)
    p = subprocess.run(args, capture_output=True, text=True)
    sys.stdout.write(p.stdout)
    sys.stdout.write(p.stderr)
    if check and p.returncode != 0:
        fail(f"{os.path.basename(args[0])} exited {p.returncode}")
    return p


def source_dir():
    return os.environ["VIDEOTRAIN_SOURCE_DIR"]


def reference_dir(*parts):
    return os.path.join(os.environ["VIDEOTRAIN_REFERENCE_DIR"], *parts)


def tempdir():
    d = tempfile.TemporaryDirectory(prefix="vt-interop-")
    return d


def rel(a, b):
    """Relative L2 distance of b from a (float64)."""
    import torch
    a = a.detach().double().cpu()
    b = b.detach().double().cpu()
    if a.shape != b.shape:
        fail(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return float((a - b).norm() / a.norm().clamp_min(1e-30))


failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def close(a, b, tol, what):
    r = rel(a, b)
    check(r <= tol, f"{what}: rel L2 {r:.3g} (tolerance {tol:g})")
    return r


def fail(what):
    print("FAIL:", what, flush=True)
    sys.exit(1)


def finish():
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")
