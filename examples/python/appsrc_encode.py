#!/usr/bin/python3
"""An app that feeds vaeencoder its own frames from Python: appsrc ! vaeencoder ! appsink.

Each RGB frame carries a clip meta attached through the GstVideoTrain-1.0 typelib; each latent
that comes out is read with videotrain_tensor.tensor_from_buffer (a torch tensor whose shape
is the tensor meta's dims) together with its sample meta.

    export GST_PLUGIN_PATH=$PWD/build/plugins/videotrain
    export GI_TYPELIB_PATH=$PWD/build/gst-libs/gst/videotrain LD_LIBRARY_PATH=$PWD/build/gst-libs/gst/videotrain
    build/tools/videotrain-make-vae vae --tiny
    /usr/bin/python3 examples/python/appsrc_encode.py vae --frames 9 --size 64 --clips 2

(with an installed library, GI_TYPELIB_PATH and LD_LIBRARY_PATH are not needed). Prints one
line per latent, as examples/c/appsrc_encode.c does: "latent sample=S dims=[C, t, h, w] ...".
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from videotrain_tensor import GstVideoTrain, Gst, meta_dims, tensor_from_buffer  # noqa: E402


def make_frame(size, clip, frame, num_frames, pts):
    """The same colour ramp as the C example, moving with the frame number."""
    import torch
    y = torch.arange(size).view(size, 1).expand(size, size)
    x = torch.arange(size).view(1, size).expand(size, size)
    rgb = torch.stack([(x * 4 + frame * 8) % 256, (y * 4 + clip * 50) % 256, ((x + y) * 2) % 256], dim=2)
    buf = Gst.Buffer.new_wrapped(rgb.to(torch.uint8).numpy().tobytes())
    buf.pts = pts
    buf.duration = Gst.SECOND // 8
    meta = GstVideoTrain.buffer_add_videotrain_clip_meta(buf, f"a colour ramp, clip {clip}", "appsrc", "train")
    meta.sample_id = clip
    meta.clip_index = clip
    meta.frame_index = frame
    meta.num_frames = num_frames
    meta.source_frame = frame
    return buf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("vae", help="VAE folder (config.json + safetensors)")
    ap.add_argument("--frames", type=int, default=9)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--clips", type=int, default=2)
    a = ap.parse_args()
    Gst.init(None)
    pipeline = Gst.parse_launch(
        f"appsrc name=src format=time caps=video/x-raw,format=RGB,width={a.size},height={a.size},framerate=8/1 "
        f'! vaeencoder model="{a.vae}" latent=mode ! appsink name=sink sync=false')
    src, sink = pipeline.get_by_name("src"), pipeline.get_by_name("sink")
    pipeline.set_state(Gst.State.PLAYING)
    pts = 0
    for c in range(a.clips):
        for f in range(a.frames):
            src.emit("push-buffer", make_frame(a.size, c, f, a.frames, pts))
            pts += Gst.SECOND // 8
    src.emit("end-of-stream")

    bus = pipeline.get_bus()
    rc = 0
    while True:
        sample = sink.emit("try-pull-sample", Gst.SECOND // 10)
        if sample is not None:
            buf = sample.get_buffer()
            t = GstVideoTrain.buffer_get_videotrain_tensor_meta(buf)
            s = GstVideoTrain.buffer_get_videotrain_sample_meta(buf)
            latent = tensor_from_buffer(buf)
            assert list(latent.shape) == meta_dims(t)
            print(f"latent sample={s.sample_id} dims={meta_dims(t)} dtype={t.dtype} device={t.device} "
                  f"bytes={t.get_nbytes()} buffer={buf.get_size()} sum={latent.double().sum().item():.6f} "
                  f"caption={s.caption}", flush=True)
            continue
        msg = bus.pop_filtered(Gst.MessageType.ERROR)
        if msg is not None:
            err, debug = msg.parse_error()
            print(f"error from {msg.src.get_name()}: {err.message}\n{debug}", file=sys.stderr)
            rc = 1
            break
        if sink.get_property("eos"):
            break
    pipeline.set_state(Gst.State.NULL)
    return rc


if __name__ == "__main__":
    sys.exit(main())
