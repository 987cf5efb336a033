"""csvvideosrc buckets= and frame-buckets= in real pipelines
(csvvideosrc ! vaeencoder ! microbatcher ! appsink, one pipeline per rank; the GstVideoTrain typelib reads
the batch and tensor metas). The manifest mixes 4:3, 1:1, 3:4 and 16:9 videos of 30 to 900 frames; some rows
carry num_frames/height/width and some are left empty (probed at start), and one row is not a video.
With 4 size buckets, 2 frame buckets and 2 ranks, over 2 epochs:
- every step has one shape, and every clip has the shape its video's aspect ratio and length call for;
- steps hold batch-size clips except at most one per bucket per epoch, and both ranks run the same number
  of steps each epoch;
- the order of steps is the one a single rank gets (global step g = step g / 2 of rank g % 2);
- a run restarted at the data position after a step in the middle of epoch 1 repeats the rest exactly;
- the unreadable row is left out with a warning naming it, and a frame bucket the VAE cannot encode
  (not 1 + 4n) is an error at start, before any clip, as is a bucket list that does not parse.
The process imports torch first, as a Python app would, so the error paths run beside its copy of libtorch."""
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

import torch  # noqa: F401  (an app that imported torch before GStreamer)
import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstVideoTrain", "1.0")
from gi.repository import Gst, GstVideoTrain as VT  # noqa: E402

build = os.environ["VIDEOTRAIN_BUILD_DIR"]
Gst.init(None)
tmp = tempfile.mkdtemp(prefix="buckets-")
subprocess.run([f"{build}/tools/videotrain-make-vae", f"{tmp}/vae", "--tiny", "--seed", "1"],
               check=True, stdout=subprocess.DEVNULL)

SIZES = {"4:3": (64, 48), "1:1": (48, 48), "3:4": (48, 64), "16:9": (96, 54)}
LENGTHS = [30, 40, 45, 60, 300, 900]
BUCKETS = [(32, 24), (24, 24), (24, 32), (48, 24)]  # 4:3, 1:1, 3:4, 2:1 (where 16:9 is nearest)
FRAME_BUCKETS, STRIDE, BATCH = [9, 5], 4, 3
videos = []  # (path, width, height, frames)
with open(f"{tmp}/train.csv", "w") as csv:
    csv.write("path,caption,num_frames,height,width,fps\n")
    for ar, (w, h) in SIZES.items():
        for n in LENGTHS:
            i = len(videos)
            path = f"{tmp}/v{i}.mp4"
            subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i", f"testsrc=size={w}x{h}:rate=25",
                            "-frames:v", str(n), "-pix_fmt", "yuv420p", "-c:v", "libx264", "-g", "25", path], check=True)
            videos.append((path, w, h, n))
            # Every third row without sizes: csvvideosrc probes it.
            csv.write(f"v{i}.mp4,{ar} {n}," + (",,," if i % 3 == 0 else f"{n},{h},{w},25") + "\n")
    # Not a video, no sizes: left out (a warning), never decoded.
    with open(f"{tmp}/notes.mp4", "w") as f:
        f.write("not a video\n")
    csv.write("notes.mp4,not a video,,,,\n")
BAD_ROW = len(videos)


def expected_shape(row):
    """(width, height, frames) of the bucket the row's video belongs to."""
    _, w, h, n = videos[row]
    import math
    ar = math.log(w / h)
    best = min(range(len(BUCKETS)), key=lambda b: (abs(math.log(BUCKETS[b][0] / BUCKETS[b][1]) - ar),
                                                     -BUCKETS[b][0] * BUCKETS[b][1]))
    frames = next(f for f in FRAME_BUCKETS if (f - 1) * STRIDE <= n - 1)
    return BUCKETS[best] + (frames,)


failures, passed = [], []


def check(cond, what):
    (passed if cond else failures).append(what)
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)


