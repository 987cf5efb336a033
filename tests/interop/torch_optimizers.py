#!/usr/bin/env python3
"""ddptrainsink's optimizers against torch.optim live: AdamW, SGD (Nesterov momentum and plain)
and Adafactor (torch >= 2.5) step the reference parameters of tests/reference/optimizers/
generate.py now, with this torch; the stored trajectories must equal them (float rounding), and
test-optimizers (argv[1]) must follow the live file as it follows the stored one (its
OptimizerReference tests, with VIDEOTRAIN_OPTIMIZER_REFERENCE naming the live file)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, st = u.need("torch", "safetensors.torch")
if not hasattr(torch.optim, "Adafactor"):
    u.fail(f"torch {torch.__version__} has no torch.optim.Adafactor (2.5 or newer has)")
sys.path.insert(0, os.path.join(u.source_dir(), "tests", "reference", "optimizers"))
import generate  # noqa: E402

binary = sys.argv[1]
TOL = 1e-6
stored = st.load_file(u.reference_dir("optimizers", "optimizers.safetensors"))
init, grads, live = generate.trajectories(generate.TORCH_OPTIM)
for n, t in init.items():
    u.check(torch.equal(stored[f"init.{n}"], t), f"stored initial {n} is generate.py's")
for case, steps in live.items():
    worst = max(u.rel(steps[s][n], stored[f"{case}.{s}.{n}"]) for s in range(generate.STEPS) for n in steps[s])
    u.check(worst <= TOL, f"{case}: stored trajectory within {TOL:g} of torch {torch.__version__}'s (worst {worst:.3g})")
    print(f"FIGURE torch.optim {case}: stored vs live worst rel L2 {worst:.3g}")

tmp = u.tempdir()
path = os.path.join(tmp.name, "live.safetensors")
generate.write(path, only=generate.TORCH_OPTIM)
os.environ["VIDEOTRAIN_OPTIMIZER_REFERENCE"] = path
p = u.run(binary, "--gtest_filter=OptimizerReference.*", check=False)
u.check(p.returncode == 0, "test-optimizers follows torch.optim's live trajectories (AdamW, SGD, Adafactor)")
u.check(all(c in p.stdout for c in generate.TORCH_OPTIM), "it ran every live case")
u.finish()
