#!/usr/bin/python3
"""Makes a small text encoder for demos and tests, shaped like a T5 encoder for textencoder:
a SentencePiece tokenizer (unigram; T5's special ids: pad 0, EOS 1, UNK 2, no BOS) trained on the
captions of a manifest, and a seeded random encoder, either
  --format torchscript (default): text_encoder.pt,
      forward(input_ids: Tensor[B, L] int64, attention_mask: Tensor[B, L] int64) -> Tensor[B, L, D]
      (embedding and transformer layers that skip padded positions), or
  --format t5 | umt5: a transformers folder text_encoder/ (config.json, model.safetensors) of a
      T5EncoderModel (T5 v1.1, CogVideoX's) or UMT5EncoderModel (Wan's) at toy widths, the real
      architecture, which textencoder and videotrain-model load natively and transformers loads too.

    /usr/bin/python3 scripts/make_text_encoder.py OUTDIR --captions demo-data/train.csv [--dim 32]
        [--format torchscript|t5|umt5] [--layers 2] [--seed 0]
OUTDIR gets spiece.model and text_encoder.pt or text_encoder/. For a real one, see docs/elements/textencoder.md."""
import argparse
import csv
import json
import os
import struct

import sentencepiece as spm
import torch

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("outdir")
ap.add_argument("--captions", required=True, help="CSV manifest whose text|caption|prompt column trains the tokenizer")
ap.add_argument("--dim", type=int, default=32)
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--format", choices=("torchscript", "t5", "umt5"), default="torchscript")
a = ap.parse_args()
if a.format != "torchscript" and (a.dim < 8 or a.dim % 4):
    raise SystemExit(f"--dim {a.dim}: a T5 folder needs a multiple of 4 (4 heads), at least 8")
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


def t5_folder(out: str, umt5: bool, vocab: int, dim: int, layers: int) -> None:
    """transformers' tensor names and config keys (T5 v1.1 gated-GELU, no biases, relative position
    buckets: in block 0 only for T5, in every block for umT5), written as safetensors by hand."""
    heads, buckets, d_ff = 4, 32, 2 * dim
    config = {
        "architectures": ["UMT5EncoderModel" if umt5 else "T5EncoderModel"], "model_type": "umt5" if umt5 else "t5",
        "d_model": dim, "d_kv": dim // heads, "d_ff": d_ff, "num_heads": heads, "num_layers": layers,
        "num_decoder_layers": layers, "vocab_size": vocab, "relative_attention_num_buckets": buckets,
        "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu", "dense_act_fn": "gelu_new",
        "is_gated_act": True, "layer_norm_epsilon": 1e-6, "dropout_rate": 0.0, "initializer_factor": 1.0,
        "is_encoder_decoder": True, "tie_word_embeddings": False, "pad_token_id": 0, "eos_token_id": 1,
        "decoder_start_token_id": 0, "use_cache": True, "torch_dtype": "float32"}
    if umt5:
        config["tokenizer_class"] = "T5Tokenizer"
    g = torch.Generator().manual_seed(a.seed)
    w = {"shared.weight": torch.randn(vocab, dim, generator=g)}
    for i in range(layers):
        att = f"encoder.block.{i}.layer.0."
        for n in "qkvo":
            w[att + f"SelfAttention.{n}.weight"] = torch.randn(dim, dim, generator=g) * dim ** -0.5
        if umt5 or i == 0:
            w[att + "SelfAttention.relative_attention_bias.weight"] = torch.randn(buckets, heads, generator=g) * 0.5
        w[att + "layer_norm.weight"] = 1 + 0.1 * torch.randn(dim, generator=g)
        ff = f"encoder.block.{i}.layer.1."
        w[ff + "DenseReluDense.wi_0.weight"] = torch.randn(d_ff, dim, generator=g) * dim ** -0.5
        w[ff + "DenseReluDense.wi_1.weight"] = torch.randn(d_ff, dim, generator=g) * dim ** -0.5
        w[ff + "DenseReluDense.wo.weight"] = torch.randn(dim, d_ff, generator=g) * d_ff ** -0.5
        w[ff + "layer_norm.weight"] = 1 + 0.1 * torch.randn(dim, generator=g)
    w["encoder.final_layer_norm.weight"] = 1 + 0.1 * torch.randn(dim, generator=g)
    os.makedirs(out, exist_ok=True)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(w):
        data = w[name].contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(w[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode() + b"".join(blobs))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


torch.manual_seed(a.seed)
if a.format == "torchscript":
    torch.jit.script(TextEncoder(vocab, a.dim, a.layers).eval()).save(os.path.join(a.outdir, "text_encoder.pt"))
    print(f"wrote {a.outdir}/spiece.model (vocabulary {vocab}) and {a.outdir}/text_encoder.pt (dim {a.dim})")
else:
    t5_folder(os.path.join(a.outdir, "text_encoder"), a.format == "umt5", vocab, a.dim, a.layers)
    print(f"wrote {a.outdir}/spiece.model (vocabulary {vocab}) and {a.outdir}/text_encoder/ "
          f"({'UMT5EncoderModel' if a.format == 'umt5' else 'T5EncoderModel'}, d_model {a.dim}, {a.layers} layers)")
