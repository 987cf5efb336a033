"""Encode time of one clip: vaeencoder's native CogVideoX encoder against a plain-PyTorch Python encoder.

    /usr/bin/python3 bench/vae_speed_bench.py [--frames 25] [--size 192] [--threads 2] [--repeat 3]
    VIDEOTRAIN_BUILD_DIR=build-torch2 .venv-torch2/bin/python bench/vae_speed_bench.py --peer diffusers

--peer diffusers times diffusers' own AutoencoderKLCogVideoX.encode (its 8-frame batches with the conv
cache, mode of the posterior) on the same folder instead: run it from the torch2 venv against the
torch2 build, so that both sides run the same LibTorch.

Both run the same seeded mid-size VAE (videotrain-make-vae --mid: 64-256 channels, 2 resnets per
block, 32 groups) on the same uint8 clip with diffusers' chunking (8 frames, GroupNorm per chunk) on
the same number of CPU threads: ours through `vae-memory-bench --modes chunk` (a fresh process,
pushing frames through the engine), the peer through bench/cogvideox_peer.py (uint8 to [-1, 1]
included). Runs alternate, the best of --repeat each counts; prints peer_time / our_time (target >= 1.2).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchkit import BUILD  # noqa: E402
from cogvideox_peer import CogVideoXPeer  # noqa: E402


def clip(T, size):
    # The frames vae-memory-bench pushes: byte i of frame t is (7 i + 13 t) mod 256 (RGB, row-major).
    i = torch.arange(size * size * 3, dtype=torch.int64)
    return torch.stack([((i * 7 + t * 13) & 0xFF).to(torch.uint8).reshape(size, size, 3) for t in range(T)])


def ours(model, T, size, threads, binary=None):
    out = subprocess.run([binary or os.path.join(BUILD, "bench", "vae-memory-bench"), "--model", model, "--modes", "chunk",
                          "--frames", str(T), "--size", str(size), "--threads", str(threads)],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"^chunk\s+%d\s+\S+\s+\S+\s+\S+\s+\S+\s+(\S+)" % T, out, re.M)
    if not m:
        sys.exit("vae-memory-bench printed no chunk line:\n" + out)
    return float(m.group(1))


def peer_time(peer, u8):
    t0 = time.perf_counter()
    video = u8.permute(3, 0, 1, 2).unsqueeze(0).float().div(127.5).sub(1.0)
    out = peer.encode(video)
    return time.perf_counter() - t0, out


class DiffusersPeer:
    def __init__(self, model):
        from diffusers import AutoencoderKLCogVideoX
        self.vae = AutoencoderKLCogVideoX.from_pretrained(model, torch_dtype=torch.float32).eval()

    @torch.no_grad()
    def encode(self, video):
        return self.vae.encode(video).latent_dist.mode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--size", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bench-binary", help="another vae-memory-bench build to time as ours (before/after)")
    ap.add_argument("--peer", choices=("plain", "diffusers"), default="plain",
                    help="plain: bench/cogvideox_peer.py; diffusers: diffusers' AutoencoderKLCogVideoX")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory(prefix="vae-speed-") as tmp:
        model = os.path.join(tmp, "vae")
        subprocess.run([os.path.join(BUILD, "tools", "videotrain-make-vae"), model, "--mid",
                        "--seed", "1"], check=True, capture_output=True)
        peer = DiffusersPeer(model) if a.peer == "diffusers" else CogVideoXPeer(model)
        u8 = clip(a.frames, a.size)
        peer_time(peer, clip(9, a.size))  # warm-up: oneDNN primitives, allocator
        mine, theirs = [], []
        for _ in range(a.repeat):
            mine.append(ours(model, a.frames, a.size, a.threads, a.bench_binary))
            theirs.append(peer_time(peer, u8)[0])
    o, p = min(mine), min(theirs)
    print("CogVideoX mid VAE encode, %d frames of %dx%d, %d CPU threads, best of %d (torch %s)" %
          (a.frames, a.size, a.size, a.threads, a.repeat, torch.__version__))
    print("  vaeencoder (vae-memory-bench --modes chunk): %.2f s  (runs: %s)" % (o, " ".join("%.2f" % s for s in mine)))
    name = "diffusers AutoencoderKLCogVideoX.encode:  " if a.peer == "diffusers" else "Python peer (bench/cogvideox_peer.py):       "
    print("  %s%.2f s  (runs: %s)" % (name, p, " ".join("%.2f" % s for s in theirs)))
    print("  ratio peer_time / our_time: %.2fx (target >= 1.2)" % (p / o))


if __name__ == "__main__":
    main()
