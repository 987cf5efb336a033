"""Reference trajectories of ddptrainsink's optimizers (tests/reference/README.md, optimizers/).

A few parameters (a matrix, a 3-d tensor, a vector) step STEPS times from stored gradients under
ddptrainsink's lr schedule (linear warmup, then cosine decay to max-steps) with weight decay:
AdamW, SGD and Adafactor through torch.optim (Adafactor needs torch >= 2.5), Prodigy, CAME and
8-bit blockwise AdamW written out below from their published algorithms in plain PyTorch.

    .venv-torch2/bin/python tests/reference/optimizers/generate.py tests/reference/optimizers/optimizers.safetensors

tests/interop/torch_optimizers.py imports it to recompute the torch.optim cases live.
"""
import json
import math
import sys

import torch

STEPS = 6
WARMUP_STEPS, MAX_STEPS = 2, 6
SHAPES = {"w": [16, 40], "k": [2, 3, 5], "b": [7]}

# Each case's settings, as ddptrainsink's properties name them (underscores for dashes).
CASES = {
    "adamw": dict(kind="adamw", lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.999, eps=1e-8),
    "sgd": dict(kind="sgd", lr=0.1, weight_decay=0.01, momentum=0.9, nesterov=True),
    "sgd_plain": dict(kind="sgd", lr=0.1, weight_decay=0.0, momentum=0.0, nesterov=False),
    "adafactor": dict(kind="adafactor", lr=1e-2, weight_decay=0.1, beta2_decay=-0.8, eps=1.1920928955078125e-07, eps2=1e-3,
                      clip_threshold=1.0),
    "prodigy": dict(kind="prodigy", lr=1.0, weight_decay=0.1, beta1=0.9, beta2=0.999, beta3=math.sqrt(0.999),
                    eps=1e-8, d0=1e-3, d_coef=1.0, safeguard_warmup=False, use_bias_correction=False),
    "prodigy_bc_safeguard": dict(kind="prodigy", lr=1.0, weight_decay=0.0, beta1=0.9, beta2=0.99, beta3=0.95,
                                 eps=1e-8, d0=1e-3, d_coef=2.0, safeguard_warmup=True, use_bias_correction=True),
    "came": dict(kind="came", lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.999, beta3=0.9999, eps=1e-30,
                 eps2=1e-16, clip_threshold=1.0),
    "adamw8bit": dict(kind="adamw8bit", lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.999, eps=1e-8),
}
TORCH_OPTIM = ("adamw", "sgd", "sgd_plain", "adafactor")


def lr_at(base, done):
    """ddptrainsink's schedule (lr_schedule.h) with lr-schedule=cosine."""
    if done < WARMUP_STEPS:
        return base * (done + 1) / WARMUP_STEPS
    f = min(max((done - WARMUP_STEPS) / (MAX_STEPS - WARMUP_STEPS), 0.0), 1.0)
    return base * 0.5 * (1.0 + math.cos(math.pi * f))


