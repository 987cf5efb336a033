#!/usr/bin/python3
"""The GstVideoTrain-1.0 typelib and examples/python/videotrain_tensor.py from Python: every meta
written and read through GI, and a buffer of three tensors (main float32, named bfloat16 and
int64) turned into torch tensors equal to the ones its bytes were made from."""
import os
import sys

sys.path.insert(0, os.path.join(os.environ["VIDEOTRAIN_SOURCE_DIR"], "examples", "python"))
from videotrain_tensor import Gst, GstVideoTrain as VT, meta_dims, tensor_from_buffer, tensors_from_buffer  # noqa: E402
import torch  # noqa: E402

Gst.init(None)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


# Clip meta: attached as an app does, read back after a copy (the transform keeps it).
buf = Gst.Buffer.new_allocate(None, 12, None)
clip = VT.buffer_add_videotrain_clip_meta(buf, "a cat", "cat.mp4", None)
clip.sample_id, clip.frame_index, clip.num_frames, clip.epoch = 7, 3, 9, 2
copy = buf.copy_deep()  # a meta lives as long as its buffer: keep the copy referenced
got = VT.buffer_get_videotrain_clip_meta(copy)
check((got.sample_id, got.frame_index, got.num_frames, got.epoch) == (7, 3, 9, 2), "clip meta numbers")
check((got.caption, got.path, got.split) == ("a cat", "cat.mp4", None), "clip meta strings")
check(VT.buffer_get_videotrain_sample_meta(buf) is None, "a frame has no sample meta")

# Sample meta from a clip meta.
latent = Gst.Buffer.new()
VT.buffer_add_videotrain_sample_meta_from_clip(latent, got)
s = VT.buffer_get_videotrain_sample_meta(latent)
check((s.sample_id, s.epoch, s.caption, s.path) == (7, 2, "a cat", "cat.mp4"), "sample meta from the clip")

# Batch meta: per-sample values through get_sample and the arrays.
b = VT.buffer_add_videotrain_batch_meta(latent)
b.step, b.sync = 4, True
b.append(11, 1, 30, "first", False)
b.append(12, 2, 31, None, True)
b = VT.buffer_get_videotrain_batch_meta(latent)
check((b.step, b.sync, b.get_n_samples()) == (4, True, 2), "batch meta scalars")
check(tuple(b.get_sample(1)) == (True, 12, 2, 31, "", True), f"batch sample 1: {b.get_sample(1)}")
check(list(b.sample_ids) == [11, 12] and list(b.captions) == ["first", ""], "batch meta arrays")

# Tensors: bytes made from known torch tensors, metas as vaeencoder/textencoder write them.
main = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 7
emb = (torch.arange(10, dtype=torch.float32).reshape(5, 2) - 3).to(torch.bfloat16)
mask = torch.tensor([1, 1, 1, 0, 0], dtype=torch.int64)
parts = [main, emb, mask]
raw = b"".join(t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
               for t in parts)
tb = Gst.Buffer.new_wrapped(raw)
off = 0
for t, name, dtype in zip(parts, ["", "text_embeds", "text_mask"], ["float32", "bfloat16", "int64"]):
    VT.buffer_add_videotrain_tensor_meta(tb, dtype, "cpu", list(t.shape), name, off)
    off += t.numel() * t.element_size()
m = VT.buffer_get_videotrain_tensor_meta(tb)
check((m.dtype, m.device, m.ndim, meta_dims(m), m.name) == ("float32", "cpu", 3, [2, 3, 4], ""), "main tensor meta")
check(m.get_nbytes() == 96, "main tensor bytes")
check(list(VT.buffer_get_videotrain_tensor_names(tb)) == ["text_embeds", "text_mask"], "named tensors")
check(torch.equal(tensor_from_buffer(tb), main), "main tensor values")
all_ = tensors_from_buffer(tb)
check(set(all_) == {"", "text_embeds", "text_mask"}, f"tensors {sorted(all_)}")
check(all_["text_embeds"].dtype == torch.bfloat16 and torch.equal(all_["text_embeds"], emb), "bfloat16 tensor")
check(torch.equal(all_["text_mask"], mask), "int64 tensor")
try:
    tensor_from_buffer(tb, "absent")
    sys.exit("FAIL: a missing tensor name did not raise")
except ValueError:
    pass
print("GI metas and videotrain_tensor: ok")
