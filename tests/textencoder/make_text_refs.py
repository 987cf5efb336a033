"""Reference data for the textencoder tests, made by independent implementations:
python3-sentencepiece tokenizes (T5 rules applied here: pieces, EOS, truncation keeping EOS
last, pad id, mask on pieces and EOS) and PyTorch runs the TorchScript text encoder.

    make_text_refs.py OUTDIR  ->  spiece.model, text_encoder.pt, tuple_encoder.pt,
                                  bad_shape_encoder.pt, refs.safetensors
refs.safetensors holds ids.N, mask.N (int64 [L]) and embeds.N (float32 [L, D]) per caption;
its metadata: captions (JSON list), max_length."""
import json
import os
import struct
import sys
from typing import Tuple

import sentencepiece as spm
import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
MAX_LENGTH = 24

corpus = [
    "a white ball bouncing on black", "colour bars with a moving noise strip", "television static",
    "a zone plate of rings moving outwards", "concentric circles", "a turning pinwheel",
    "spokes of a wheel", "a vertical grey gradient", "vertical colour stripes", "a fine checkerboard",
    "一只猫在草地上奔跑", "東京の夜景", "고양이가 잔디밭에서 뛰어요", "the \"quoted\" word and 'single' quotes",
    "numbers 0123456789 and symbols !?.,;:-()", "Ünïcödé àccents çà et là",
] * 20
with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(corpus) + "\n")
# T5's spiece.model: unigram, pad 0, EOS 1, UNK 2, no BOS.
spm.SentencePieceTrainer.train(
    input=os.path.join(out, "corpus.txt"), model_prefix=os.path.join(out, "spiece"), vocab_size=120,
    model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0,
    minloglevel=2)
sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spiece.model"))
VOCAB = sp.get_piece_size()

captions = [
    "a white ball bouncing on black",
    "",
    "一只猫在草地上奔跑 and 東京の夜景",
    "emoji 🎬🐱 are unknown pieces 👍",
    "line one\nline two\r\nline three",
    "the \"quoted\" word and 'single' quotes",
    "  leading and trailing spaces  ",
    "a very long caption " * 20,  # longer than MAX_LENGTH: truncated, EOS kept last
]


def t5_tokens(text):
    pieces = sp.encode(text)[: MAX_LENGTH - 1] + [sp.eos_id()]
    mask = [1] * len(pieces) + [0] * (MAX_LENGTH - len(pieces))
    return pieces + [sp.pad_id()] * (MAX_LENGTH - len(pieces)), mask


class TextEncoder(torch.nn.Module):
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.randn(MAX_LENGTH, dim) * 0.1)
        self.mix = torch.nn.Linear(dim, dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos[: input_ids.size(1)]
        m = attention_mask.to(h.dtype).unsqueeze(-1)
        ctx = (h * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)  # uses the mask
        return torch.tanh(self.mix(h + ctx))


class TupleEncoder(torch.nn.Module):  # a traced transformers encoder returns (last_hidden_state,)
    def __init__(self, inner: TextEncoder):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Tuple[torch.Tensor]:
        return (self.inner(input_ids, attention_mask),)


class BadShape(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return input_ids.to(torch.float32)  # [B, L]: no D


torch.manual_seed(5)
enc = TextEncoder(VOCAB, 12).eval()
torch.jit.script(enc).save(os.path.join(out, "text_encoder.pt"))
torch.jit.script(TupleEncoder(enc)).save(os.path.join(out, "tuple_encoder.pt"))
torch.jit.script(BadShape()).save(os.path.join(out, "bad_shape_encoder.pt"))

tensors = {}
with torch.no_grad():
    for i, c in enumerate(captions):
        ids, mask = t5_tokens(c)
        ids_t = torch.tensor([ids], dtype=torch.long)
        mask_t = torch.tensor([mask], dtype=torch.long)
        tensors[f"ids.{i}"] = ids_t[0]
        tensors[f"mask.{i}"] = mask_t[0]
        tensors[f"embeds.{i}"] = enc(ids_t, mask_t)[0].contiguous()

header, blobs, offset = {}, [], 0
for name, t in tensors.items():
    b = t.numpy().tobytes()
    header[name] = {"dtype": {torch.int64: "I64", torch.float32: "F32"}[t.dtype], "shape": list(t.shape),
                    "data_offsets": [offset, offset + len(b)]}
    blobs.append(b)
    offset += len(b)
header["__metadata__"] = {"captions": json.dumps(captions), "max_length": str(MAX_LENGTH)}
h = json.dumps(header).encode()
with open(os.path.join(out, "refs.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
print(f"wrote {len(captions)} captions, vocab {VOCAB}, max_length {MAX_LENGTH} to {out}")