def run(rank, world, epochs=2, extra="", frame_buckets="9,5", buckets=BUCKETS, enc=""):
    """Steps in order: dicts with step, epoch, shape (C, t, h, w), samples [(id, epoch, clip, padding)],
    sync position (epoch, next_clip); the warnings; the error, if any."""
    desc = (f"csvvideosrc location={tmp}/train.csv buckets={','.join(f'{w}x{h}' for w, h in buckets)} "
            f"frame-buckets={frame_buckets} frame-stride={STRIDE} num-epochs={epochs} seed=3 prefetch=2 "
            f"rank={rank} world-size={world} {extra} ! vaeencoder name=enc model={tmp}/vae {enc} ! "
            f"microbatcher batch-size={BATCH} micro-batch-size=1 ! appsink name=sink sync=false max-buffers=0")
    p = Gst.parse_launch(desc)
    sink = p.get_by_name("sink")
    p.set_state(Gst.State.PLAYING)
    steps, warnings, error = {}, [], None
    order = []

    def take(sample):
        buf = sample.get_buffer()
        b = VT.buffer_get_videotrain_batch_meta(buf)
        t = VT.buffer_get_videotrain_tensor_meta(buf)
        dims = list(t.dims[: t.ndim])
        if b.step not in steps:
            steps[b.step] = {"step": b.step, "shapes": set(), "samples": [], "micro": 0}
            order.append(b.step)
        s = steps[b.step]
        s["shapes"].add(tuple(dims[1:]))
        s["micro"] += 1
        for i in range(b.get_n_samples()):
            ok, sid, ep, clip, _cap, pad = b.get_sample(i)
            s["samples"].append((sid, ep, clip, pad))
        if b.sync:
            s["after"] = (b.epoch, b.next_clip)
            s["micro_count"] = b.micro_count

    bus = p.get_bus()
    while True:
        sample = sink.emit("try-pull-sample", 10 * Gst.MSECOND)
        if sample:
            take(sample)
        m = bus.pop_filtered(Gst.MessageType.EOS | Gst.MessageType.ERROR | Gst.MessageType.WARNING)
        if not m:
            continue
        if m.type == Gst.MessageType.ERROR:
            error = m.parse_error()[0].message
            break
        if m.type == Gst.MessageType.WARNING:
            warnings.append(m.parse_warning()[0].message)
        if m.type == Gst.MessageType.EOS:
            while (sample := sink.emit("try-pull-sample", 0)):
                take(sample)
            break
    run.cache = (p.get_by_name("enc").get_property("cache-hits"), p.get_by_name("enc").get_property("cache-misses"))
    p.set_state(Gst.State.NULL)
    return [steps[k] for k in order], warnings, error


# A frame bucket the VAE cannot encode: an error at start, no clip.
bad_steps, _, err = run(0, 2, frame_buckets="9,6")
check(err is not None and "6 frames" in err and not bad_steps,
      f"frame-buckets=9,6 is an error at start naming the 6-frame clips (got {err!r}, {len(bad_steps)} steps)")

bad_steps, _, err = run(0, 2, buckets=[(32, 24), (24, 0)])
check(err is not None and "buckets entry '24x0'" in err and not bad_steps,
      f"buckets=...,24x0 is an error at start naming the entry (got {err!r})")

single, _, err = run(0, 1)
check(err is None, f"one rank runs (error {err!r})")
ranks = []
for r in range(2):
    steps, warnings, err = run(r, 2)
    check(err is None, f"rank {r} of 2 runs (error {err!r})")
    check(any("left out" in w and "notes.mp4" in w for w in warnings),
          f"rank {r}: the unreadable row is left out with a warning naming it ({warnings})")
    check(any("probed at start" in w for w in warnings), f"rank {r}: probing rows without sizes is reported")
    ranks.append(steps)

for r, steps in enumerate(ranks):
    one_shape = all(len(s["shapes"]) == 1 for s in steps)
    check(one_shape, f"rank {r}: every step has one shape")
    wrong = []
    for s in steps:
        (c, t, h, w), = s["shapes"]
        for sid, ep, clip, pad in s["samples"]:
            W, H, F = expected_shape(sid)
            if (w * 8, h * 8, (t - 1) * 4 + 1) != (W, H, F):
                wrong.append((sid, (w * 8, h * 8, (t - 1) * 4 + 1), (W, H, F)))
    check(not wrong, f"rank {r}: every clip is in its bucket (wrong: {wrong[:5]})")
    check(all(sid != BAD_ROW for s in steps for sid, *_ in s["samples"]), f"rank {r}: the unreadable row never comes")

