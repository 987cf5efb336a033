#!/usr/bin/env python3
"""Writes the gst-inspect part of each element's reference page, docs/elements/<name>.md, from
gst-inspect-1.0 itself, so that the pages cannot drift from the plugin.

    python3 scripts/element_docs.py [--build-dir build]           # rewrite the pages
    python3 scripts/element_docs.py --check [--build-dir build]   # exit 1 where a page is out of date
    python3 scripts/element_docs.py --build-dir build vaeencoder  # only these elements' pages

Only the block between the page's BEGIN and END markers is written (the element's class, klass and
description, its pads, a table of its properties); the rest of the page is prose kept by hand.
Without --build-dir the plugin is found on GST_PLUGIN_PATH (as the meson test runs it).
"""
import argparse
import concurrent.futures
import difflib
import os
import pathlib
import re
import subprocess
import sys

ELEMENTS = ["csvvideosrc", "vaeencoder", "vaedecoder", "textencoder", "imageencoder", "microbatcher", "ddptrainsink",
            "ddpvalsink", "promptsrc", "ddpsampler", "samplesink"]
BEGIN = ("<!-- Begin gst-inspect: written by scripts/element_docs.py from gst-inspect-1.0; "
         "edit the element, not this block -->")
END = "<!-- End gst-inspect -->"
# Properties of GStreamer's own classes: listed on one line below the table, not in it.
BASE_CLASSES = ["GstObject", "GstElement", "GstBaseSrc", "GstPushSrc", "GstBaseSink", "GstBaseTransform"]
HIDDEN = {"name", "parent"}
FULL_RANGES = {"0 - 4294967295", "-2147483648 - 2147483647", "0 - 18446744073709551615",
               "-9223372036854775808 - 9223372036854775807", "-1.797693e+308 - 1.797693e+308",
               "0 - 1.797693e+308"}  # every GstObject has them; their default is the instance's name


