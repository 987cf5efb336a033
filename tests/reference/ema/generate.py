"""Reference EMA trajectories of ddptrainsink's ema-decay (tests/reference/README.md, ema/).

A small module's weights take STEPS stored random values (as an optimizer would change them); a
torch.optim.swa_utils.AveragedModel with the EMA average function (torch's get_ema_multi_avg_fn in
torch >= 2.0 computes the same: ema = decay * ema + (1 - decay) * w) averages them on ddptrainsink's
schedule: its first update_parameters() copies the weights, at step ema-start-step (0: the initial
weights), then one update every ema-every steps after it. The EMA is stored after every step.

    .venv-torch2/bin/python tests/reference/ema/generate.py tests/reference/ema/ema.safetensors
"""
import json
import sys

import torch
from torch.optim.swa_utils import AveragedModel

STEPS = 9
# name -> (ema-decay, ema-start-step, ema-every)
CASES = {"d0.9_s0_e1": (0.9, 0, 1), "d0.7_s2_e3": (0.7, 2, 3), "d0.99_s4_e2": (0.99, 4, 2)}


def module():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Conv1d(4, 2, 3))


def main(path):
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(11)
    m = module()
    shapes = {n: p.shape for n, p in m.named_parameters()}
    weights = [{n: p.detach().clone() for n, p in m.named_parameters()}]
    for _ in range(STEPS):
        weights.append({n: torch.randn(s, generator=g) for n, s in shapes.items()})
    out = {}
    for step, w in enumerate(weights):
        for n, t in w.items():
            out[f"w.{step}.{n}"] = t
    for case, (decay, start, every) in CASES.items():
        m = module()
        avg = AveragedModel(m, avg_fn=lambda e, w, n, d=decay: d * e + (1 - d) * w)

        def load(step):
            with torch.no_grad():
                for n, p in m.named_parameters():
                    p.copy_(weights[step][n])

        load(0)
        if start == 0:
            avg.update_parameters(m)  # the first update copies
        for step in range(1, STEPS + 1):
            load(step)
            if step == start or (step > start and (step - start) % every == 0):
                avg.update_parameters(m)
            for n, p in avg.module.named_parameters():
                out[f"ema.{case}.{step}.{n}"] = p.detach().clone()
    meta = {"steps": str(STEPS), "cases": json.dumps(CASES), "torch": torch.__version__}
    save_file({k: v.contiguous() for k, v in out.items()}, path, metadata=meta)


if __name__ == "__main__":
    main(sys.argv[1])
