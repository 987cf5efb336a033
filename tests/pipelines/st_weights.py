"""The tensors of safetensors files as float32 torch tensors, for the pipeline tests and benches that
compare trained weights (plain json + torch: no safetensors package on Debian)."""
import glob
import json
import struct

import torch

_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def weights(path):
    """One .safetensors file: {name: float32 tensor}."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=_DTYPES[v["dtype"]]).reshape(v["shape"]).float()
    return out


def folder_weights(folder):
    """Every .safetensors file of a folder (a sharded diffusers export) merged."""
    out = {}
    for path in sorted(glob.glob(f"{folder}/*.safetensors")):
        out.update(weights(path))
    return out


def flat(ws):
    """All tensors of a {name: tensor} in one vector, in name order."""
    return torch.cat([ws[k].flatten() for k in sorted(ws)])
