"""vaeencoder's latent cache in real pipelines (csvvideosrc ! [elements] ! vaeencoder cache-dir ! appsink):
- latents from the cache equal on-the-fly latents byte for byte (latent=sample, noise by seed, sample
  and epoch), and a cached epoch decodes nothing (csvvideosrc-epoch decoded=0, cached=N);
- every part of the key misses when changed: frames, stride, size, fit, an element between source and
  encoder or its setting, the VAE's weights, dtype, chunking, tiles, norm-scope, a video's content (same path,
  size and time); a moved dataset and a VAE folder copied elsewhere still hit;
- damaged entries are warnings, encoded again and rewritten; read mode writes nothing, write mode
  reads nothing."""
import os
import shutil
import subprocess
import sys
import tempfile

import gi

gi.require_version("Gst", "1.0")
from gi.repository import Gst  # noqa: E402

build, src = os.environ["VIDEOTRAIN_BUILD_DIR"], os.environ["VIDEOTRAIN_SOURCE_DIR"]
Gst.init(None)
tmp = tempfile.mkdtemp(prefix="latent-cache-")
subprocess.run(["bash", f"{src}/scripts/make_dataset.sh", f"{tmp}/data", "5"], check=True, stdout=subprocess.DEVNULL)
for seed in (1, 2):
    subprocess.run([f"{build}/tools/videotrain-make-vae", f"{tmp}/vae{seed}", "--tiny", "--seed",
                    str(seed)], check=True, stdout=subprocess.DEVNULL)
# The corrupt row is left out: every row here is a clip.
with open(f"{tmp}/data/train.csv") as f:
    rows = [l for l in f if "corrupt" not in l]
with open(f"{tmp}/data/good.csv", "w") as f:
    f.writelines(rows)
N = len(rows) - 1
failures, passed = [], []


def run(src_props="", between="", enc_props="", epochs=1, cache=f"{tmp}/cache", data=f"{tmp}/data", vae="vae1"):
    """Latent bytes by (epoch, clip index), csvvideosrc-epoch messages, warnings."""
    cache_prop = f"cache-dir={cache}" if cache else ""
    desc = (f"csvvideosrc location={data}/good.csv num-frames=9 width=32 height=32 num-epochs={epochs} "
            f"clip-windows=1 prefetch=2 seed=3 {src_props} ! {between + ' ! ' if between else ''}"
            f"vaeencoder name=enc model={tmp}/{vae} seed=5 {cache_prop} {enc_props} ! "
            f"appsink name=sink sync=false emit-signals=false max-buffers=0")
    p = Gst.parse_launch(desc)
    sink = p.get_by_name("sink")
    p.set_state(Gst.State.PLAYING)
    latents, epochs_seen, warnings = {}, [], []
    bus = p.get_bus()
    while True:
        sample = sink.emit("try-pull-sample", 10 * Gst.MSECOND)
        if sample:
            buf = sample.get_buffer()
            ok, info = buf.map(Gst.MapFlags.READ)
            latents[len(latents)] = bytes(info.data)
            buf.unmap(info)
        m = bus.pop_filtered(Gst.MessageType.EOS | Gst.MessageType.ERROR | Gst.MessageType.WARNING |
                             Gst.MessageType.ELEMENT)
        if not m:
            continue
        if m.type == Gst.MessageType.ERROR:
            err, dbg = m.parse_error()
            p.set_state(Gst.State.NULL)
            raise SystemExit(f"pipeline error: {err.message} ({dbg})\n{desc}")
        if m.type == Gst.MessageType.WARNING:
            warnings.append(m.parse_warning()[1] or "")
        if m.type == Gst.MessageType.ELEMENT and m.get_structure().get_name() == "csvvideosrc-epoch":
            s = m.get_structure()
            epochs_seen.append((s.get_value("decoded"), s.get_value("cached")))
        if m.type == Gst.MessageType.EOS:
            while (sample := sink.emit("try-pull-sample", 0)):
                buf = sample.get_buffer()
                ok, info = buf.map(Gst.MapFlags.READ)
                latents[len(latents)] = bytes(info.data)
                buf.unmap(info)
            break
    hits = p.get_by_name("enc").get_property("cache-hits")
    p.set_state(Gst.State.NULL)
    return latents, epochs_seen, warnings, hits


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    (passed if cond else failures).append(what)