for epoch in (0, 1):
    counts = [sum(1 for s in steps if s["samples"][0][1] == epoch) for steps in ranks]
    check(counts[0] == counts[1] and counts[0] > 0, f"epoch {epoch}: both ranks run the same number of steps {counts}")
    partial = defaultdict(int)
    for steps in ranks:
        for s in steps:
            if s["samples"][0][1] == epoch and len(s["samples"]) < BATCH and not s["samples"][0][3]:
                partial[next(iter(s["shapes"]))] += 1
    check(all(v == 1 for v in partial.values()) and len(partial) <= len(BUCKETS) * len(FRAME_BUCKETS),
          f"epoch {epoch}: at most one partial step per bucket ({dict(partial)})")
    check(all(len(s["samples"]) <= BATCH for steps in ranks for s in steps), "no step holds more than batch-size")

# Same order on 1 and 2 ranks: global step g is step g // 2 of rank g % 2 (padding steps aside).
merged = []
for g in range(2 * max(len(ranks[0]), len(ranks[1]))):
    steps = ranks[g % 2]
    if g // 2 < len(steps):
        merged.append(steps[g // 2])
ids = lambda steps: [[sid for sid, _, _, pad in s["samples"] if not pad] for s in steps]  # noqa: E731
a, b = [x for x in ids(single) if x], [x for x in ids(merged) if x]
check(a == b[: len(a)] and len(b) >= len(a), f"order is independent of the world size ({len(a)} steps)")

# Resume mid-epoch 1 on rank 1: start at the data position after one of its steps.
steps1 = ranks[1]
in_epoch1 = [i for i, s in enumerate(steps1) if s["samples"][0][1] == 1]
cut = in_epoch1[0]
e, clip = steps1[cut]["after"]
check(e == 1 and 0 < clip, f"the cut is in the middle of epoch 1 (epoch {e}, clip {clip})")
resumed, _, err = run(1, 2, extra=f"start-epoch={e} start-clip={clip}")
tail = [(s["samples"], s["shapes"]) for s in steps1[cut + 1:]]
check(err is None and len(tail) >= 2 and [(s["samples"], s["shapes"]) for s in resumed] == tail,
      f"resume at epoch {e} clip {clip} repeats the remaining {len(tail)} steps exactly ({len(resumed)} steps)")

# The latent cache keys on the bucket a clip was fitted to: a second run hits every clip; with one size
# bucket changed (24x24 -> 32x32), exactly the clips of that bucket miss.
first, _, err = run(0, 2, epochs=1, extra="clip-windows=1", enc=f"cache-dir={tmp}/cache")
hits0, misses0 = run.cache
again, _, err2 = run(0, 2, epochs=1, extra="clip-windows=1", enc=f"cache-dir={tmp}/cache")
hits1, misses1 = run.cache
clips = sum(len(s["samples"]) for s in first)
check(err is None and err2 is None and (hits0, misses0) == (0, clips) and (hits1, misses1) == (clips, 0)
      and [s["samples"] for s in again] == [s["samples"] for s in first],
      f"a cached bucketed run hits every clip (first {hits0}/{misses0}, second {hits1}/{misses1}, {clips} clips)")
square = [(32, 32) if b == (24, 24) else b for b in BUCKETS]
changed, _, err3 = run(0, 2, epochs=1, extra="clip-windows=1", enc=f"cache-dir={tmp}/cache", buckets=square)
hits2, misses2 = run.cache
in_square = sum(1 for s in changed for sid, *_ in s["samples"] if expected_shape(sid)[:2] == (24, 24))
check(err3 is None and in_square > 0 and misses2 == in_square and hits2 == clips - in_square,
      f"changing one bucket's size misses exactly its {in_square} clips (hits {hits2}, misses {misses2})")

print(f"{len(passed)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