def inspect(name, env):
    r = subprocess.run(["gst-inspect-1.0", name], env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or "Element Properties:" not in r.stdout:
        sys.exit(f"gst-inspect-1.0 {name} failed (is the plugin on GST_PLUGIN_PATH or --build-dir?):\n"
                 f"{r.stdout}{r.stderr}")
    return r.stdout


def sections(text):
    """Top-level sections of gst-inspect's output: a line at column 0 starts one."""
    out, key = {}, None
    for line in text.split("\n"):
        if line and not line[0].isspace():
            key = line.rstrip(":")
            out[key] = []
        elif key is not None:
            out[key].append(line)
    return out


def factory_details(lines):
    details, key = {}, None
    for line in lines:
        m = re.match(r"^  (\S[\w-]*(?: [\w-]+)*)\s{2,}(.*)$", line)
        if m and m.group(1) in ("Rank", "Long-name", "Klass", "Description", "Author", "Documentation"):
            key = m.group(1)
            details[key] = [m.group(2)]
        elif key == "Description":  # the description runs over several lines until Author
            details[key].append(line)
    return {k: "\n".join(v).strip("\n") for k, v in details.items()}


def hierarchy(text):
    classes = re.findall(r"^\s*(?:\+----)?(G\w+)\s*$", text, re.M)
    return [c for c in classes if c not in ("GObject", "GInitiallyUnowned")]


def properties(lines):
    props, cur = [], None
    for line in lines:
        m = re.match(r"^  (\S+)\s*: (.*)$", line)
        if m:
            cur = {"name": m.group(1), "blurb": m.group(2).strip(), "rest": []}
            props.append(cur)
        elif cur is not None and line.strip():
            cur["rest"].append(line.strip())
    for p in props:
        rest = p.pop("rest")
        p["flags"] = rest[0][len("flags: "):] if rest and rest[0].startswith("flags: ") else ""
        type_line = " ".join(rest[1].split()) if len(rest) > 1 else ""
        m = re.match(r"^(.*?)(?:\. Range: (.*?))?(?: Default: (.*))?$", type_line)
        p["type"], p["range"], p["default"] = m.group(1).rstrip("."), m.group(2) or "", (m.group(3) or "").strip()
        if p["range"] in FULL_RANGES:  # the type's own limits say nothing
            p["range"] = ""
        p["values"] = []
        for v in rest[2:]:
            vm = re.match(r"^\((\d+|0x[0-9a-f]+)\): (\S+)\s+- (.*)$", v)
            if vm:
                p["values"].append((vm.group(2), vm.group(3).strip()))
        if p["type"].startswith(("Enum", "Flags")):
            # 'Enum "GstX" Default: 0, "auto"': the nick is what pipelines write
            dm = re.search(r'"([^"]*)"\s*$', p["default"])
            p["default"] = dm.group(1) if dm else p["default"]
            p["type"] = p["type"].split(" ")[0].lower()
        else:
            p["type"] = {"Unsigned Integer": "uint", "Integer": "int", "Unsigned Integer64": "uint64",
                         "Integer64": "int64", "Unsigned Long": "ulong", "Long": "long", "Double": "double",
                         "Float": "float", "Boolean": "bool", "String": "string",
                         "Fraction": "fraction"}.get(p["type"], p["type"])
    return props


def cell(s):
    return s.replace("|", "\\|").replace("\n", " ")


def render(name, text):
    sec = sections(text)
    det = factory_details(sec.get("Factory Details", []))
    classes = hierarchy("\n".join(sec.get("GObject", [])))
    base = [c for c in classes if c in BASE_CLASSES]
    parent = base[-1] if base else "GstElement"
    pads = [l for l in sec.get("Pad Templates", [])]
    while pads and not pads[-1].strip():
        pads.pop()
    props = [p for p in properties(sec.get("Element Properties", [])) if p["name"] not in HIDDEN]
    inherited = set(base_properties(parent))
    own = [p for p in props if p["name"] not in inherited]
    theirs = [p for p in props if p["name"] in inherited]

    out = [BEGIN, ""]
    out.append(f"`gst-inspect-1.0 {name}`: {det.get('Long-name', name)} ({classes[-1] if classes else name}, "
               f"a {parent}; klass `{det.get('Klass', '')}`).")
    out += ["", "Description:", ""] + ["    " + l.strip() if l.strip() else "" for l in det.get("Description", "").split("\n")]
    out += ["", "Pad templates:", ""] + ["  " + l if l.strip() else "" for l in pads]
    out += ["", "| property | type | default | range | what it does |", "|---|---|---|---|---|"]
    for p in own:
        desc = p["blurb"]
        if p["values"]:
            desc += ". Values: " + "; ".join(f"`{n}`: {d}" for n, d in p["values"])
        flags = p["flags"]
        if "writable" not in flags:
            desc += " (read-only)"
        elif "changeable in NULL, READY, PAUSED or PLAYING state" in flags:
            desc += " (changeable while playing)"
        default = f"`{p['default']}`" if p["default"] else ""
        out.append(f"| `{p['name']}` | {p['type']} | {cell(default)} | {cell(p['range'])} | {cell(desc)} |")
    if theirs:
        out += ["", f"From {parent}: " + ", ".join(
            f"`{p['name']}`" + (f" ({p['default']})" if p["default"] else "") for p in theirs) + "."]
    out += ["", END]
    return "\n".join(out) + "\n"


def base_properties(parent):
    # The properties GStreamer's base classes define (GStreamer 1.22+); an element's own ones are the rest.
    src = ["blocksize", "num-buffers", "typefind", "do-timestamp", "automatic-eos"]
    sink = ["sync", "max-lateness", "qos", "async", "ts-offset", "enable-last-sample", "last-sample",
            "blocksize", "render-delay", "throttle-time", "max-bitrate", "processing-deadline", "stats"]
    return {"GstBaseSrc": src, "GstPushSrc": src, "GstBaseSink": sink, "GstBaseTransform": ["qos"]}.get(parent, [])


def updated(page_text, block, path):
    if BEGIN not in page_text or END not in page_text:
        sys.exit(f"{path}: no '{BEGIN}' ... '{END}' block to write into")
    head, rest = page_text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block.rstrip("\n") + tail


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 where a page differs")
    ap.add_argument("--build-dir", help="a meson build folder (its plugins/videotrain is put on GST_PLUGIN_PATH)")
    ap.add_argument("elements", nargs="*", metavar="ELEMENT",
                    help="only these elements' pages (default: every element's)")
    ap.add_argument("--docs", default=str(pathlib.Path(__file__).resolve().parent.parent / "docs" / "elements"))
    args = ap.parse_args()
    names = args.elements or ELEMENTS
    if set(names) - set(ELEMENTS):
        ap.error(f"not an element of this plugin: {', '.join(sorted(set(names) - set(ELEMENTS)))}")
    env = dict(os.environ)
    if args.build_dir:
        env["GST_PLUGIN_PATH"] = str(pathlib.Path(args.build_dir).resolve() / "plugins" / "videotrain")
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(names)) as pool:
        texts = dict(zip(names, pool.map(lambda e: inspect(e, env), names)))
    stale = []
    for name in names:
        path = pathlib.Path(args.docs) / f"{name}.md"
        if not path.exists():
            sys.exit(f"{path} is missing: every element has a reference page")
        old = path.read_text()
        new = updated(old, render(name, texts[name]), path)
        if new == old:
            continue
        stale.append(str(path))
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(path), "gst-inspect-1.0"))
        else:
            path.write_text(new)
    if args.check and stale:
        names = " ".join(pathlib.Path(s).stem for s in stale)
        print(f"\n{len(stale)} element page(s) out of date with the plugin: run python3 scripts/element_docs.py "
              f"--build-dir BUILD {names} (or the elements you changed) and commit the pages")
        return 1
    print(("out of date: " if args.check else "rewrote: ") + ", ".join(stale) if stale else "element pages up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
