"""Turns a gst-videotrain tensor buffer (vaeencoder's latents, microbatcher's micro-batches,
taken from an appsink) into torch tensors, reading dtype and shape from the tensor meta
through the GstVideoTrain-1.0 typelib.

    from videotrain_tensor import tensor_from_buffer, tensors_from_buffer
    latent = tensor_from_buffer(sample.get_buffer())          # the main tensor, e.g. [C, t, h, w]
    parts = tensors_from_buffer(buf)                          # {"": main, "text_embeds": ..., ...}

The tensors are copies in CPU memory (the buffer's memory is only mapped while copying).
"""
import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstVideoTrain", "1.0")
from gi.repository import Gst, GstVideoTrain  # noqa: E402
import torch  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64}


def meta_dims(meta):
    """The shape a tensor meta gives, as a list of ints."""
    return list(meta.dims[: meta.ndim])


def _tensor(data, meta):
    dtype = DTYPES.get(meta.dtype)
    if dtype is None:
        raise ValueError(f"tensor meta '{meta.name}' has unknown dtype '{meta.dtype}'")
    nbytes = meta.get_nbytes()
    if meta.offset + nbytes > len(data):
        raise ValueError(f"tensor meta '{meta.name}' needs {nbytes} bytes at offset {meta.offset}, "
                         f"but the buffer holds {len(data)}")
    raw = bytearray(data[meta.offset: meta.offset + nbytes])
    if nbytes == 0:
        return torch.empty(meta_dims(meta), dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(meta_dims(meta))


def _mapped(buf):
    ok, info = buf.map(Gst.MapFlags.READ)
    if not ok:
        raise ValueError("cannot map the buffer")
    try:
        return bytes(info.data)
    finally:
        buf.unmap(info)


def tensor_from_buffer(buf, name=""):
    """The tensor called `name` ("" for the main one) of a Gst.Buffer, as a CPU torch tensor."""
    meta = GstVideoTrain.buffer_get_videotrain_tensor_meta_by_name(buf, name)
    if meta is None:
        raise ValueError(f"the buffer has no tensor meta named '{name}'")
    return _tensor(_mapped(buf), meta)


def tensors_from_buffer(buf):
    """Every tensor of a Gst.Buffer by name ("" is the main one)."""
    data = _mapped(buf)
    out = {}
    main = GstVideoTrain.buffer_get_videotrain_tensor_meta(buf)
    if main is None:
        raise ValueError("the buffer has no tensor meta")
    out[""] = _tensor(data, main)
    for name in GstVideoTrain.buffer_get_videotrain_tensor_names(buf):
        out[name] = _tensor(data, GstVideoTrain.buffer_get_videotrain_tensor_meta_by_name(buf, name))
    return out
