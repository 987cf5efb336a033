#!/usr/bin/python3
"""Validation beside training: training throughput with and without it, 1 vs 2 validation shards.

  /usr/bin/python3 bench/valsink_bench.py [--steps 20] [--every 5] [--val-rows 24] [--repeats 3]
                                          [--device cpu | cuda:0 | cuda:0,cuda:1]

Runs the same training (csvvideosrc ! vaeencoder ! queue ! microbatcher ! ddptrainsink) on one
rank: alone, with one ddpvalsink branch, and with two (tee, shard-index 0 and 1), validating every
--every steps; each configuration --repeats times, reporting medians.
Training throughput comes from the trainer's step timestamps (metrics-file) after --warmup steps,
so process start-up, model building and the validation at EOS are left out. Validation time per
pass is the `seconds` of rank 0's ddpvalsink-result messages, for passes during training.
--device places the validation sinks (a comma list is spread over the shards); the trainer stays
on --train-device.
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys

from benchkit import RUN, demo_workdir, plugin_env

RESULT = re.compile(r"ddpvalsink-result,.*?\bstep=\(\w+\)(\d+).*?\bseconds=\(double\)([0-9.eE+-]+)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--val-rows", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the throughput")
    ap.add_argument("--device", default="cpu", help="validation device(s), e.g. cuda:0 or cuda:0,cuda:1")
    ap.add_argument("--train-device", default="", help="default: ddptrainsink's own (cuda:0 when there is CUDA)")
    a = ap.parse_args()
    if a.steps <= a.warmup + 1:
        ap.error("--steps must exceed --warmup + 1")
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
    batch = 4
    fmt = "num-frames=9 width=64 height=64"
    train_dev = f"device={a.train_device} " if a.train_device else ""
    train = (f"csvvideosrc location={work}/data/train.csv {fmt} num-epochs=0 prefetch=2 ! vaeencoder model={work}/vae "
             f"! queue max-size-buffers=16 ! microbatcher batch-size={batch} ! ddptrainsink name=trainer "
             f"model=builtin:tiny-unet3d {train_dev}max-steps={a.steps} log-every=1 metrics-file=METRICS")
    val = (f" csvvideosrc location={work}/val.csv {fmt} num-epochs=0 shuffle=false clip-start=center prefetch=1 "
           f"! vaeencoder model={work}/vae latent=mode ! tee name=v")
    devices = a.device.split(",")

    def branch(k, n):
        return (f" v. ! queue ! ddpvalsink trainer=trainer every={a.every} num-shards={n} shard-index={k} "
                f"device={devices[k % len(devices)]}")

    def run(name, desc):
        """One run: (training samples/s in steady state, validation seconds of passes during training)."""
        metrics = f"{work}/{name}.jsonl"
        if os.path.exists(metrics):
            os.remove(metrics)
        # Not -q: videotrain-run then prints the ddpvalsink-result messages.
        r = subprocess.run([RUN] + desc.replace("METRICS", metrics).split(), env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{name} failed:\n{r.stdout}\n{r.stderr}")
        times = {}
        for line in open(metrics):
            j = json.loads(line)
            if j.get("type", "step") == "step" and "time" in j:
                times[j["step"]] = j["time"]
        if sorted(times) != list(range(1, a.steps + 1)):
            sys.exit(f"{name}: steps logged {sorted(times)}")
        rate = (a.steps - a.warmup) * batch / (times[a.steps] - times[a.warmup])
        # Passes for steps before the last run beside training; the one at the end does not.
        passes = [float(s) for step, s in RESULT.findall(r.stdout) if int(step) < a.steps]
        return rate, passes

    configs = [("alone", train), ("1 shard", train + val + branch(0, 1)),
               ("2 shards", train + val + branch(0, 2) + branch(1, 2))]
    rates = {c: [] for c, _ in configs}
    passes = {c: [] for c, _ in configs}
    for i in range(a.repeats):
        for c, desc in configs:  # interleaved, so that drift in the machine's load hits each alike
            rate, p = run(c.replace(" ", "-"), desc)
            rates[c].append(rate)
            passes[c] += p
    med = {c: statistics.median(v) for c, v in rates.items()}
    val_s = {c: statistics.median(p) if p else float("nan") for c, p in passes.items()}
    print(f"# {a.steps} steps of {batch} clips (throughput over steps {a.warmup + 1}..{a.steps}), validation of "
          f"{a.val_rows} clips every {a.every} steps on {a.device}, trainer on {a.train_device or 'its default device'}, "
          f"{os.cpu_count()} cores, one rank, median of {a.repeats} runs")
    for c, _ in configs:
        spread = ", ".join(f"{r:.2f}" for r in rates[c])
        extra = "" if c == "alone" else f"  ratio to alone {med[c] / med['alone']:.2f}x"
        print(f"training {c:8s}  {med[c]:6.2f} samples/s  (runs: {spread}){extra}")
    for c in ("1 shard", "2 shards"):
        print(f"validation pass, {c:8s}  {val_s[c]:6.2f} s  (median of {len(passes[c])} passes during training)")
    print(f"validation speed-up 2 shards vs 1: {val_s['1 shard'] / val_s['2 shards']:.2f}x")


if __name__ == "__main__":
    main()
