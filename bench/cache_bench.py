#!/usr/bin/python3
"""vaeencoder's latent cache: clips/s into microbatcher for an uncached and a cached epoch.

  /usr/bin/python3 bench/cache_bench.py [--videos 6] [--frames 25] [--size 192]

On scripts/make_dataset.sh videos (the corrupt row left out) and a seeded mid-size CogVideoX
encoder (videotrain-make-vae --mid: 64-256 channels, 2 resnets per block, 32 groups), in one
process (GStreamer through gi), the same pipeline runs twice on one cache folder:

  csvvideosrc clip-windows=1 num-epochs=1 ! vaeencoder cache-dir=C ! queue ! microbatcher ! fakesink

first with C empty (every clip decoded and encoded, then written), then with C full (every clip
read from the cache: no decode, no encode). Each run is timed from PLAYING to EOS, model loading
and the cache's lookups included; clips are counted on microbatcher's sink pad. Prints clips/s
for both, the ratio (target >= 50x), the cached epoch's csvvideosrc-epoch message (decoded=0,
cached=N) and vaeencoder's cache-hits / cache-misses.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time

import gi

gi.require_version("Gst", "1.0")
from gi.repository import Gst  # noqa: E402

from benchkit import BUILD, ROOT, plugin_env  # noqa: E402


def make_work(videos, keep):
    work = tempfile.mkdtemp(prefix="videotrain-cache-bench-")
    if not keep:
        import atexit
        atexit.register(shutil.rmtree, work, True)
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "make_dataset.sh"), f"{work}/data", str(videos)],
                   check=True, capture_output=True)
    # Every readable video (train and val rows), none replaced: each row is one clip both epochs.
    with open(f"{work}/data/manifest.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if "corrupt" not in r["path"]]
    with open(f"{work}/data/bench.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "text"])
        for r in rows:
            w.writerow([r["path"], r["text"]])
    subprocess.run([os.path.join(BUILD, "tools", "videotrain-make-vae"), f"{work}/vae", "--mid",
                    "--seed", "1"], check=True, capture_output=True)
    return work, len(rows)


def run_epoch(desc):
    """Runs desc to EOS; returns (seconds, clips into microbatcher, epoch message fields, hits, misses)."""
    pipe = Gst.parse_launch(desc)
    clips = [0]

    def count(_pad, _info):
        clips[0] += 1
        return Gst.PadProbeReturn.OK

    pipe.get_by_name("mb").get_static_pad("sink").add_probe(Gst.PadProbeType.BUFFER, count)
    bus = pipe.get_bus()
    epoch = None
    t = time.perf_counter()
    pipe.set_state(Gst.State.PLAYING)
    while True:
        msg = bus.timed_pop_filtered(Gst.CLOCK_TIME_NONE,
                                     Gst.MessageType.EOS | Gst.MessageType.ERROR | Gst.MessageType.ELEMENT)
        if msg.type == Gst.MessageType.ERROR:
            err, dbg = msg.parse_error()
            pipe.set_state(Gst.State.NULL)
            sys.exit(f"{err.message}\n{dbg}")
        if msg.type == Gst.MessageType.EOS:
            break
        s = msg.get_structure()
        if s.get_name() == "csvvideosrc-epoch":
            epoch = {k: s.get_value(k) for k in ("epoch", "clips", "decoded", "cached", "replaced")}
    t = time.perf_counter() - t
    enc = pipe.get_by_name("enc")
    hits, misses = enc.get_property("cache-hits"), enc.get_property("cache-misses")
    pipe.set_state(Gst.State.NULL)
    return t, clips[0], epoch, hits, misses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--videos", type=int, default=6, help="videos made by scripts/make_dataset.sh (default 6)")
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--size", type=int, default=192)
    a = ap.parse_args()
    os.environ.update(plugin_env())
    Gst.init(None)
    work, rows = make_work(a.videos, os.environ.get("VIDEOTRAIN_BENCH_KEEP") == "1")
    desc = (f"csvvideosrc location={work}/data/bench.csv num-frames={a.frames} width={a.size} height={a.size} "
            f"num-epochs=1 clip-windows=1 shuffle=false seed=0 "
            f"! vaeencoder name=enc model={work}/vae cache-dir={work}/cache "
            f"! queue max-size-buffers=16 ! microbatcher name=mb batch-size=1 ! fakesink sync=false")
    t_cold, n_cold, ep_cold, h_cold, m_cold = run_epoch(desc)
    t_hot, n_hot, ep_hot, h_hot, m_hot = run_epoch(desc)
    if n_cold != rows or n_hot != rows:
        sys.exit(f"expected {rows} clips into microbatcher each epoch, got {n_cold} and {n_hot}")
    if ep_hot is None or ep_cold is None:
        sys.exit("no csvvideosrc-epoch message")
    cold, hot = n_cold / t_cold, n_hot / t_hot
    print(f"# {rows} clips of {a.frames}x{a.size}x{a.size}, mid-size CogVideoX encoder (64-256 channels, "
          f"2 resnets per block), CPU, {os.cpu_count()} cores; wall time from PLAYING to EOS")
    print(f"uncached epoch  {t_cold:8.3f} s  {cold:9.2f} clips/s   decoded={ep_cold['decoded']} "
          f"cached={ep_cold['cached']}  cache-hits={h_cold} cache-misses={m_cold}")
    print(f"cached epoch    {t_hot:8.3f} s  {hot:9.2f} clips/s   decoded={ep_hot['decoded']} "
          f"cached={ep_hot['cached']}  cache-hits={h_hot} cache-misses={m_hot}")
    print(f"cached/uncached {hot / cold:8.1f}x   (target >= 50x)")
    if ep_hot["decoded"] != 0:
        sys.exit(f"the cached epoch decoded {ep_hot['decoded']} clips (expected 0)")


if __name__ == "__main__":
    main()
