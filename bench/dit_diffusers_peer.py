#!/usr/bin/env python3
"""diffusers' own transformer (WanTransformer3DModel or CogVideoXTransformer3DModel, by the folder's
config.json), timed over the same training step as wan-bench / cogvideox-bench's native side: the
peer of their training-step mode (bench/dit_step.h), which runs it as

    PYTHON bench/dit_diffusers_peer.py --folder DIR --inputs FILE [--device cuda:0] [--dtype bfloat16]
        [--lora R] [--checkpointing none|full] [--optimizer none|adamw] [--warmup N] [--steps N] [--threads N]

The model comes from the folder through diffusers' from_pretrained (float32), attention is
diffusers' default processor (torch's scaled_dot_product_attention), the forward runs under bf16
autocast with --dtype bfloat16, checkpointing is diffusers' enable_gradient_checkpointing(). Full
fine-tune: every float32 parameter trains. --lora R: the base is frozen (cast to bf16 with --dtype
bfloat16), LoRA of rank R, alpha R on to_q, to_k, to_v, to_out.0 through peft (diffusers'
add_adapter), float32 as diffusers' training scripts cast them; where peft is not importable, a
LoRA of the same computation (x W^T + (x A^T) B^T) written here, and the output says so.

Where diffusers is not installed (a GPU machine without network): VT_DIFFUSERS_WHEEL, else the
newest .gpu/python/diffusers-*.whl of the source tree (scripts/gpu/fetch-debs.sh puts the pinned one
there) is imported from the file; the same for peft (VT_PEFT_WHEEL, .gpu/python/peft-*.whl). Without
Pillow or requests, which diffusers imports at start but this never uses, a stand-in module is put
in its place (the output lists them).
Prints one JSON line: median seconds of the timed steps, peak memory (CUDA allocator's peak after
reset_peak_memory_stats, or peak RSS on CPU), the first step's loss, which diffusers ran.
"""
import glob
import json
import os
import resource
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def wheel(name, env):
    """The wheel to import `name` from when it is not installed: $env, else .gpu/python's newest."""
    if os.environ.get(env):
        return os.environ[env]
    found = sorted(glob.glob(os.path.join(ROOT, ".gpu", "python", name + "-*.whl")))
    return found[-1] if found else None


def import_from_wheel(name, env):
    """Imports `name`; when that fails, from its wheel (a zip on sys.path). Returns (module, where)."""
    forced = os.environ.get(env)
    if not forced:
        try:
            return __import__(name), "installed"
        except ImportError:
            pass
    w = wheel(name, env)
    if not w:
        return None, "not importable and no %s wheel (%s or .gpu/python/%s-*.whl)" % (name, env, name)
    sys.path.insert(0, w)
    for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[k]
    return __import__(name), w


