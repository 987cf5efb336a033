#!/usr/bin/python3
"""textencoder: captions/s with and without the engine's cache against a plain PyTorch loop
(python3-sentencepiece + the same TorchScript encoder, batch by batch, no cache), on a caption
stream where each of --distinct captions repeats.

    /usr/bin/python3 bench/textencoder_bench.py [--captions 2000] [--distinct 100] [--threads 2]
Needs build/bench/textencoder-bench (BUILD_DIR to change)."""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import sentencepiece as spm
import torch

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--captions", type=int, default=2000)
ap.add_argument("--distinct", type=int, default=100)
ap.add_argument("--batch-size", type=int, default=8)
ap.add_argument("--max-length", type=int, default=226)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--dim", type=int, default=256, help="encoder width (4 transformer layers)")
a = ap.parse_args()
torch.set_num_threads(a.threads)
build = os.environ.get("BUILD_DIR", os.path.join(here, "..", "build"))
tmp = tempfile.mkdtemp(prefix="textencoder-bench-")
subprocess.run([sys.executable, os.path.join(here, "..", "tests", "textencoder", "make_text_refs.py"), tmp],
               check=True, stdout=subprocess.DEVNULL)
sp = spm.SentencePieceProcessor(model_file=os.path.join(tmp, "spiece.model"))


class Encoder(torch.nn.Module):  # a T5-sized stand-in: embedding + 4 transformer layers
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, 4, dim * 4, batch_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.layers(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)


model_path = os.path.join(tmp, "encoder.pt")
torch.jit.script(Encoder(sp.get_piece_size(), a.dim).eval()).save(model_path)
module = torch.jit.load(model_path)
stream = [f"a clip of pattern number {(i * 7919) % a.distinct} moving slowly across the frame" for i in range(a.captions)]


def tokens(text):
    ids = sp.encode(text)[: a.max_length - 1] + [sp.eos_id()]
    return ids + [sp.pad_id()] * (a.max_length - len(ids)), [1] * len(ids) + [0] * (a.max_length - len(ids))


t0 = time.perf_counter()
with torch.no_grad():
    for at in range(0, len(stream), a.batch_size):
        toks = [tokens(c) for c in stream[at:at + a.batch_size]]
        module(torch.tensor([t[0] for t in toks]), torch.tensor([t[1] for t in toks]))
py = len(stream) / (time.perf_counter() - t0)
print(f"PyTorch loop, no cache: {py:8.1f} captions/s")
out = subprocess.run([os.path.join(build, "bench", "textencoder-bench"), "--tokenizer", os.path.join(tmp, "spiece.model"),
                      "--model", model_path, "--captions", str(a.captions), "--distinct", str(a.distinct),
                      "--batch-size", str(a.batch_size), "--max-length", str(a.max_length), "--threads", str(a.threads)],
                     check=True, capture_output=True, text=True).stdout
print(out, end="")
vals = dict(line.split() for line in out.splitlines() if line.startswith("ENGINE_"))
print(f"ratio engine/PyTorch: uncached {float(vals['ENGINE_UNCACHED']) / py:.2f}, cached {float(vals['ENGINE_CACHED']) / py:.2f}")