def inputs():
    """Initial weights and each step's gradients: a steady direction plus noise, so that
    Prodigy's estimate grows."""
    g = torch.Generator().manual_seed(20260127)
    init = {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
    steady = {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
    grads = [{n: (steady[n] + 0.5 * torch.randn(s, generator=g)) * (0.1 if n == "b" else 1.0)
              for n, s in SHAPES.items()} for _ in range(STEPS)]
    return init, grads


def run(case, init, grads, step_fn):
    """Params after each step: {step: {name: tensor}}."""
    params = {n: t.clone() for n, t in init.items()}
    out = []
    state = {}
    for s in range(STEPS):
        step_fn(params, grads[s], lr_at(case["lr"], s), s + 1, state)
        out.append({n: p.clone() for n, p in params.items()})
    return out


def torch_optim(case, init, grads):
    params = {n: t.clone().requires_grad_(True) for n, t in init.items()}
    c = case
    if c["kind"] == "adamw":
        opt = torch.optim.AdamW(params.values(), lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                                weight_decay=c["weight_decay"], foreach=False)
    elif c["kind"] == "sgd":
        opt = torch.optim.SGD(params.values(), lr=c["lr"], momentum=c["momentum"], nesterov=c["nesterov"],
                              weight_decay=c["weight_decay"], foreach=False)
    else:
        opt = torch.optim.Adafactor(params.values(), lr=c["lr"], beta2_decay=c["beta2_decay"],
                                    eps=(c["eps"], c["eps2"]), d=c["clip_threshold"],
                                    weight_decay=c["weight_decay"], foreach=False)
    out = []
    for s in range(STEPS):
        for n, p in params.items():
            p.grad = grads[s][n].clone()
        for group in opt.param_groups:
            group["lr"] = lr_at(c["lr"], s)
        opt.step()
        out.append({n: p.detach().clone() for n, p in params.items()})
    return out


def prodigy_step(c):
    """prodigyopt 1.0's Prodigy.step (decouple=True, growth_rate=inf, one parameter group)."""
    b1, b2, b3, d0 = c["beta1"], c["beta2"], c["beta3"], c["d0"]

    def step(params, grads, lr, t, st):
        if not st:
            st.update(d=d0, d_max=d0, d_numerator=0.0, k=0,
                      s={n: torch.zeros_like(p) for n, p in params.items()},
                      p0={n: p.clone() for n, p in params.items()},
                      exp_avg={n: torch.zeros_like(p) for n, p in params.items()},
                      exp_avg_sq={n: torch.zeros_like(p) for n, p in params.items()})
        k, d = st["k"], st["d"]
        bias = ((1 - b2 ** (k + 1)) ** 0.5) / (1 - b1 ** (k + 1)) if c["use_bias_correction"] else 1
        dlr = d * lr * bias
        numerator, denom = st["d_numerator"] * b3, 0.0
        for n, p in params.items():
            g = grads[n]
            numerator += (d / d0) * dlr * torch.dot(g.flatten(), (st["p0"][n] - p).flatten()).item()
            st["exp_avg"][n].mul_(b1).add_(g, alpha=d * (1 - b1))
            st["exp_avg_sq"][n].mul_(b2).addcmul_(g, g, value=d * d * (1 - b2))
            s = st["s"][n]
            s.mul_(b3).add_(g, alpha=(d / d0) * d if c["safeguard_warmup"] else (d / d0) * dlr)
            denom += s.abs().sum().item()
        if denom == 0:
            return
        d_hat = c["d_coef"] * numerator / denom
        if d == d0:
            d = max(d, d_hat)
        st["d_max"] = max(st["d_max"], d_hat)
        d = min(st["d_max"], d * math.inf)
        st["d_numerator"], st["d"] = numerator, d
        for n, p in params.items():
            den = st["exp_avg_sq"][n].sqrt().add_(d * c["eps"])
            if c["weight_decay"] != 0:
                p.add_(p, alpha=-c["weight_decay"] * dlr)
            p.addcdiv_(st["exp_avg"][n], den, value=-dlr)
        st["k"] = k + 1
    return step


def came_step(c):
    """CAME's step as its authors' reference implementation (yangluo7/CAME) has it."""
    b1, b2, b3 = c["beta1"], c["beta2"], c["beta3"]

    def approx(row, col):
        r = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
        return torch.mul(r, col.unsqueeze(-2).rsqrt())

    def rms(t):
        return t.norm(2) / (t.numel() ** 0.5)

    def step(params, grads, lr, t, st):
        for n, p in params.items():
            g = grads[n]
            factored = g.dim() >= 2
            if n not in st:
                s = {"exp_avg": torch.zeros_like(g)}
                if factored:
                    for m in ("sq", "res"):
                        s[f"{m}_row"] = torch.zeros(g.shape[:-1])
                        s[f"{m}_col"] = torch.zeros(g.shape[:-2] + g.shape[-1:])
                else:
                    s["sq"] = torch.zeros_like(g)
                st[n] = s
            s = st[n]
            u = (g ** 2) + c["eps"]
            if factored:
                s["sq_row"].mul_(b2).add_(u.mean(dim=-1), alpha=1 - b2)
                s["sq_col"].mul_(b2).add_(u.mean(dim=-2), alpha=1 - b2)
                u = approx(s["sq_row"], s["sq_col"])
                u.mul_(g)
            else:
                s["sq"].mul_(b2).add_(u, alpha=1 - b2)
                u = s["sq"].rsqrt().mul_(g)
            u.div_((rms(u) / c["clip_threshold"]).clamp_(min=1.0))
            m = s["exp_avg"]
            m.mul_(b1).add_(u, alpha=1 - b1)
            if factored:
                res = (u - m) ** 2 + c["eps2"]
                s["res_row"].mul_(b3).add_(res.mean(dim=-1), alpha=1 - b3)
                s["res_col"].mul_(b3).add_(res.mean(dim=-2), alpha=1 - b3)
                u = approx(s["res_row"], s["res_col"]).mul_(m)
            else:
                u = m.clone()
            if c["weight_decay"] != 0:
                p.add_(p, alpha=-c["weight_decay"] * lr)
            u.mul_(lr)
            p.add_(-u)
    return step


def dynamic_map(signed):
    """bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for i in 0..6
    the midpoints of an even split of [0.1, 1] into 2^i (signed) or 2^(i+1) parts, times 10^(i-6),
    negated too when signed; 0 and 1. Computed in double and rounded once to float32 (bitsandbytes
    uses a float32 linspace: a value may differ by an ulp)."""
    data = [0.0, 1.0]
    for i in range(7):
        parts = 2 ** (i if signed else i + 1)
        for j in range(parts):
            x = (0.1 + 0.9 * (j + 0.5) / parts) * math.pow(10.0, i - 6)
            data += [x, -x] if signed else [x]
    return torch.tensor(sorted(data), dtype=torch.float32)


BLOCK = 256


def blocks(x):
    f = x.reshape(-1)
    nb = (f.numel() + BLOCK - 1) // BLOCK
    return torch.nn.functional.pad(f, (0, nb * BLOCK - f.numel())).view(nb, BLOCK)


def quantize(x, code):
    """Blockwise: absmax per 256 values, nearest code value of x / absmax."""
    b = blocks(x)
    absmax = b.abs().amax(dim=1)
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    mids = (code[:-1] + code[1:]) / 2.0
    idx = torch.searchsorted(mids, (b / scale.unsqueeze(1)).reshape(-1))
    return idx[:x.numel()].to(torch.uint8), absmax


def dequantize(codes, absmax, code, n):
    return (blocks(code[codes.long()]) * absmax.unsqueeze(1)).reshape(-1)[:n]


def adamw8bit_step(c):
    """AdamW whose moments are stored 8-bit blockwise between steps (bitsandbytes' AdamW8bit
    kernel: float32 update from the dequantised moments, then requantised)."""
    b1, b2 = c["beta1"], c["beta2"]
    sm, um = dynamic_map(True), dynamic_map(False)

    def step(params, grads, lr, t, st):
        c1, c2 = 1 - b1 ** t, math.sqrt(1 - b2 ** t)
        for n, p in params.items():
            if n not in st:
                z = torch.zeros(p.numel())
                st[n] = quantize(z, sm) + quantize(z, um)
            qm, am, qv, av = st[n]
            g = grads[n].reshape(-1)
            m = dequantize(qm, am, sm, p.numel())
            v = dequantize(qv, av, um, p.numel())
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            if c["weight_decay"] != 0:
                p.mul_(1 - lr * c["weight_decay"])
            den = v.sqrt().add_(c["eps"] * c2)
            p.addcdiv_(m.view_as(p), den.view_as(p), value=-lr * c2 / c1)
            st[n] = quantize(m, sm) + quantize(v, um)
    return step


def trajectories(only=None):
    """{case: [ {name: params after step s+1} ]}."""
    init, grads = inputs()
    out = {}
    for name, c in CASES.items():
        if only is not None and name not in only:
            continue
        if name in TORCH_OPTIM:
            out[name] = torch_optim(c, init, grads)
        else:
            fn = {"prodigy": prodigy_step, "came": came_step, "adamw8bit": adamw8bit_step}[c["kind"]](c)
            out[name] = run(c, init, grads, fn)
    return init, grads, out


def write(path, only=None):
    from safetensors.torch import save_file
    init, grads, traj = trajectories(only)
    t = {f"init.{n}": v for n, v in init.items()}
    for s, gs in enumerate(grads):
        t.update({f"grad.{s}.{n}": v for n, v in gs.items()})
    for case, steps in traj.items():
        for s, ps in enumerate(steps):
            t.update({f"{case}.{s}.{n}": v.contiguous() for n, v in ps.items()})
    t["map.signed"], t["map.unsigned"] = dynamic_map(True), dynamic_map(False)
    t["lr"] = torch.tensor([lr_at(1.0, s) for s in range(STEPS)], dtype=torch.float64)
    cases = {k: v for k, v in CASES.items() if k in traj}
    meta = {"cases": json.dumps(cases), "steps": str(STEPS), "warmup_steps": str(WARMUP_STEPS),
            "max_steps": str(MAX_STEPS), "names": ",".join(SHAPES), "torch": torch.__version__}
    save_file(t, path, metadata=meta)


if __name__ == "__main__":
    write(sys.argv[1])
