"""Element error paths in a Python app that imported torch before GStreamer (as training
apps do). torch's import puts libunwind.so.8 in the global symbol scope; the plugin once
unwound its exceptions with it and the whole process aborted instead of posting an error.
Each pipeline must post an element error from the named element; the process must exit 0."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch  # first, on purpose
from typing import List

import gi

gi.require_version("Gst", "1.0")
from gi.repository import Gst

Gst.init(None)
tmp = tempfile.mkdtemp(prefix="torch-first-")
ref = os.path.join(os.environ["VIDEOTRAIN_REFERENCE_DIR"], "cogvideox_vae", "tiny_a")


def vae_folder(name, edit_config=None, safetensors=None, source=ref):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    cfg = json.load(open(os.path.join(source, "config.json")))
    if edit_config:
        edit_config(cfg)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    st = os.path.join(d, "diffusion_pytorch_model.safetensors")
    if safetensors is None:
        shutil.copy(os.path.join(source, "diffusion_pytorch_model.safetensors"), st)
    else:
        open(st, "wb").write(safetensors)
    return d


def write(name, data):
    p = os.path.join(tmp, name)
    open(p, "wb").write(data)
    return p


frames = "videotestsrc num-buffers=1 ! video/x-raw,format=RGB,width=16,height=16,framerate=8/1 ! "
tensors = "appsrc caps=application/x-videotrain-tensor,content=micro-batch,dtype=float32,device=cpu ! "
latents = "appsrc caps=application/x-videotrain-tensor,content=latents,dtype=float32,device=cpu ! "
no_block_channels = vae_folder("no-block-out-channels", lambda c: c.pop("block_out_channels"))
wan = os.path.join(os.environ["VIDEOTRAIN_REFERENCE_DIR"], "wan_vae", "tiny_wan22")
wan_no_z = vae_folder("wan-no-z-dim", lambda c: c.pop("z_dim"), source=wan)
foreign_class = vae_folder("foreign-class", lambda c: c.update(_class_name="AutoencoderKLMochi"), source=wan)
header = json.dumps({"w": {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]}}).encode()
broken_safetensors = vae_folder("broken-safetensors", safetensors=struct.pack("<Q", len(header)) + header)
not_torchscript = write("not-torchscript.pt", b"PK\x03\x04 this is no zip archive")
umt5 = os.path.join(os.environ["VIDEOTRAIN_REFERENCE_DIR"], "text_encoder", "umt5_tiny")


def text_folder(name, edit_config=None, edit_tokenizer=None):
    d = os.path.join(tmp, name)
    shutil.copytree(umt5, d)
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)
    for file, edit in (("config.json", edit_config), ("tokenizer_config.json", edit_tokenizer)):
        if edit:
            j = json.load(open(os.path.join(d, file)))
            edit(j)
            json.dump(j, open(os.path.join(d, file), "w"))
    return d


t5_foreign_class = text_folder("t5-foreign-class", lambda c: c.update(architectures=["T5ForConditionalGeneration"]))
t5_three_layers = text_folder("t5-three-layers", lambda c: c.update(num_layers=3))  # block 2 is missing
t5_big_tokenizer = text_folder("t5-big-tokenizer", edit_tokenizer=lambda c: (c.pop("added_tokens_decoder"),
                                                                           c.update(extra_ids=200)))
os.remove(os.path.join(t5_big_tokenizer, "added_tokens.json"))
no_path_column = write("no-path-column.csv", b"name,text\na.mp4,a cat\n")


class Image(torch.nn.Module):  # a 2D encoder: conv2d throws on [1, 3, T, H, W] inside libtorch
    @torch.jit.export
    def encode(self, x):
        return torch.nn.functional.conv2d(x, torch.ones(4, 3, 8, 8), stride=8)


image_encoder = os.path.join(tmp, "image.pt")
torch.jit.script(Image()).save(image_encoder)


class SixteenChannels(torch.nn.Module):  # made for 16 latent channels; the VAE gives 4
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(16, 8)

    @torch.jit.export
    def training_step(self, latents: torch.Tensor, captions: List[str]) -> torch.Tensor:
        return self.head(latents.mean([2, 3, 4])).pow(2).mean()


wrong_channels = os.path.join(tmp, "wrong_channels.pt")
torch.jit.script(SixteenChannels()).save(wrong_channels)
video = Gst.parse_launch("videotestsrc num-buffers=10 ! video/x-raw,width=32,height=32,framerate=10/1 ! "
                         f"vp8enc ! webmmux ! filesink location={tmp}/a.webm")
video.set_state(Gst.State.PLAYING)
video.get_bus().timed_pop_filtered(60 * Gst.SECOND, Gst.MessageType.ERROR | Gst.MessageType.EOS)
video.set_state(Gst.State.NULL)
manifest = write("videos.csv", b"path,text\na.webm,test pattern\n")
prompts = write("prompts.txt", b"a red ball\n")
cases = [
    ("vaeencoder without block_out_channels", "vaeencoder", "block_out_channels",
     frames + f"vaeencoder name=vaeencoder model={no_block_channels} ! fakesink"),
    ("vaeencoder with a Wan config without z_dim", "vaeencoder", "'z_dim'",
     frames + f"vaeencoder name=vaeencoder model={wan_no_z} ! fakesink"),
    ("vaeencoder with a VAE class it does not read", "vaeencoder", "'AutoencoderKLMochi'",
     frames + f"vaeencoder name=vaeencoder model={foreign_class} ! fakesink"),
    ("vaeencoder with a broken safetensors", "vaeencoder", "needs more than 2^64",
     frames + f"vaeencoder name=vaeencoder model={broken_safetensors} ! fakesink"),
    ("vaeencoder with a file that is not TorchScript", "vaeencoder", "not-torchscript.pt",
     frames + f"vaeencoder name=vaeencoder model={not_torchscript} ! fakesink"),
    ("vaeencoder with a 2D TorchScript encoder (it throws in the streaming thread)", "vaeencoder", "conv2d",
     f"csvvideosrc location={manifest} num-epochs=0 num-frames=9 width=16 height=16 ! "
     f"vaeencoder name=vaeencoder model={image_encoder} ! fakesink"),
    # PyTorch's own message, the model's line and its inputs, not TorchScript's first line.
    ("ddptrainsink with a TorchScript model for 16 channels on a 4-channel VAE", "ddptrainsink",
     ("mat1 and mat2 shapes cannot be multiplied (1x4 and 16x8)", 'torch_first_errors.py", line',
      "in training_step: return self.head(latents.mean([2, 3, 4])).pow(2).mean()", "latents [1, 4, 2, 2, 2] Float"),
     f"csvvideosrc location={manifest} num-epochs=0 num-frames=5 width=16 height=16 ! "
     f"vaeencoder model={ref} ! microbatcher batch-size=1 ! "
     f"ddptrainsink name=ddptrainsink rank=0 world-size=1 model={wrong_channels}"),
    ("csvvideosrc with a missing manifest", "csvvideosrc", "does-not-exist.csv",
     f"csvvideosrc name=csvvideosrc location={tmp}/does-not-exist.csv ! fakesink"),
    ("csvvideosrc with a manifest without a path column", "csvvideosrc", "path column",
     f"csvvideosrc name=csvvideosrc location={no_path_column} ! fakesink"),
    ("ddptrainsink with a missing model", "ddptrainsink", "/nonexistent/model.pt",
     tensors + "ddptrainsink name=ddptrainsink rank=0 world-size=1 model=/nonexistent/model.pt"),
    ("ddptrainsink with a file that is not TorchScript", "ddptrainsink", "not-torchscript.pt",
     tensors + f"ddptrainsink name=ddptrainsink rank=0 world-size=1 model={not_torchscript}"),
    ("ddpvalsink with a trainer that does not exist", "ddpvalsink", "no-such-trainer",
     tensors + "ddpvalsink name=ddpvalsink trainer=no-such-trainer"),
    ("vaedecoder with a VAE class it does not read", "vaedecoder", "'AutoencoderKLMochi'",
     latents + f"vaedecoder name=vaedecoder model={foreign_class} ! fakesink"),
    ("vaedecoder given another VAE's latents", "vaedecoder", ("latents have 4 channels", "Wan 2.2", "takes 8"),
     f"csvvideosrc location={manifest} num-epochs=0 num-frames=5 width=32 height=32 ! "
     f"vaeencoder model={ref} latent=mode ! vaedecoder name=vaedecoder model={wan} ! fakesink"),
    # SentencePiece parses the file in its own module (its protobuf beside torch's libprotobuf).
    ("textencoder with a tokenizer that is not a SentencePiece model", "textencoder", "not-torchscript.pt",
     latents + f"textencoder name=textencoder tokenizer={not_torchscript} model={image_encoder} ! fakesink"),
    ("textencoder with a T5 folder of another class", "textencoder", (t5_foreign_class + "/config.json", "architectures"),
     latents + f"textencoder name=textencoder tokenizer={t5_foreign_class} model={t5_foreign_class} ! fakesink"),
    # The weights load inside libtorch (load_strict throws there).
    ("textencoder with a T5 folder that lacks a block", "textencoder", ("model.safetensors", "encoder.block.2."),
     latents + f"textencoder name=textencoder tokenizer={t5_three_layers} model={t5_three_layers} ! fakesink"),
    ("textencoder with a tokenizer larger than the vocabulary", "textencoder",
     (t5_big_tokenizer + "/tokenizer_config.json", "vocab_size 448"),
     latents + f"textencoder name=textencoder tokenizer={t5_big_tokenizer} model={t5_big_tokenizer} ! fakesink"),
    ("textencoder with a missing tokenizer", "textencoder", "/nonexistent/spiece.model",
     latents + f"textencoder name=textencoder tokenizer=/nonexistent/spiece.model model={image_encoder} ! fakesink"),
    # Sampling branches: what a user mistypes is an error at start naming it.
    ("promptsrc with a missing prompt file", "promptsrc", "/nonexistent/prompts.txt",
     "promptsrc name=promptsrc location=/nonexistent/prompts.txt ! fakesink"),
    ("ddpsampler whose trainer is not in the pipeline", "ddpsampler", "No element named 'nope'",
     f"promptsrc location={prompts} ! ddpsampler name=ddpsampler trainer=nope ! fakesink"),
    ("samplesink with an encoder that is not installed", "samplesink", "nosuchenc",
     f"videotestsrc num-buffers=1 ! samplesink name=samplesink encoder=\"videoconvert ! nosuchenc ! mp4mux\" "
     f"location={tmp}/s/%d-%d.mp4"),
    ("samplesink with a location that does not name step and prompt", "samplesink", ("one.mp4", "two"),
     f"videotestsrc num-buffers=1 ! samplesink name=samplesink location={tmp}/one.mp4"),
]

failures = 0
for title, element, wanted, desc in cases:
    pipe = Gst.parse_launch(desc)
    pipe.set_state(Gst.State.PLAYING)
    msg = pipe.get_bus().timed_pop_filtered(60 * Gst.SECOND, Gst.MessageType.ERROR | Gst.MessageType.EOS)
    text = ""
    if msg and msg.type == Gst.MessageType.ERROR:
        err, dbg = msg.parse_error()
        text = f"{msg.src.get_name()}: {err.message} | {dbg}"
    wants = wanted if isinstance(wanted, tuple) else (wanted,)
    ok = (msg is not None and msg.type == Gst.MessageType.ERROR and msg.src.get_name() == element
          and all(w in text for w in wants))
    print(f"{'ok' if ok else 'FAIL'}: {title}: {text or (msg.type if msg else 'no message in 60 s')}", flush=True)
    failures += not ok
    pipe.set_state(Gst.State.NULL)
# The same throw in gst-launch-1.0 (no torch, libgstreamer's libunwind.so.8 first in scope).
launch = subprocess.run(["gst-launch-1.0", "csvvideosrc", f"location={manifest}", "num-frames=9", "width=16",
                         "height=16", "!", "vaeencoder", f"model={image_encoder}", "!", "fakesink"],
                        capture_output=True, text=True, timeout=120)
ok = launch.returncode == 1 and "conv2d" in launch.stdout + launch.stderr
print(f"{'ok' if ok else 'FAIL'}: gst-launch-1.0 with a 2D TorchScript encoder exits {launch.returncode}", flush=True)
failures += not ok
cases.append("gst-launch-1.0")
shutil.rmtree(tmp)
print(f"{len(cases) - failures} of {len(cases)} error paths posted their element error")
sys.exit(1 if failures else 0)
