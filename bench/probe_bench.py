#!/usr/bin/python3
"""videotrain-probe against ffprobe on the same files, in one run, with the ratio.

  /usr/bin/python3 bench/probe_bench.py [--rows 240] [--workers 2]

A manifest of --rows rows over scripts/make_dataset.sh's 12 videos (H.264/MP4 and VP8/MKV) with
the size columns blank. videotrain-probe -j W fills it; the peer runs W ffprobe processes at a
time, each reading the same fields (stream size, frame rate, frame count or duration, without
decoding). Both read the same files, already in the page cache after a first warm-up pass.
Prints videos/s of each and videotrain-probe / ffprobe.
"""
import argparse
import csv
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchkit  # noqa: E402


def ffprobe(path):
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                          "stream=width,height,avg_frame_rate,nb_frames:format=duration", "-of", "json", path],
                         capture_output=True, text=True)
    return out.returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=240)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    work = benchkit.demo_workdir("videotrain-probe-bench-")
    data = os.path.join(work, "data")
    rows = list(csv.reader(open(os.path.join(data, "manifest.csv"))))
    header, videos = rows[0], [r for r in rows[1:] if "corrupt" not in r[0]]
    blank = os.path.join(data, "blank.csv")
    with open(blank, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for i in range(args.rows):
            r = list(videos[i % len(videos)])
            for c in ("num_frames", "height", "width", "fps"):
                r[header.index(c)] = ""
            w.writerow(r)
    paths = [os.path.join(data, videos[i % len(videos)][0]) for i in range(args.rows)]
    probe = os.path.join(benchkit.BUILD, "tools", "videotrain-probe")

    for p in set(paths):  # warm the page cache for both
        with open(p, "rb") as f:
            f.read()

    out = os.path.join(data, "probed.csv")
    t = time.perf_counter()
    subprocess.run([probe, "-j", str(args.workers), blank, out], check=True, capture_output=True)
    ours = args.rows / (time.perf_counter() - t)

    t = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        ok = sum(pool.map(ffprobe, paths))
    peer = args.rows / (time.perf_counter() - t)
    assert ok == args.rows, "ffprobe failed on %d files" % (args.rows - ok)

    print("%d videos, %d workers" % (args.rows, args.workers))
    print("videotrain-probe: %.1f videos/s" % ours)
    print("ffprobe:          %.1f videos/s" % peer)
    print("ratio (videotrain-probe / ffprobe): %.2f" % (ours / peer))


if __name__ == "__main__":
    main()
