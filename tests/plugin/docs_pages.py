"""The README front page and docs/ pages hold together: the front page's fine-tune example is the
tested config (examples/configs/wan-lora.toml, which run-config dry-runs) line for line in its
order, every relative link in README.md and docs/ reaches a file (and a heading, for #anchors), and
every element has a reference page linked from the front page."""
import os
import pathlib
import re
import sys

root = pathlib.Path(os.environ.get("VIDEOTRAIN_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
failures = []

readme = (root / "README.md").read_text()
config_path = "examples/configs/wan-lora.toml"
config = [l.split("#")[0].strip() for l in (root / config_path).read_text().split("\n")]
m = re.search(r"^## Fine-tune Wan[^\n]*\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
block = [l.strip() for l in m.group(1).split("\n") if l.startswith("    ")] if m else []
if not block:
    failures.append("README.md has no '## Fine-tune Wan' section with an indented example")
else:
    toml = [l for l in block if not l.startswith("build/")]
    at = 0
    for line in toml:  # each line is a line of the config, in the config's order
        try:
            at = config.index(line, at) + 1
        except ValueError:
            failures.append(f"README.md's example line {line!r} is not in {config_path} (in this order)")
    if len(toml) > 25:
        failures.append(f"README.md's example has {len(toml)} lines: keep it about 20")
    if not any(config_path in l for l in block if l.startswith("build/")):
        failures.append(f"README.md's example does not run {config_path}")


def anchors(text):
    # GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}


pages = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
for page in pages:
    text = page.read_text()
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        dest = (page.parent / target) if target else page
        if not dest.exists():
            failures.append(f"{page.relative_to(root)}: link to {target} reaches no file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            failures.append(f"{page.relative_to(root)}: link to {target}#{anchor} reaches no heading")

for element in ["csvvideosrc", "vaeencoder", "vaedecoder", "textencoder", "microbatcher", "ddptrainsink",
                "ddpvalsink", "promptsrc", "ddpsampler", "samplesink"]:
    if not (root / "docs" / "elements" / f"{element}.md").exists():
        failures.append(f"docs/elements/{element}.md is missing")
    elif f"(docs/elements/{element}.md)" not in readme:
        failures.append(f"README.md does not link docs/elements/{element}.md")

for f in failures:
    print("FAIL:", f)
print(f"{len(pages)} pages checked, {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