def stand_in_pillow():
    """diffusers.utils imports PIL.Image / ImageOps at start; a model's forward never uses them."""
    try:
        import PIL.Image  # noqa: F401
        return False
    except ImportError:
        pass
    class Anything(type):  # any attribute, at any depth, is this stand-in type again
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return cls

    class Module(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Anything("PIL." + name, (), {})
    pil = Module("PIL")
    pil.__version__ = "0.0"  # a stand-in: Pillow is not installed
    for sub in ("Image", "ImageOps", "ImageDraw", "ImageFont", "PngImagePlugin"):
        m = Module("PIL." + sub)
        setattr(pil, sub, m)
        sys.modules["PIL." + sub] = m
    sys.modules["PIL"] = pil
    return True


def stand_in_requests():
    """diffusers imports requests at start and checks that its distribution is installed (a
    download library: nothing here downloads); torch and transformers do not need it."""
    try:
        import requests  # noqa: F401
        return False
    except ImportError:
        pass
    import importlib.metadata as md
    sys.modules["requests"] = types.ModuleType("requests")
    real = md.version

    def version(name):
        if name == "requests":
            return "0.0"
        return real(name)
    md.version = version
    return True


def read_safetensors(path):
    sys.path.insert(0, HERE)
    from wan_peer import read_safetensors as rs
    return rs(path)


class Lora(object):
    """LoRA on an nn.Linear without peft: y = base(x) + scale * B(A(x)), A Kaiming-uniform(a=sqrt 5),
    B zero, float32 (PEFT's default initialisation and computation)."""

    @staticmethod
    def attach(model, rank, targets):
        import math
        import torch
        n = 0
        for name, mod in list(model.named_modules()):
            if not isinstance(mod, torch.nn.Linear) or not any(name.endswith("." + t) for t in targets):
                continue
            a = torch.nn.Linear(mod.in_features, rank, bias=False, device=mod.weight.device, dtype=torch.float32)
            b = torch.nn.Linear(rank, mod.out_features, bias=False, device=mod.weight.device, dtype=torch.float32)
            torch.nn.init.kaiming_uniform_(a.weight, a=math.sqrt(5))
            torch.nn.init.zeros_(b.weight)
            mod.lora_A, mod.lora_B = a, b
            base = mod.forward

            def fwd(x, base=base, a=a, b=b):
                return base(x) + b(a(x))
            mod.forward = fwd
            n += 1
        return n


def load(cls, folder, torch):
    """The class built from the folder's config.json, float32, its weights loaded strictly (the
    single file or the shards of an index). from_pretrained is not used: without accelerate it
    refuses a bf16 load, and the bf16 base is cast below as it would cast it."""
    model = cls.from_config(cls.load_config(folder)).float()
    index = os.path.join(folder, "diffusion_pytorch_model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["diffusion_pytorch_model.safetensors"]
    state = {}
    for f in files:
        tensors, _ = read_safetensors(os.path.join(folder, f))
        state.update({k: v.float() for k, v in tensors.items()})
    model.load_state_dict(state, strict=True)
    return model


def main(argv):
    opts = {"--folder": None, "--inputs": None, "--device": "cpu", "--dtype": "float32", "--lora": "0",
            "--checkpointing": "none", "--optimizer": "none", "--warmup": "1", "--steps": "3", "--threads": "0"}
    i = 0
    while i < len(argv):
        if argv[i] not in opts:
            sys.exit("dit_diffusers_peer.py: unknown argument %s" % argv[i])
        opts[argv[i]] = argv[i + 1]
        i += 2
    if not opts["--folder"] or not opts["--inputs"]:
        sys.exit("dit_diffusers_peer.py: --folder and --inputs are required")
    import torch
    import torch.nn.functional as F
    if int(opts["--threads"]):
        torch.set_num_threads(int(opts["--threads"]))
    stand_ins = [n for n, f in (("Pillow", stand_in_pillow), ("requests", stand_in_requests)) if f()]
    diffusers, where = import_from_wheel("diffusers", "VT_DIFFUSERS_WHEEL")
    if diffusers is None:
        sys.exit("dit_diffusers_peer.py: diffusers: " + where)
    diffusers.utils.logging.set_verbosity_error()  # to() on the bf16 base warns about the fp32 modules we keep
    cfg = json.load(open(os.path.join(opts["--folder"], "config.json")))
    cls_name = cfg.get("_class_name")
    if cls_name not in ("WanTransformer3DModel", "CogVideoXTransformer3DModel"):
        sys.exit("dit_diffusers_peer.py: %s/config.json: class %r is not Wan or CogVideoX" % (opts["--folder"], cls_name))
    cls = getattr(diffusers, cls_name)
    dev = torch.device(opts["--device"])
    bf16 = opts["--dtype"] == "bfloat16"
    rank = int(opts["--lora"])
    model = load(cls, opts["--folder"], torch)
    lora_impl = ""
    if rank > 0:
        model.requires_grad_(False)
        if bf16:  # as from_pretrained(torch_dtype=torch.bfloat16): the class's fp32 modules stay fp32
            model.to(torch.bfloat16)
            keep = getattr(cls, "_keep_in_fp32_modules", None) or []
            for name, mod in model.named_modules():
                if any(k in name.split(".") for k in keep):
                    mod.float()
        targets = ["to_q", "to_k", "to_v", "to_out.0"]
        try:
            peft, pwhere = import_from_wheel("peft", "VT_PEFT_WHEEL")
        except ImportError as e:  # peft's own dependencies (accelerate) missing
            peft, pwhere = None, str(e)
        if peft is not None:
            try:
                from peft import LoraConfig
                model.add_adapter(LoraConfig(r=rank, lora_alpha=rank, init_lora_weights=True, target_modules=targets))
                lora_impl = "peft " + peft.__version__ + ("" if pwhere == "installed" else " from " + os.path.basename(pwhere))
            except ImportError as e:  # peft present but its own dependencies (accelerate) are not
                peft, pwhere = None, "peft %s: %s" % (peft.__version__, e)
        if peft is None:
            Lora.attach(model, rank, targets)
            lora_impl = "own wrapper (peft: %s)" % pwhere
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.data = p.data.float()
                p.requires_grad_(True)
    if opts["--checkpointing"] == "full":
        model.enable_gradient_checkpointing()
    elif opts["--checkpointing"] != "none":
        sys.exit("dit_diffusers_peer.py: --checkpointing %s: diffusers has none and full" % opts["--checkpointing"])
    model.to(dev).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5) if opts["--optimizer"] == "adamw" else None
    tensors, meta = read_safetensors(opts["--inputs"])
    x = {k: v.to(dev) for k, v in tensors.items()}
    for k in list(x):
        if meta.get(k + "_dtype") == "int64":
            x[k] = x[k].long()
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    times, first = [], None
    warm, steps = int(opts["--warmup"]), int(opts["--steps"])
    for s in range(warm + steps):
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            pred = model(hidden_states=x["hidden_states"], timestep=x["timestep"],
                         encoder_hidden_states=x["encoder_hidden_states"], return_dict=False)[0]
        loss = F.mse_loss(pred.float(), x["target"])
        loss.backward()
        if opt is not None:
            opt.step()
        for p in params:
            p.grad = None
        sync()
        if s == 0:
            first = loss.item()
        if s >= warm:
            times.append(time.perf_counter() - t0)
    times.sort()
    peak = torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"side": "diffusers", "impl": "diffusers %s%s, torch %s" % (
                          diffusers.__version__, "" if where == "installed" else " (from %s%s)" % (
                              os.path.basename(where), "".join(", stand-in " + n for n in stand_ins)),
                          torch.__version__),
                      "diffusers_from": where, "stand_ins": stand_ins, "lora_impl": lora_impl,
                      "seconds": times, "median_s": times[len(times) // 2], "peak_mem_mb": peak,
                      "memory": "peak CUDA allocated" if cuda else "peak RSS", "first_loss": first,
                      "trained_parameters": sum(p.numel() for p in params), "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main(sys.argv[1:])
