#!/usr/bin/env python3
"""models/model_family.cpp's table against diffusers live: tests/reference/model_families/generate.py
reads each family's defaults, layout, text convention, schedule and image-to-video conditioning from this
diffusers (its pipelines' own functions run on stubs); the stored families.json must equal it, and
test-model-family (argv[1]) must agree with the live file as with the stored one."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

diffusers = u.need("diffusers")
sys.path.insert(0, os.path.join(u.source_dir(), "tests", "reference", "model_families"))
import generate  # noqa: E402

binary = sys.argv[1]
live = generate.facts()
with open(u.reference_dir("model_families", "families.json")) as f:
    stored = json.load(f)
for name, facts in live["families"].items():
    u.check(stored["families"].get(name) == facts,
            f"{name}: stored families.json is what diffusers {diffusers.__version__} says ({json.dumps(facts)})")
u.check(set(stored["families"]) == set(live["families"]), "the stored file describes the same families")

tmp = u.tempdir()
path = os.path.join(tmp.name, "families.json")
with open(path, "w") as f:
    json.dump(live, f)
os.environ["VIDEOTRAIN_FAMILY_REFERENCE"] = path
p = u.run(binary, "--gtest_filter=ModelFamily.AgreesWithDiffusersPipelines", check=False)
u.check(p.returncode == 0, "the family table agrees with diffusers' live answers")
u.check("[  PASSED  ] 1 test" in p.stdout, "it ran the comparison")
u.finish()
