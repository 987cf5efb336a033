#!/usr/bin/python3
"""Overlap of decoding, encoding and training: each stage alone, then the whole pipeline.

  /usr/bin/python3 bench/overlap_bench.py [--steps 20] [--batch 4]

On the demo dataset (scripts/make_dataset.sh) and a tiny VAE, for the same clips, in one process
(GStreamer through gi), each timed from PLAYING to EOS:
  decode         csvvideosrc ! fakesink
  decode+encode  csvvideosrc ! vaeencoder ! appsink          (the latents are kept)
  train          appsrc (those latents) ! microbatcher ! ddptrainsink
  whole          csvvideosrc ! vaeencoder ! queue ! microbatcher ! ddptrainsink
Prints the whole pipeline's wall time against the slowest stage (target: within 15% when there
are cores for every stage; a 2-core machine has not) and the trainer's data-wait fraction in the
whole run.
"""
import argparse
import json
import os
import sys
import time

import gi

gi.require_version("Gst", "1.0")
from gi.repository import Gst  # noqa: E402

from benchkit import demo_workdir, plugin_env  # noqa: E402


def wait_eos(pipe, what):
    msg = pipe.get_bus().timed_pop_filtered(Gst.CLOCK_TIME_NONE, Gst.MessageType.EOS | Gst.MessageType.ERROR)
    if msg.type == Gst.MessageType.ERROR:
        err, dbg = msg.parse_error()
        pipe.set_state(Gst.State.NULL)
        sys.exit(f"{what}: {err.message}\n{dbg}")


def timed(desc, what):
    pipe = Gst.parse_launch(desc)
    t = time.perf_counter()
    pipe.set_state(Gst.State.PLAYING)
    wait_eos(pipe, what)
    t = time.perf_counter() - t
    pipe.set_state(Gst.State.NULL)
    return t


def encode_and_keep(desc, n):
    """Times desc (ending in appsink name=out) up to its n-th buffer; returns (seconds, caps, buffers)."""
    pipe = Gst.parse_launch(desc)
    sink = pipe.get_by_name("out")
    bufs, caps = [], None
    t = time.perf_counter()
    pipe.set_state(Gst.State.PLAYING)
    while len(bufs) < n:
        s = sink.emit("try-pull-sample", Gst.SECOND)
        if s is not None:
            caps = caps or s.get_caps()
            bufs.append(s.get_buffer())
            continue
        m = pipe.get_bus().pop_filtered(Gst.MessageType.ERROR)
        if m:
            sys.exit(f"decode+encode: {m.parse_error()[0].message}")
        if sink.get_property("eos"):
            sys.exit(f"decode+encode ended after {len(bufs)} latents, {n} needed")
    t = time.perf_counter() - t
    pipe.set_state(Gst.State.NULL)
    return t, caps, bufs


def train_alone(desc, caps, bufs):
    """Times appsrc name=in ! desc fed with bufs, all queued at once, so the trainer never waits."""
    pipe = Gst.parse_launch(f"appsrc name=in format=time ! {desc}")
    src = pipe.get_by_name("in")
    src.set_property("caps", caps)
    src.set_property("max-bytes", 0)  # no limit: everything is queued up front
    t = time.perf_counter()
    pipe.set_state(Gst.State.PLAYING)
    for b in bufs:
        src.emit("push-buffer", b)
    src.emit("end-of-stream")
    wait_eos(pipe, "train")
    t = time.perf_counter() - t
    pipe.set_state(Gst.State.NULL)
    return t


def step_lines(metrics):
    lines = [json.loads(l) for l in open(metrics)]
    return [s for s in lines if s.get("type", "step") == "step" and "loss" in s]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--frames", type=int, default=9)
    ap.add_argument("--size", type=int, default=64)
    a = ap.parse_args()
    os.environ.update(plugin_env())
    Gst.init(None)
    work = demo_workdir("videotrain-overlap-")
    clips = a.steps * a.batch
    src = (f"csvvideosrc location={work}/data/train.csv num-frames={a.frames} width={a.size} height={a.size} "
           f"num-epochs=0 prefetch=2")
    stop = f"identity eos-after={clips * a.frames}"
    trainer = (f"microbatcher batch-size={a.batch} ! ddptrainsink model=builtin:tiny-unet3d max-steps={a.steps} "
               f"log-every=1")
    t_decode = timed(f"{src} ! {stop} ! fakesink sync=false", "decode")
    # Until the clips-th latent: vaeencoder drops the demo set's broken clip, as in the whole run.
    t_encode, caps, latents = encode_and_keep(
        f"{src} ! vaeencoder model={work}/vae ! appsink name=out sync=false max-buffers=0", clips)
    t_train = train_alone(f"{trainer} metrics-file={work}/alone.jsonl", caps, latents)
    metrics = f"{work}/whole.jsonl"
    t_all = timed(f"{src} ! vaeencoder model={work}/vae ! queue max-size-buffers=16 ! {trainer} metrics-file={metrics}",
                  "whole")
    for name in ("alone", "whole"):
        if len(step_lines(f"{work}/{name}.jsonl")) != a.steps:
            sys.exit(f"{name}: the trainer did not log {a.steps} steps")
    steps = step_lines(metrics)
    wait = sum(s.get("data_wait", 0.0) for s in steps) / len(steps)
    slowest = max(t_decode, t_encode, t_train)
    print(f"# {clips} clips of {a.frames} frames at {a.size}x{a.size}, {a.steps} steps of {a.batch}, "
          f"{os.cpu_count()} cores; wall time from PLAYING to EOS")
    print(f"decode alone            {t_decode:6.2f} s")
    print(f"decode+encode           {t_encode:6.2f} s")
    print(f"train alone (latents)   {t_train:6.2f} s")
    print(f"whole pipeline          {t_all:6.2f} s")
    print(f"wall(whole)/max(stage)  {t_all / slowest:6.2f}x   (target <= 1.15x with a core per stage)")
    print(f"trainer data-wait       {wait:6.0%}   (whole pipeline, mean over steps)")


if __name__ == "__main__":
    main()
