#!/usr/bin/env python3
"""videotrain-model as a user checks a folder with it: forward --backward on the reference case's
inputs (written to a safetensors file here) gives diffusers' output and gradients; export writes a
bf16 sharded folder that forward reads back; init makes a seeded folder; info and forward on T5 / umT5
text-encoder folders give transformers' outputs; vae encode / decode and scheduler give diffusers'
(stored references: the live ones are tests/interop); bad input is an error saying what to give."""
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch

build = os.environ["VIDEOTRAIN_BUILD_DIR"]
ref = os.environ["VIDEOTRAIN_REFERENCE_DIR"]
tool = os.path.join(build, "tools", "videotrain-model")
DT = {"F32": torch.float32, "I64": torch.int64, "BF16": torch.bfloat16, "F64": torch.float64, "U8": torch.uint8}
failures = []


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in h.items():
        if k != "__metadata__":
            b, e = v["data_offsets"]
            out[k] = torch.frombuffer(bytearray(data[b:e]), dtype=DT[v["dtype"]]).reshape(v["shape"])
    return out, h.get("__metadata__", {})


def write(path, tensors):
    header, blobs, off = {}, [], 0
    for k, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[k] = {"dtype": {torch.float32: "F32", torch.int64: "I64", torch.uint8: "U8"}[t.dtype], "shape": list(t.shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    return subprocess.run([tool, *args], capture_output=True, text=True)


tmp = tempfile.mkdtemp(prefix="vt-model-tool-")
model = os.path.join(ref, "dit", "wan_t2v_tiny")
cases, _ = read(os.path.join(model, "cases.safetensors"))
c = "b2_t3_h8_w12"
inp = os.path.join(tmp, "in.safetensors")
write(inp, {"hidden_states": cases[f"input.{c}.hidden_states"], "timestep": cases[f"input.{c}.timestep"],
            "encoder_hidden_states": cases[f"input.{c}.encoder_hidden_states"], "cotangent": cases[f"cotangent.{c}"]})
out = os.path.join(tmp, "out.safetensors")
r = run("forward", model, inp, out, "--backward")
check(r.returncode == 0, "forward --backward runs: " + r.stderr.strip())
got, _ = read(out)
check(rel(got["output"], cases[f"output.{c}"]) < 1e-5, "output equals diffusers' (1e-5)")
check(rel(got["grad.hidden_states"], cases[f"grad_input.{c}.hidden_states"]) < 1e-5, "grad.hidden_states (1e-5)")
check(rel(got["grad.encoder_hidden_states"], cases[f"grad_input.{c}.encoder_hidden_states"]) < 1e-5,
      "grad.encoder_hidden_states (1e-5)")
params = [k for k in cases if k.startswith(f"grad.{c}.")]
worst = max(rel(got["grad." + k[len(f"grad.{c}."):]], cases[k]) for k in params)
check(len(params) > 40 and worst < 1e-4, f"all {len(params)} parameter gradients (worst {worst:.2g} < 1e-4)")

# --lora in the original/ComfyUI naming: PEFT's output and the LoRA gradients in diffusers' naming.
lora_cases, _ = read(os.path.join(ref, "dit", "wan_t2v_tiny_lora", "cases.safetensors"))
write(inp, {"hidden_states": cases[f"input.{c}.hidden_states"], "timestep": cases[f"input.{c}.timestep"],
            "encoder_hidden_states": cases[f"input.{c}.encoder_hidden_states"], "cotangent": lora_cases[f"cotangent.{c}"]})
r = run("forward", model, inp, out, "--backward", "--lora",
        os.path.join(ref, "dit", "wan_t2v_tiny_lora", "lora_original_wan_naming.safetensors"))
check(r.returncode == 0, "forward --lora (ComfyUI naming) runs: " + r.stderr.strip())
got, _ = read(out)
check(rel(got["output"], lora_cases[f"output.{c}"]) < 1e-5, "output with the LoRA equals PEFT's (1e-5)")
lk = [k for k in lora_cases if k.startswith(f"grad.{c}.")]
worst = max(rel(got["grad." + k[len(f"grad.{c}."):]], lora_cases[k]) for k in lk)
check(len(lk) == 40 and worst < 1e-4, f"the 40 LoRA gradients in diffusers naming (worst {worst:.2g})")
check(not any(k.startswith("grad.blocks.") for k in got), "no base gradients with --lora")

# lora convert: diffusers -> comfyui -> kohya -> diffusers keeps every tensor bit for bit and the alpha.
lref = os.path.join(ref, "dit", "wan_t2v_tiny_lora")
chain = [os.path.join(lref, "pytorch_lora_weights.safetensors")]
for fmt in ("comfyui", "kohya", "diffusers"):
    chain.append(os.path.join(tmp, f"conv-{len(chain)}-{fmt}.safetensors"))
    r = run("lora", "convert", chain[-2], chain[-1], "--format", fmt)
    check(r.returncode == 0, f"lora convert to {fmt}: " + r.stderr.strip())
a, ma = read(chain[0])
b, mb = read(chain[-1])
check(sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), "convert round trip is bit-exact")
ca, cb = json.loads(ma["lora_adapter_metadata"]), json.loads(mb["lora_adapter_metadata"])
check(ca["transformer.r"] == cb["transformer.r"] == 4 and ca["transformer.lora_alpha"] == cb["transformer.lora_alpha"] == 8,
      "r and lora_alpha survive the round trip")
com, _ = read(chain[1])
orig, _ = read(os.path.join(lref, "lora_original_wan_naming.safetensors"))
check(sorted(com) == sorted(orig) and all(torch.equal(com[k], orig[k]) for k in orig),
      "converting the diffusers file to ComfyUI naming gives the shared original-naming file exactly")

# lora merge: the merged folder's output equals forward with the LoRA.
merged = os.path.join(tmp, "merged")
r = run("lora", "merge", model, chain[1], merged, "--dtype", "fp32")
check(r.returncode == 0, "lora merge: " + r.stderr.strip())
write(inp, {"hidden_states": cases[f"input.{c}.hidden_states"], "timestep": cases[f"input.{c}.timestep"],
            "encoder_hidden_states": cases[f"input.{c}.encoder_hidden_states"]})
r = run("forward", merged, inp, out)
check(r.returncode == 0 and rel(read(out)[0]["output"], lora_cases[f"output_merged.{c}"]) < 1e-5,
      "the merged folder's output equals PEFT's fused model (1e-5)")

# The text-padding case through the mask: rows past each caption zeroed by the tool.
c = "b2_textpad"
lens = json.loads(read(os.path.join(model, "cases.safetensors"))[1]["cases"])[c]["valid_text_lengths"]
mask = torch.zeros(2, 16, dtype=torch.int64)
for i, n in enumerate(lens):
    mask[i, :n] = 1
noisy = cases[f"input.{c}.encoder_hidden_states"] + (1 - mask).unsqueeze(-1) * 3.0  # garbage in the padding
write(inp, {"hidden_states": cases[f"input.{c}.hidden_states"], "timestep": cases[f"input.{c}.timestep"],
            "encoder_hidden_states": noisy, "encoder_attention_mask": mask})
r = run("forward", model, inp, out)
check(r.returncode == 0 and rel(read(out)[0]["output"], cases[f"output.{c}"]) < 1e-5,
      "encoder_attention_mask zeroes the padding rows as Wan's pipelines do")

# export: bf16 shards with an index; forward reads the folder.
exp = os.path.join(tmp, "exported")
r = run("export", model, exp, "--dtype", "bf16", "--max-shard-bytes", "30000")
idx = os.path.join(exp, "diffusion_pytorch_model.safetensors.index.json")
check(r.returncode == 0 and os.path.exists(idx), "export writes a sharded bf16 folder with its index")
shards = set(json.load(open(idx))["weight_map"].values())
check(len(shards) >= 2 and all(os.path.exists(os.path.join(exp, s)) for s in shards), f"{len(shards)} shards")
r = run("forward", exp, inp, out)
check(r.returncode == 0 and 0 < rel(read(out)[0]["output"], cases[f"output.{c}"]) < 3e-2, "the bf16 folder runs")

# init: a seeded folder of a config; the same seed gives the same weights.
a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
for d in (a, b):
    r = run("init", os.path.join(model, "config.json"), d, "--seed", "5")
    check(r.returncode == 0, "init " + r.stderr.strip())
check(open(os.path.join(a, "diffusion_pytorch_model.safetensors"), "rb").read() ==
      open(os.path.join(b, "diffusion_pytorch_model.safetensors"), "rb").read(), "init is seeded")

# Errors: a missing input tensor, a wrong shape, a folder of another class.
write(inp, {"hidden_states": cases[f"input.{c}.hidden_states"][:, :3], "timestep": cases[f"input.{c}.timestep"],
            "encoder_hidden_states": noisy})
r = run("forward", model, inp, out)
check(r.returncode == 1 and "hidden_states has shape" in r.stderr, "a wrong shape is an error: " + r.stderr.strip())
write(inp, {"hidden_states": cases[f"input.{c}.hidden_states"]})
r = run("forward", model, inp, out)
check(r.returncode == 1 and "timestep" in r.stderr, "a missing input is an error: " + r.stderr.strip())
# info CONFIG.json: the memory formula from a Wan config alone gives what the folder's weights and
# modules give (diffusers' count of the published configs: tests/interop/diffusers_folders.py).
def memory_lines(text):
    return text[text.index("parameters "):text.index("LoRA r32 +EMA")] if "LoRA r32 +EMA" in text else ""


for name, total in [("wan_t2v_tiny", 37744), ("wan22_ti2v_tiny", 38784)]:
    folder = os.path.join(ref, "dit", name)
    from_config, from_folder = run("info", os.path.join(folder, "config.json")), run("info", folder)
    check(from_config.returncode == 0 and memory_lines(from_config.stdout) != "" and
          memory_lines(from_config.stdout) == memory_lines(from_folder.stdout) and
          f"parameters {total} (" in from_config.stdout,
          f"info {name}/config.json prints the folder's parameter counts and memory table: " + from_config.stderr.strip())
r = run("info", os.path.join(ref, "dit", "cogvideox_2b_tiny", "config.json"))
check(r.returncode == 1 and "give the model folder" in r.stderr, "info on a CogVideoX config.json says to give the folder: " +
      r.stderr.strip())
r = run("info", os.path.join(ref, "wan_vae", "tiny_wan21"))
check(r.returncode == 0 and "class: AutoencoderKLWan (Wan 2.1)" in r.stdout and "compression 4x in time and 8x8" in r.stdout,
      "info on a VAE folder names its class and compression: " + r.stderr.strip())
r = run("forward", os.path.join(ref, "wan_vae", "tiny_wan21"), inp, out)
check(r.returncode == 1 and "vae encode|decode" in r.stderr, "forward on a VAE folder points to vae encode|decode: " +
      r.stderr.strip())
# CogVideoX folders: info names the class and its LoRA targets; forward --backward in the class's own
# layout ([B, F, C, H, W]) equals diffusers on each layout's first case; an export runs.
for name, c in (("cogvideox_2b_tiny", "b2_t3_h8_w12"), ("cogvideox_5b_tiny", "b2_t3_h8_w12"),
                ("cogvideox15_tiny", "b2_t4_h8_w12")):
    cog = os.path.join(ref, "dit", name)
    r = run("info", cog)
    check(r.returncode == 0 and "CogVideoXTransformer3DModel (family cogvideox)" in r.stdout and
          "transformer_blocks.{i}.attn1.to_q  (x2)" in r.stdout, f"info {name}: " + r.stderr.strip())
    cc, _ = read(os.path.join(cog, "cases.safetensors"))
    write(inp, {"hidden_states": cc[f"input.{c}.hidden_states"], "timestep": cc[f"input.{c}.timestep"],
                "encoder_hidden_states": cc[f"input.{c}.encoder_hidden_states"], "cotangent": cc[f"cotangent.{c}"]})
    r = run("forward", cog, inp, out, "--backward")
    got, _ = read(out) if r.returncode == 0 else ({}, {})
    check(r.returncode == 0 and rel(got["output"], cc[f"output.{c}"]) < 1e-5 and
          rel(got["grad.hidden_states"], cc[f"grad_input.{c}.hidden_states"]) < 1e-5,
          f"forward --backward {name} equals diffusers (1e-5): " + r.stderr.strip())
    exp = os.path.join(tmp, "exported-" + name)
    r = run("export", cog, exp, "--dtype", "bf16")
    r2 = run("forward", exp, inp, out)
    check(r.returncode == 0 and r2.returncode == 0 and 0 < rel(read(out)[0]["output"], cc[f"output.{c}"]) < 3e-2,
          f"export {name} as bf16 runs: " + r.stderr.strip() + r2.stderr.strip())

# Text encoders (transformers T5EncoderModel / UMT5EncoderModel folders): info, and forward on the stored
# tokenized captions with and without their padding mask equals transformers' last_hidden_state.
for name, tag, cls in (("t5_v11_tiny", "cogvideox", "T5EncoderModel"), ("umt5_tiny", "wan", "UMT5EncoderModel")):
    te = os.path.join(ref, "text_encoder", name)
    r = run("info", te)
    check(r.returncode == 0 and f"class: {cls}" in r.stdout and "parameters: " in r.stdout and "d_model 32" in r.stdout,
          f"info {name} names {cls}, its sizes and parameters: " + r.stderr.strip())
    tc, _ = read(os.path.join(te, "cases.safetensors"))
    for masked in (True, False):
        feed = {"input_ids": tc[f"input_ids.{tag}"]}
        if masked:
            feed["attention_mask"] = tc[f"attention_mask.{tag}"]
        write(inp, feed)
        r = run("forward", te, inp, out)
        want = tc[f"last_hidden_state.{tag}.{'masked' if masked else 'nomask'}"]
        check(r.returncode == 0 and rel(read(out)[0]["last_hidden_state"], want) < 1e-5,
              f"forward {name} {'with' if masked else 'without'} the mask equals transformers (1e-5): " + r.stderr.strip())
write(inp, {"hidden_states": torch.zeros(1, 4, 2, 4, 4), "timestep": torch.zeros(1)})
r = run("forward", os.path.join(ref, "text_encoder", "umt5_tiny"), inp, out)
check(r.returncode == 1 and "input_ids" in r.stderr and "attention_mask" in r.stderr,
      "a text encoder given a transformer's inputs says to give input_ids and attention_mask: " + r.stderr.strip())
write(inp, {"input_ids": tc["input_ids.wan"]})
r = run("forward", model, inp, out)
check(r.returncode == 1 and "hidden_states" in r.stderr and "encoder_hidden_states" in r.stderr,
      "a transformer given token ids says what it takes: " + r.stderr.strip())

# Image encoders (transformers CLIPVisionModel / CLIPVisionModelWithProjection folders, Wan I2V's
# image_encoder/): info, forward on pixel_values, and on 8-bit images through the image_processor/ beside
# the folder, equal transformers' hidden states and processor (tests/reference/clip_vision).
cv = os.path.join(ref, "clip_vision")
ic, _ = read(os.path.join(cv, "cases.safetensors"))
for name, cls in (("vit_tiny", "CLIPVisionModel"), ("vit_tiny_proj", "CLIPVisionModelWithProjection")):
    r = run("info", os.path.join(cv, name))
    check(r.returncode == 0 and f"class: {cls} " in r.stdout and "17 tokens" in r.stdout and
          "image processor: " in r.stdout, f"info {name} names {cls}, its tokens and processor: " + r.stderr.strip())
    write(inp, {"pixel_values": ic["pixel_values"]})
    r = run("forward", os.path.join(cv, name), inp, out)
    got = read(out)[0] if r.returncode == 0 else {}
    worst = max(rel(got[f"hidden_states.{i}"], ic[f"hidden_states.{name}.{i}"]) for i in range(4)) if got else 1.0
    check(worst < 1e-5, f"forward {name}: every hidden state equals transformers' (worst {worst:.2g}): " + r.stderr.strip())
write(inp, {"images": ic["image.down"][None].clone()})
r = run("forward", os.path.join(cv, "vit_tiny"), inp, out)
got = read(out)[0] if r.returncode == 0 else {}
check(bool(got) and torch.equal(got["pixel_values"][0], ic["pixel_values"][0]) and
      rel(got["hidden_states.2"][0], ic["hidden_states.vit_tiny.2"][0]) < 1e-5,
      "forward on a 72x128 image: CLIPImageProcessor's pixel_values and Wan's hidden_states[-2]: " + r.stderr.strip())

# VAEs: encode gives diffusers' moments and the normalized mode latent (Wan 2.1, 2.2); decoding the
# normalized latent with --normalized equals decoding the mean.
for name in ("tiny_wan21", "tiny_wan22"):
    vae = os.path.join(ref, "wan_vae", name)
    vc, _ = read(os.path.join(vae, "cases.safetensors"))
    write(inp, {"sample": vc["input.T5"]})
    r = run("vae", "encode", vae, inp, out)
    got = read(out)[0] if r.returncode == 0 else {}
    check(r.returncode == 0 and rel(got["moments"], vc["moments.T5"]) < 1e-5 and
          rel(got["latents"], vc["latent_mode.T5"]) < 1e-5, f"vae encode {name} equals diffusers (1e-5): " + r.stderr.strip())
    if r.returncode == 0:
        write(inp, {"latents": got["mean"]})
        r = run("vae", "decode", vae, inp, out)
        a = read(out)[0]["sample"] if r.returncode == 0 else torch.zeros(1)
        write(inp, {"latents": got["latents"]})
        r2 = run("vae", "decode", vae, inp, out, "--normalized")
        b = read(out)[0]["sample"] if r2.returncode == 0 else torch.zeros(1)
        check(tuple(a.shape) == (1, 3, 5, 64, 96) and a.abs().max() <= 1 and rel(b, a) < 1e-5,
              f"vae decode {name}: [1, 3, 5, 64, 96] in [-1, 1]; --normalized undoes the normalization: " +
              r.stderr.strip() + r2.stderr.strip())
write(inp, {"latents": torch.zeros(1, 4, 2, 8, 12)})
r = run("vae", "encode", os.path.join(ref, "wan_vae", "tiny_wan21"), inp, out)
check(r.returncode == 1 and "sample [B, 3, T, H, W]" in r.stderr, "vae encode without `sample` says what to give: " +
      r.stderr.strip())
r = run("vae", "encode", model, inp, out)
check(r.returncode == 1 and "not a VAE" in r.stderr, "vae on a transformer folder is refused: " + r.stderr.strip())

# scheduler: the samplers' schedules and steps equal the stored diffusers ones (DPM with its generator seed).
sc, smeta = read(os.path.join(ref, "schedulers", "schedules.safetensors"))
for kind, tag, shift in (("unipc", "unipc.shift3", 3), ("euler", "flowmatch.shift5", 5), ("dpm", "cogvideox_dpm.snr3", 3)):
    write(inp, {"sample": sc[f"{tag}.n8.steps.samples"][0], "model_outputs": sc[f"{tag}.n8.steps.model_outputs"]})
    r = run("scheduler", kind, out, "--steps", "8", "--shift", str(shift), "--in", inp, "--seed", smeta["dpm_generator_seed"])
    got = read(out)[0] if r.returncode == 0 else {}
    want_t = sc[f"{tag}.n8.timesteps"]
    check(r.returncode == 0 and got["timesteps"].dtype == want_t.dtype and
          torch.allclose(got["timesteps"].double(), want_t.double(), rtol=1e-6, atol=0) and
          max(rel(got["samples"][k], sc[f"{tag}.n8.steps.samples"][k]) for k in range(1, 9)) < 1e-5,
          f"scheduler {kind}: timesteps and 8 steps equal diffusers': " + r.stderr.strip())
r = run("scheduler", "heun", out)
check(r.returncode == 1 and "unipc" in r.stderr, "an unknown sampler names the ones there are: " + r.stderr.strip())

# lora convert without --format says which formats exist.
r = run("lora", "convert", chain[0], os.path.join(tmp, "x.safetensors"))
check(r.returncode == 2 and all(f in r.stderr for f in ("diffusers", "comfyui", "kohya")) and "--format" in r.stderr,
      "lora convert without --format names the formats: " + r.stderr.strip())

# A hostile folder (issue 38 item 16): a 14B-width config over the tiny weights is refused from the
# headers, naming the tensor, before the model is built (it used to allocate ~57 GB first).
import resource
import shutil
import time
hostile = os.path.join(tmp, "hostile")
shutil.copytree(model, hostile)
cfg = json.load(open(os.path.join(hostile, "config.json")))
cfg.update({"num_attention_heads": 40, "attention_head_dim": 128, "ffn_dim": 13824, "num_layers": 40})
json.dump(cfg, open(os.path.join(hostile, "config.json"), "w"))
t0 = time.monotonic()
r = run("info", hostile)
took = time.monotonic() - t0
check(r.returncode != 0 and "a config of another model than its weights" in r.stderr and "patch_embedding.weight" in r.stderr,
      "a 14B-width config over tiny weights is refused naming the tensor: " + r.stderr.strip())
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
check(took < 20 and peak < 2048, f"... in {took:.1f} s, peak of any child so far {peak:.0f} MiB (no model was built)")
cfg = json.load(open(os.path.join(model, "config.json")))
cfg["num_layers"] = cfg["num_layers"] + 38
json.dump(cfg, open(os.path.join(hostile, "config.json"), "w"))
r = run("info", hostile)
check(r.returncode != 0 and "declares num_layers" in r.stderr and "lacks 'blocks." in r.stderr,
      "a deeper config than its weights: " + r.stderr.strip())

# videotrain-make-vae --family wan22 (issue 38 item 7): a Wan 2.2 layout VAE that info reads as one.
w22 = os.path.join(tmp, "w22")
r = subprocess.run([os.path.join(os.environ["VIDEOTRAIN_BUILD_DIR"], "tools", "videotrain-make-vae"), w22,
                    "--family", "wan22", "--tiny", "--seed", "2"], capture_output=True, text=True)
check(r.returncode == 0, "make-vae --family wan22 --tiny: " + r.stderr.strip())
r = run("info", w22)
check(r.returncode == 0 and "(Wan 2.2)" in r.stdout and "latent channels 8" in r.stdout and "16x16 in space" in r.stdout,
      "info reads the Wan 2.2 VAE: " + (r.stdout + r.stderr).strip()[:200])

print(f"{len(failures) == 0 and 'all' or len(failures)} checks " + ("passed" if not failures else "failed"))
sys.exit(1 if failures else 0)
