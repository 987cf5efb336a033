#!/usr/bin/python3
"""Overlap of decoding, encoding and training, measured in one run.

  /usr/bin/python3 bench/overlap_bench.py [--steps 20] [--batch 4]

Runs, on the demo dataset (scripts/make_dataset.sh) and a tiny VAE, for the same clips:
  decode  csvvideosrc ! fakesink
  encode  csvvideosrc ! vaeencoder ! fakesink          (decode overlapped, so ~max of the two)
  train   the whole pipeline csvvideosrc ! vaeencoder ! queue ! microbatcher ! ddptrainsink
and estimates the trainer alone as the whole run's time outside the data waits it reports.
Prints the whole pipeline's wall time against the slowest stage (target: within 15% when there
are cores for every stage; a 2-core machine has not) and the trainer's data-wait fraction.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from benchkit import RUN, demo_workdir, plugin_env


def timed(args, env):
    t = time.perf_counter()
    r = subprocess.run(args, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{r.stdout}\n{r.stderr}")
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--frames", type=int, default=9)
    ap.add_argument("--size", type=int, default=64)
    a = ap.parse_args()
    env = plugin_env()
    work = demo_workdir("videotrain-overlap-")
    clips = a.steps * a.batch
    src = (f"csvvideosrc location={work}/data/train.csv num-frames={a.frames} width={a.size} height={a.size} "
           f"num-epochs=0 prefetch=2")
    run = [RUN, "-q"]
    stop = f"identity eos-after={clips * a.frames}"
    t_decode = timed(run + f"{src} ! {stop} ! fakesink sync=false".split(), env)
    t_encode = timed(run + f"{src} ! {stop} ! vaeencoder model={work}/vae ! fakesink sync=false".split(), env)
    metrics = work + "/m.jsonl"
    t_all = timed(run + (f"{src} ! vaeencoder model={work}/vae ! queue max-size-buffers=16 ! microbatcher "
                         f"batch-size={a.batch} ! ddptrainsink model=builtin:tiny-unet3d max-steps={a.steps} "
                         f"log-every=1 metrics-file={metrics}").split(), env)
    waits = [json.loads(l).get("data_wait", 0.0) for l in open(metrics) if '"loss"' in l]
    wait = sum(waits) / len(waits) if waits else 0.0
    t_train = t_all * (1 - wait)
    slowest = max(t_decode, t_encode, t_train)
    print(f"# {clips} clips of {a.frames} frames at {a.size}x{a.size}, {a.steps} steps of {a.batch}, "
          f"{os.cpu_count()} cores")
    print(f"decode alone            {t_decode:6.2f} s")
    print(f"decode+encode           {t_encode:6.2f} s")
    print(f"train alone (estimate)  {t_train:6.2f} s")
    print(f"whole pipeline          {t_all:6.2f} s   ratio to slowest stage {t_all / slowest:.2f}x "
          f"(target <= 1.15x with a core per stage); trainer data-wait {wait:.0%}")


if __name__ == "__main__":
    main()
