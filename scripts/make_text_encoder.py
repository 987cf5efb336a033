#!/usr/bin/python3
"""Makes a small text encoder for demos and tests, shaped like a T5 encoder for textencoder:
a SentencePiece tokenizer (unigram; T5's special ids: pad 0, EOS 1, UNK 2, no BOS) trained on the
captions of a manifest, and a seeded random TorchScript encoder
    forward(input_ids: Tensor[B, L] int64, attention_mask: Tensor[B, L] int64) -> Tensor[B, L, D]
(embedding and transformer layers that skip padded positions).

    /usr/bin/python3 scripts/make_text_encoder.py OUTDIR --captions demo-data/train.csv [--dim 32]
OUTDIR gets spiece.model and text_encoder.pt. For a real one, see README (textencoder)."""
import argparse
import csv
import os

import sentencepiece as spm
import torch

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("outdir")
ap.add_argument("--captions", required=True, help="CSV manifest whose text|caption|prompt column trains the tokenizer")
ap.add_argument("--dim", type=int, default=32)
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()
os.makedirs(a.outdir, exist_ok=True)
with open(a.captions, newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
col = next((c for c in ("text", "caption", "prompt") if rows and c in rows[0]), None)
if col is None:
    raise SystemExit(f"{a.captions} has no text, caption or prompt column")
text = [r[col] for r in rows if r[col]]
corpus = os.path.join(a.outdir, "tokenizer-corpus.txt")
with open(corpus, "w", encoding="utf-8") as f:
    f.write("\n".join(text * 4) + "\n")
words = {w for t in text for w in t.split()}
spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(a.outdir, "spiece"),
                               vocab_size=max(16, min(200, len(words) + 8)), model_type="unigram", pad_id=0,
                               eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, minloglevel=2,
                               hard_vocab_limit=False)
os.remove(corpus)
vocab = spm.SentencePieceProcessor(model_file=os.path.join(a.outdir, "spiece.model")).get_piece_size()


class TextEncoder(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, 4, dim * 2, dropout=0.0, batch_first=True)
        # Without nested tensors: every position comes out, as T5 gives them.
        self.layers = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.layers(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
        return self.norm(h)


torch.manual_seed(a.seed)
torch.jit.script(TextEncoder(vocab, a.dim, a.layers).eval()).save(os.path.join(a.outdir, "text_encoder.pt"))
print(f"wrote {a.outdir}/spiece.model (vocabulary {vocab}) and {a.outdir}/text_encoder.pt (dim {a.dim})")