# Exactness: the same latents with and without the cache; later epochs come from the cache. A clip
# looked up (prefetch=2 ahead) while its entry was still being encoded misses once.
plain, _, _, _ = run(epochs=3, cache=None)
cached, ep, _, hits = run(epochs=3)
check(len(plain) == 3 * N and plain == cached, f"cached latents equal on-the-fly latents byte for byte ({len(plain)})")
check(plain[0] != plain[N], "latent=sample draws new noise in the next epoch")
check(ep[0] == (N, 0) and ep[1][1] >= N - 2 and ep[2] == (0, N), f"epoch 0 decoded, then from the cache: {ep}")
check(hits == ep[1][1] + ep[2][1], f"cache-hits {hits}")

# Each part of the key: a changed setting misses; the baseline still hits afterwards.
def misses(label, **kw):
    _, e, _, _ = run(**kw)
    check(e == [(N, 0)], f"miss: {label} {e}")


def hits_(label, **kw):
    _, e, _, _ = run(**kw)
    check(e == [(0, N)], f"hit: {label} {e}")


hits_("same settings")
misses("frame-stride", src_props="frame-stride=2")
misses("num-frames", src_props="num-frames=5")
misses("size", src_props="width=40")
misses("resize-mode", src_props="resize-mode=pad")
misses("clip window", src_props="clip-start=center")
misses("videoflip between", between="videoflip video-direction=horiz")
hits_("queue between", between="queue max-size-buffers=3")
misses("videobalance between", between="videobalance")
hits_("videobalance between, again", between="videobalance")
misses("videobalance saturation", between="videobalance saturation=0.5")
misses("VAE weights", vae="vae2")
shutil.copytree(f"{tmp}/vae1", f"{tmp}/vae1-copy")
hits_("VAE folder copied elsewhere", vae="vae1-copy")
misses("chunk-frames", enc_props="chunk-frames=4")
misses("tiles", enc_props="tile-height=16 tile-width=16 tile-overlap-height=0.5 tile-overlap-width=0.5")
misses("norm-scope", enc_props="norm-scope=clip")
misses("dtype", enc_props="dtype=bfloat16")
hits_("latent=mode from the same moments", enc_props="latent=mode")
shutil.copytree(f"{tmp}/data", f"{tmp}/moved")
hits_("dataset moved", data=f"{tmp}/moved")
# A video changed in place: same path, size and modification time, other bytes.
video = os.path.join(f"{tmp}/moved", rows[1].split(",")[0])
st = os.stat(video)
with open(video, "r+b") as f:
    f.seek(st.st_size // 2)
    b = f.read(64)
    f.seek(st.st_size // 2)
    f.write(bytes(x ^ 0x5A for x in b))
os.utime(video, ns=(st.st_atime_ns, st.st_mtime_ns))
_, e, _, _ = run(data=f"{tmp}/moved")
check(e[0][1] == N - 1, f"a video changed in place misses (same path, size and time): {e}")

# Damaged entries: a warning each, encoded again and rewritten.
for root, _, files in os.walk(f"{tmp}/cache/v2"):
    for name in files:
        with open(os.path.join(root, name), "r+b") as f:
            f.seek(-8, 2)
            f.write(b"garbage!")
_, e, w, _ = run()
check(e == [(N, 0)] and sum("unusable latent cache entry" in x for x in w) == N,
      f"damaged entries are encoded again with a warning each: {e}, {len(w)} warnings")
hits_("rewritten entries")
# Entries of the other settings stay damaged: verify finds exactly those, --remove deletes them.
tool = f"{build}/tools/videotrain-cache"
verify = subprocess.run([tool, "verify", f"{tmp}/cache"], capture_output=True, text=True)
last = verify.stdout.strip().splitlines()[-1]
check(verify.returncode == 1 and last.startswith(f"{N} entries verified,"), f"videotrain-cache verify: {last}")
subprocess.run([tool, "verify", f"{tmp}/cache", "--remove"], capture_output=True, check=True)
verify = subprocess.run([tool, "verify", f"{tmp}/cache"], capture_output=True, text=True)
check(verify.returncode == 0 and verify.stdout.strip().endswith(f"{N} entries verified, 0 bad"),
      "videotrain-cache verify --remove: " + verify.stdout.strip())

# read mode writes nothing; write mode reads nothing.
os.makedirs(f"{tmp}/empty")
_, e, _, _ = run(cache=f"{tmp}/empty", enc_props="cache-mode=read", epochs=2)
check(e == [(N, 0), (N, 0)] and not any(files for _, _, files in os.walk(f"{tmp}/empty")),
      f"cache-mode=read writes nothing: {e}")
_, e, _, _ = run(enc_props="cache-mode=read")
check(e == [(0, N)], f"cache-mode=read reads: {e}")
_, e, _, _ = run(enc_props="cache-mode=write")
check(e == [(N, 0)], f"cache-mode=write encodes every clip: {e}")

shutil.rmtree(tmp)
print(f"{len(passed)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
