#!/usr/bin/python3
"""csvvideosrc against its peers, measured in one run, with ratios.

  /usr/bin/python3 bench/csvvideosrc_bench.py [--videos 16] [--workers 2] [--frames 49]

1. Decode throughput: frames/s of `csvvideosrc ! fakesink` against ffmpeg decoding and scaling
   the same clips (same first frames, same output size) with the same total threads
   (W ffmpeg processes of 1 thread each vs prefetch=W, decode-threads=1). Target >= 0.8x.
2. A PyTorch DataLoader over the same CSV with torchvision/PyAV decoding (W worker processes,
   same frames and output size). Target >= 2x.
3. Peak RSS of csvvideosrc over manifests of 200, 2,000 and 200,000 rows (repeating the same
   files), each run stopped after the same number of clips. Target: flat, <= 64 bytes per row.

Needs `bash scripts/deps.sh --bench` (ffmpeg, python3-torchvision, python3-av) and a build.
"""
import argparse
import csv
import re
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("VIDEOTRAIN_BUILD_DIR", os.path.join(ROOT, "build"))
RUN = os.path.join(BUILD, "tools", "videotrain-run")


def env():
    e = dict(os.environ)
    e["GST_PLUGIN_PATH"] = os.path.join(BUILD, "plugins", "videotrain")
    return e


def make_videos(folder, n, width, height, frames):
    """H.264 in MP4, the common case of real datasets, one keyframe a second."""
    paths = []
    for i in range(n):
        p = os.path.join(folder, f"v{i:03d}.mp4")
        if not os.path.exists(p):
            subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                            f"testsrc2=size={width}x{height}:rate=24:duration={frames / 24:.3f}",
                            "-c:v", "libx264", "-preset", "veryfast", "-g", "24", "-pix_fmt", "yuv420p", p],
                           check=True)
        paths.append(p)
    return paths


def write_csv(path, videos, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "text"])
        for i in range(rows):
            w.writerow([videos[i % len(videos)], f"caption {i}"])


def wait_rss(proc):
    """Waits for a child; returns (exit code, peak RSS in bytes)."""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, ru.ru_maxrss * 1024


def run_ours(manifest, clips, frames, size, workers, extra=""):
    w, h = size
    desc = (f"csvvideosrc name=src location={manifest} num-frames={frames} width={w} height={h} clip-start=start "
            f"shuffle=false prefetch={workers} decode-threads=1 {extra} ! identity eos-after={clips * frames} "
            f"! fakesink sync=false")
    p = subprocess.Popen([RUN, "-q", "--print-clips", "src"] + desc.split(), env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    rc, rss = wait_rss(p)
    out = p.stdout.read().decode()
    if rc != 0:
        sys.exit(f"csvvideosrc run failed: {p.stderr.read().decode()}")
    # From PLAYING to EOS, as the DataLoader is timed from its first batch request: process
    # start-up and imports are left out on both sides.
    m = re.search(r"(\d+) frames in ([0-9.]+) s", out)
    return int(m.group(1)) / float(m.group(2)), rss


def run_ffmpeg(videos, frames, size, workers):
    w, h = size
    # Same work as resize-mode=crop: scale to cover, centre crop, RGB.
    vf = f"scale={w}:{h}:force_original_aspect_ratio=increase,crop={w}:{h},format=rgb24"
    cmds = [["ffmpeg", "-loglevel", "error", "-threads", "1", "-i", v, "-frames:v", str(frames), "-vf", vf,
             "-filter_threads", "1", "-f", "rawvideo", "-y", "/dev/null"] for v in videos]
    t = time.perf_counter()
    running = []
    for c in cmds:
        while len(running) >= workers:
            running.pop(0).wait()
        running.append(subprocess.Popen(c))
    for p in running:
        p.wait()
    return len(videos) * frames / (time.perf_counter() - t)


DATALOADER = r"""
import csv, sys, time, torch, torchvision
from torch.utils.data import Dataset, DataLoader
torch.set_num_threads(1)
torchvision.set_video_backend("pyav")
manifest, frames, w, h, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rows = list(csv.DictReader(open(manifest)))
class Clips(Dataset):
    def __len__(self): return len(rows)
    def __getitem__(self, i):
        # The usual recipe: read_video over the clip's time range, then resize and crop.
        v, _, info = torchvision.io.read_video(rows[i]["path"], 0, (frames - 0.5) / 24.0, pts_unit="sec",
                                               output_format="TCHW")
        v = v[:frames].float()
        s = max(w / v.shape[3], h / v.shape[2])
        v = torch.nn.functional.interpolate(v, size=(max(h, round(v.shape[2] * s)), max(w, round(v.shape[3] * s))),
                                            mode="bilinear", align_corners=False)
        y0, x0 = (v.shape[2] - h) // 2, (v.shape[3] - w) // 2
        return v[:, :, y0:y0 + h, x0:x0 + w].to(torch.uint8)
t = time.perf_counter()
n = 0
for b in DataLoader(Clips(), batch_size=1, num_workers=workers):
    n += b.shape[1]
print(n / (time.perf_counter() - t))
"""


def run_dataloader(manifest, frames, size, workers):
    w, h = size
    out = subprocess.run(["/usr/bin/python3", "-c", DATALOADER, manifest, str(frames), str(w), str(h), str(workers)],
                         check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--videos", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--frames", type=int, default=49)
    ap.add_argument("--source-size", default="640x360")
    ap.add_argument("--size", default="256x256")
    ap.add_argument("--skip-dataloader", action="store_true")
    ap.add_argument("--keep", help="folder to keep the generated videos in")
    a = ap.parse_args()
    size = tuple(int(x) for x in a.size.split("x"))
    sw, sh = (int(x) for x in a.source_size.split("x"))
    folder = a.keep or tempfile.mkdtemp(prefix="videotrain-bench-")
    os.makedirs(folder, exist_ok=True)
    try:
        videos = make_videos(folder, a.videos, sw, sh, a.frames * 2)
        manifest = os.path.join(folder, "m.csv")
        write_csv(manifest, videos, len(videos))
        print(f"# {a.videos} H.264 videos {a.source_size}, clips of {a.frames} frames to {a.size}, "
              f"{a.workers} decoders of 1 thread each")
        # Warm the page cache so that both read from memory.
        ours_fps, _ = run_ours(manifest, len(videos), a.frames, size, a.workers)
        ours_fps, _ = run_ours(manifest, len(videos), a.frames, size, a.workers)
        ff = run_ffmpeg(videos, a.frames, size, a.workers)
        print(f"decode   csvvideosrc {ours_fps:8.1f} frames/s   ffmpeg     {ff:8.1f} frames/s   "
              f"ratio {ours_fps / ff:.2f}x (target >= 0.8x)")
        if not a.skip_dataloader:
            dl = run_dataloader(manifest, a.frames, size, a.workers)
            print(f"loader   csvvideosrc {ours_fps:8.1f} frames/s   DataLoader {dl:8.1f} frames/s   "
                  f"ratio {ours_fps / dl:.2f}x (target >= 2x)")
        clips = 16
        rss = {}
        for rows in (200, 2000, 200000):
            m = os.path.join(folder, f"rows{rows}.csv")
            write_csv(m, videos, rows)
            _, rss[rows] = run_ours(m, clips, 17, (64, 64), a.workers, extra="shuffle=true")
            print(f"memory   {rows:7d} rows: peak RSS {rss[rows] / 2**20:7.1f} MiB")
        growth = (rss[200000] - rss[200]) / (200000 - 200)
        print(f"memory   growth {growth:.1f} bytes per row (target <= 64)")
    finally:
        if not a.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
