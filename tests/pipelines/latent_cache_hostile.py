"""vaeencoder's latent cache against hostile entries, in real pipelines (csvvideosrc ! vaeencoder
cache-dir ! appsink), each run in a child process watched from here:
- an entry swapped with another key's, one with a permuted shape, another dtype or NaN moments
  (all with valid checksums) is a miss with a warning, encoded again and rewritten: the latents are
  those of a run without a cache, and the next run hits; `videotrain-cache verify` reports each;
- a FIFO where an entry belongs: the clip is a miss, and stopping the pipeline mid-run ends it
  within seconds (the source's workers used to block in the entry's open), in an app and through
  videotrain-run's SIGTERM (status 143);
- a /dev/zero symlink and 1 GB sparse entries cost no memory beyond the run's own (peak RSS within
  a few MB of a run whose entries were deleted);
- a header declaring 16 TB (as a shape, as a payload): a warning and a re-encode, no abort."""
import hashlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

build, src = os.environ["VIDEOTRAIN_BUILD_DIR"], os.environ["VIDEOTRAIN_SOURCE_DIR"]
python = sys.executable


def child(cfg):
    """Runs one pipeline; prints latents' digests, epoch messages, warnings, peak RSS, stop time."""
    import gi
    gi.require_version("Gst", "1.0")
    from gi.repository import Gst
    Gst.init(None)
    cache = f"cache-dir={cfg['cache']}" if cfg["cache"] else ""
    desc = (f"csvvideosrc location={cfg['csv']} num-frames=9 width=32 height=32 num-epochs={cfg['epochs']} "
            f"clip-windows=1 prefetch=2 seed=3 ! vaeencoder name=enc model={cfg['vae']} seed=5 {cache} ! "
            f"appsink name=sink sync=false emit-signals=false max-buffers=0")
    p = Gst.parse_launch(desc)
    sink, bus = p.get_by_name("sink"), p.get_bus()
    p.set_state(Gst.State.PLAYING)
    out = {"latents": [], "epochs": [], "warnings": [], "stop_s": 0.0}
    start = time.monotonic()

    def pull(timeout):
        sample = sink.emit("try-pull-sample", timeout)
        if sample:
            buf = sample.get_buffer()
            ok, info = buf.map(Gst.MapFlags.READ)
            out["latents"].append(hashlib.sha256(bytes(info.data)).hexdigest())
            buf.unmap(info)
        return sample

    while True:
        pull(10 * Gst.MSECOND)
        if cfg.get("stop_after") and time.monotonic() - start > cfg["stop_after"]:
            break
        m = bus.pop_filtered(Gst.MessageType.EOS | Gst.MessageType.ERROR | Gst.MessageType.WARNING |
                             Gst.MessageType.ELEMENT)
        if not m:
            continue
        if m.type == Gst.MessageType.ERROR:
            err, dbg = m.parse_error()
            out["error"] = f"{err.message} ({dbg})"
            break
        if m.type == Gst.MessageType.WARNING:
            out["warnings"].append(m.parse_warning()[1] or "")
        if m.type == Gst.MessageType.ELEMENT and m.get_structure().get_name() == "csvvideosrc-epoch":
            s = m.get_structure()
            out["epochs"].append([s.get_value("decoded"), s.get_value("cached")])
        if m.type == Gst.MessageType.EOS:
            while pull(0):
                pass
            break
    t = time.monotonic()
    p.set_state(Gst.State.NULL)
    out["stop_s"] = time.monotonic() - t
    out["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("RESULT " + json.dumps(out), flush=True)


if len(sys.argv) > 2 and sys.argv[1] == "--child":
    child(json.loads(sys.argv[2]))
    sys.exit(0)

tmp = tempfile.mkdtemp(prefix="latent-cache-hostile-")
subprocess.run(["bash", f"{src}/scripts/make_dataset.sh", f"{tmp}/data", "5"], check=True, stdout=subprocess.DEVNULL)
subprocess.run([f"{build}/tools/videotrain-make-vae", f"{tmp}/vae", "--tiny", "--seed", "1"],
               check=True, stdout=subprocess.DEVNULL)
with open(f"{tmp}/data/train.csv") as f:
    rows = [l for l in f if "corrupt" not in l]
with open(f"{tmp}/data/good.csv", "w") as f:
    f.writelines(rows)
N = len(rows) - 1
failures, passed = [], []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    (passed if cond else failures).append(what)


def run(cache=f"{tmp}/cache", epochs=1, stop_after=0, limit_s=120):
    """The child's result; a child that hangs or grows past 4 GB is killed and fails."""
    cfg = {"csv": f"{tmp}/data/good.csv", "vae": f"{tmp}/vae", "cache": cache, "epochs": epochs,
           "stop_after": stop_after}
    proc = subprocess.Popen([python, __file__, "--child", json.dumps(cfg)], stdout=subprocess.PIPE, text=True)
    deadline, killed = time.monotonic() + limit_s, ""
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
            if rss > 4 << 20:
                killed = f"grew to {rss // 1024} MB"
        except (OSError, StopIteration):
            pass
        if time.monotonic() > deadline:
            killed = f"still running after {limit_s} s"
        if killed:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return {"killed": killed, "latents": [], "epochs": [], "warnings": [], "maxrss_kb": 0, "stop_s": 0}
        time.sleep(0.05)
    line = next((l for l in proc.stdout.read().splitlines() if l.startswith("RESULT ")), None)
    if not line:
        return {"killed": f"exit status {proc.returncode}", "latents": [], "epochs": [], "warnings": [],
                "maxrss_kb": 0, "stop_s": 0}
    return json.loads(line[len("RESULT "):])


def entries():
    out = []
    for root, _, files in os.walk(f"{tmp}/cache/v2"):
        out += [os.path.join(root, n) for n in files if not n.startswith(".tmp-")]
    return sorted(out)


def read_entry(path):
    with open(path, "rb") as f:
        b = f.read()
    hlen = struct.unpack("<I", b[8:12])[0]
    return json.loads(b[24:24 + hlen]), b[24 + hlen:]


def write_entry(path, header, payload, declared_payload=None):
    """An entry with a valid checksum over whatever it says."""
    h = json.dumps(header).encode()
    crc = zlib.crc32(h + payload)
    n = len(payload) if declared_payload is None else declared_payload
    with open(path, "wb") as f:
        f.write(b"VTCACHE2" + struct.pack("<IIQ", len(h), crc, n) + h + payload)


def unusable(r):
    return sum("unusable latent cache entry" in w for w in r["warnings"])


plain = run(cache=None)
check(len(plain["latents"]) == N and not plain.get("killed"), f"a run without a cache gives {N} latents")
first = run()
check(first["epochs"] == [[N, 0]] and first["latents"] == plain["latents"], f"the cache filled: {first['epochs']}")
paths = entries()
check(len(paths) == N, f"{len(paths)} entries")
hit = run()
check(hit["epochs"] == [[0, N]] and hit["latents"] == plain["latents"], f"every clip hits: {hit['epochs']}")
# The test's own writer is the format: an entry rewritten unchanged still hits.
for p in paths:
    write_entry(p, *read_entry(p))
check(run()["epochs"] == [[0, N]], "entries rewritten by the test's writer unchanged still hit")

# Damaged in four ways, each with a valid checksum; the last entry is left whole.
a, b = paths[0], paths[1]
ha, pa = read_entry(a)
hb, pb = read_entry(b)
write_entry(a, hb, pb)  # swapped between their keys
write_entry(b, ha, pa)
h, pl = read_entry(paths[2])
shape = h["tensors"][0]["shape"]  # [1, C, t, h, w]
h["tensors"][0]["shape"] = [shape[0], shape[2], shape[1], shape[3], shape[4]]  # permuted
write_entry(paths[2], h, pl)
h, pl = read_entry(paths[3])
if N > 4:
    h["tensors"][0]["dtype"], h["tensors"][0]["shape"][-1] = "bfloat16", shape[4] * 2  # retyped
else:
    pl = struct.pack("<f", float("nan")) + pl[4:]  # NaN moments
write_entry(paths[3], h, pl)
verify = subprocess.run([f"{build}/tools/videotrain-cache", "verify", f"{tmp}/cache"], capture_output=True, text=True)
out = verify.stdout
check(verify.returncode == 1 and out.count("another key") == 2 and "expected float32" in out and
      ("non-finite" in out or "bfloat16" in out) and f"{N - 4} entries verified, 4 bad" in out,
      "videotrain-cache verify reports swapped, permuted and retyped/NaN entries:\n" + out)
r = run()
check(r["epochs"] == [[4, N - 4]] and unusable(r) == 4 and r["latents"] == plain["latents"],
      f"swapped, permuted and retyped/NaN entries are misses with a warning each, latents as without a cache: "
      f"{r['epochs']}, {unusable(r)} warnings")
r = run()
check(r["epochs"] == [[0, N]] and r["latents"] == plain["latents"], f"rewritten, they hit: {r['epochs']}")
# NaN (or the other dtype when the first pass used NaN) too.
h, pl = read_entry(paths[0])
pl = pl[:8] + struct.pack("<f", float("inf")) + pl[12:]
write_entry(paths[0], h, pl)
r = run()
check(r["epochs"] == [[1, N - 1]] and any("non-finite" in w for w in r["warnings"]) and r["latents"] == plain["latents"],
      f"infinite moments are a miss: {r['epochs']}")

# 16 TB declared, as a shape over the real payload and as a payload the file lacks.
h, pl = read_entry(paths[1])
h["tensors"][0]["shape"] = [1, 1 << 20, 1 << 20, 1 << 10, 4]
write_entry(paths[1], h, pl)
h, pl = read_entry(paths[2])
write_entry(paths[2], h, pl, declared_payload=16 << 40)
r = run()
check(not r.get("killed") and not r.get("error") and r["epochs"] == [[2, N - 2]] and unusable(r) == 2 and
      r["latents"] == plain["latents"], f"16 TB declared: a warning and a re-encode each: {r.get('killed')} {r['epochs']}")

# Memory: the baseline re-encodes every clip (entries deleted); the hostile run re-encodes every
# clip too, past a /dev/zero symlink and 1 GB sparse entries.
for p in entries():
    os.remove(p)
base = run()
check(base["epochs"] == [[N, 0]], f"baseline: every clip encoded {base['epochs']}")
for i, p in enumerate(entries()):
    h, pl = read_entry(p)
    os.remove(p)
    if i % 2 == 0:
        os.symlink("/dev/zero", p)
    else:
        write_entry(p, h, pl, declared_payload=1 << 30)
        os.truncate(p, os.path.getsize(p) - len(pl) + (1 << 30))
r = run()
over = (r["maxrss_kb"] - base["maxrss_kb"]) // 1024
check(not r.get("killed") and r["epochs"] == [[N, 0]] and unusable(r) == N and r["latents"] == plain["latents"],
      f"/dev/zero and 1 GB sparse entries are misses: {r.get('killed')} {r['epochs']}")
check(r["maxrss_kb"] > 0 and over <= 24, f"peak RSS {r['maxrss_kb'] // 1024} MB, {over} MB over the baseline's")

# A FIFO in every entry's place: misses; a stop in the middle of a longer run ends at once.
for p in entries():
    os.remove(p)
    os.mkfifo(p)
r = run()
check(not r.get("killed") and r["epochs"] == [[N, 0]] and unusable(r) == N and r["latents"] == plain["latents"] and
      all("not a regular file" in w for w in r["warnings"] if "unusable" in w),
      f"FIFO entries are misses: {r.get('killed')} {r['epochs']}")
for p in entries():
    os.remove(p)
    os.mkfifo(p)
r = run(epochs=50, stop_after=1.0, limit_s=60)
check(not r.get("killed") and r["stop_s"] < 5, f"stopped mid-run past FIFO entries in {r['stop_s']:.2f} s {r.get('killed')}")

# The same through videotrain-run, as a job scheduler stops it: SIGTERM mid-run past FIFO entries
# ends the run within seconds with the conventional status 143.
for p in entries():
    if not os.path.exists(p):
        os.mkfifo(p)
desc = (f"csvvideosrc location={tmp}/data/good.csv num-frames=9 width=32 height=32 num-epochs=0 clip-windows=1 "
        f"prefetch=2 seed=3 ! vaeencoder model={tmp}/vae seed=5 cache-dir={tmp}/cache ! fakesink sync=false")
proc = subprocess.Popen([f"{build}/tools/videotrain-run", "-q", "--eos-timeout", "30", desc],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
time.sleep(1.5)
t = time.monotonic()
proc.send_signal(signal.SIGTERM)
try:
    proc.wait(timeout=30)
    took, status = time.monotonic() - t, proc.returncode
except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    took, status = 30.0, "hung"
check(status == 143 and took < 5, f"videotrain-run stopped by SIGTERM past FIFO entries: status {status} in {took:.2f} s")

shutil.rmtree(tmp)
print(f"{len(passed)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
