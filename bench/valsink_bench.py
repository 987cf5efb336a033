#!/usr/bin/python3
"""Validation beside training, measured in one run.

  /usr/bin/python3 bench/valsink_bench.py [--steps 20] [--every 5] [--val-rows 24]

Runs the same training (csvvideosrc ! vaeencoder ! queue ! microbatcher ! ddptrainsink) three
times on one rank: alone, with one ddpvalsink branch, and with two (tee, shard-index 0 and 1),
validating every --every steps. Prints training throughput with validation against training
alone, and the mean validation time with 1 against 2 shards (CPU threads here; devices when
each branch has its own GPU).
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time

from benchkit import RUN, demo_workdir, plugin_env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--val-rows", type=int, default=24)
    a = ap.parse_args()
    env = plugin_env()
    work = demo_workdir("videotrain-valbench-")
    # A validation set of --val-rows rows (the dataset's videos repeated).
    rows = list(csv.DictReader(open(work + "/data/train.csv")))
    rows = [r for r in rows if "corrupt" not in r["path"]]
    with open(work + "/val.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "text"])
        for i in range(a.val_rows):
            w.writerow([os.path.join(work, "data", rows[i % len(rows)]["path"]), rows[i % len(rows)]["text"]])
    fmt = "num-frames=9 width=64 height=64"
    train = (f"csvvideosrc location={work}/data/train.csv {fmt} num-epochs=0 prefetch=2 ! vaeencoder model={work}/vae "
             f"! queue max-size-buffers=16 ! microbatcher batch-size=4 ! ddptrainsink name=trainer "
             f"model=builtin:tiny-unet3d max-steps={a.steps} log-every=1 metrics-file=METRICS")
    val = (f" csvvideosrc location={work}/val.csv {fmt} num-epochs=0 shuffle=false clip-start=center prefetch=1 "
           f"! vaeencoder model={work}/vae latent=mode ! tee name=v")

    def branch(k, n):
        return f" v. ! queue ! ddpvalsink trainer=trainer every={a.every} num-shards={n} shard-index={k}"

    def run(name, desc):
        metrics = f"{work}/{name}.jsonl"
        t = time.perf_counter()
        r = subprocess.run([RUN, "-q"] +
                           desc.replace("METRICS", metrics).split(), env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{name} failed:\n{r.stdout}\n{r.stderr}")
        wall = time.perf_counter() - t
        lines = [json.loads(l) for l in open(metrics)]
        vals = [l["seconds"] for l in lines if l.get("type") == "validation" and "seconds" in l]
        return wall, vals

    t0, _ = run("alone", train)
    t1, v1 = run("one", train + val + branch(0, 1))
    t2, v2 = run("two", train + val + branch(0, 2) + branch(1, 2))
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    print(f"# {a.steps} steps of 4 clips, validation of {a.val_rows} clips every {a.every} steps, "
          f"{os.cpu_count()} cores, one rank")
    print(f"training alone                 {t0:6.2f} s  {a.steps * 4 / t0:6.2f} samples/s")
    print(f"training + validation 1 shard  {t1:6.2f} s  {a.steps * 4 / t1:6.2f} samples/s  ratio {t0 / t1:.2f}x")
    print(f"training + validation 2 shards {t2:6.2f} s  {a.steps * 4 / t2:6.2f} samples/s  ratio {t0 / t2:.2f}x")
    print(f"validation pass: 1 shard {mean(v1):.2f} s ({len(v1)} passes), 2 shards {mean(v2):.2f} s "
          f"({len(v2)} passes), speed-up {mean(v1) / mean(v2):.2f}x")


if __name__ == "__main__":
    main()
