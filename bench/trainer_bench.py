#!/usr/bin/python3
"""Peer of bench/trainer_bench.cpp: the plain PyTorch training loop.

  trainer_bench.py make MODEL.pt          writes the TorchScript model both sides train
  trainer_bench.py loop MODEL.pt STEPS THREADS B C T H W [DEVICE [fp32|bf16]]
                                          trains it with torch.optim.AdamW and prints the
                                          median step time in ms (JSON)
"""
import json
import os
import statistics
import sys
import time
from typing import List

import torch


class Block(torch.nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.n1 = torch.nn.GroupNorm(8, ch)
        self.c1 = torch.nn.Conv3d(ch, ch, 3, padding=1)
        self.n2 = torch.nn.GroupNorm(8, ch)
        self.c2 = torch.nn.Conv3d(ch, ch, 3, padding=1)
        self.t = torch.nn.Linear(64, ch)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.c1(torch.nn.functional.silu(self.n1(x)))
        h = h + self.t(temb)[:, :, None, None, None]
        return x + self.c2(torch.nn.functional.silu(self.n2(h)))


class BenchModel(torch.nn.Module):
    """A small latent video denoiser with a flow-matching loss (noise from torch's generator)."""

    def __init__(self, c: int = 16, ch: int = 64):
        super().__init__()
        self.inp = torch.nn.Conv3d(c, ch, 3, padding=1)
        self.b1 = Block(ch)
        self.b2 = Block(ch)
        self.out = torch.nn.Conv3d(ch, c, 3, padding=1)
        self.temb = torch.nn.Linear(1, 64)

    @torch.jit.export
    def training_step(self, latents: torch.Tensor, captions: List[str]) -> torch.Tensor:
        noise = torch.randn_like(latents)
        t = torch.rand(latents.shape[0], 1, device=latents.device)
        tb = t[:, :, None, None, None]
        xt = (1 - tb) * latents + tb * noise
        temb = torch.nn.functional.silu(self.temb(t))
        h = self.b2(self.b1(self.inp(xt), temb), temb)
        return torch.nn.functional.mse_loss(self.out(h), noise - latents)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inp(x)


def main():
    if sys.argv[1] == "make":
        torch.manual_seed(0)
        torch.jit.script(BenchModel()).save(sys.argv[2])
        return
    path, steps, threads = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    shape = [int(v) for v in sys.argv[5:10]]
    device = torch.device(sys.argv[10] if len(sys.argv) > 10 else "cpu")
    bf16 = len(sys.argv) > 11 and sys.argv[11] == "bf16"
    torch.set_num_threads(threads)
    # The engine's JIT setting (elements/common/jit_load.h): no TorchScript CPU fusion,
    # which stalls for minutes where LibTorch has LLVM.
    torch._C._jit_override_can_fuse_on_cpu(os.environ.get("VIDEOTRAIN_JIT_CPU_FUSION") == "1")
    model = torch.jit.load(path, map_location=device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen).to(device)
    captions = ["a caption"] * shape[0]
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        torch.manual_seed(step)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model.training_step(x, captions)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    warm = times[2:] if len(times) > 4 else times
    print(json.dumps({"median_ms": 1000 * statistics.median(warm)}))


if __name__ == "__main__":
    main()
