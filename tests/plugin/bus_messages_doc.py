"""Every bus message a real run posts is documented in its element's gst-inspect description,
with each of its fields: one rank trains an epoch of a dataset that lists a corrupt video
(csvvideosrc-replaced, csvvideosrc-epoch), with a validation branch (ddpvalsink-result) and a
final checkpoint (ddptrainsink-step, ddptrainsink-checkpoint)."""
import os
import subprocess
import sys
import tempfile

import gi

gi.require_version("Gst", "1.0")
from gi.repository import Gst  # noqa: E402

build, src = os.environ["VIDEOTRAIN_BUILD_DIR"], os.environ["VIDEOTRAIN_SOURCE_DIR"]
Gst.init(None)
tmp = tempfile.mkdtemp(prefix="bus-doc-")
subprocess.run(["bash", f"{src}/scripts/make_dataset.sh", f"{tmp}/data", "6"], check=True, stdout=subprocess.DEVNULL)
subprocess.run([f"{build}/tools/videotrain-make-vae", f"{tmp}/vae", "--tiny"], check=True,
               stdout=subprocess.DEVNULL)
size = "num-frames=5 width=32 height=32"
p = Gst.parse_launch(
    f"csvvideosrc location={tmp}/data/train.csv {size} num-epochs=1 ! vaeencoder model={tmp}/vae ! queue ! "
    f"microbatcher batch-size=2 micro-batch-size=1 ! ddptrainsink name=trainer model=builtin:tiny-unet3d log-every=1 checkpoint-dir={tmp}/ckpt "
    f"csvvideosrc location={tmp}/data/val.csv {size} num-epochs=0 shuffle=false ! vaeencoder model={tmp}/vae ! "
    f"queue ! ddpvalsink trainer=trainer every=1")
p.set_state(Gst.State.PLAYING)
seen = {}  # message name -> (element factory, field names)
bus = p.get_bus()
while True:
    m = bus.timed_pop(300 * Gst.SECOND)
    if m is None:
        sys.exit("no EOS within 300 s")
    s = None
    if m.type == Gst.MessageType.ELEMENT:
        s = m.get_structure()
    elif m.type == Gst.MessageType.WARNING:
        s = m.parse_warning_details()
    elif m.type == Gst.MessageType.ERROR:
        sys.exit(f"error: {m.parse_error()}")
    elif m.type == Gst.MessageType.EOS:
        break
    if s is None or not hasattr(m.src, "get_factory") or m.src.get_factory() is None:
        continue
    fields = [s.nth_field_name(i) for i in range(s.n_fields())]
    seen.setdefault(s.get_name(), (m.src.get_factory().get_name(), set()))[1].update(fields)
p.set_state(Gst.State.NULL)

expected = {"csvvideosrc-epoch", "csvvideosrc-replaced", "ddptrainsink-step", "ddptrainsink-checkpoint",
            "ddpvalsink-result"}
missing = expected - set(seen)
if missing:
    sys.exit(f"the run posted no {sorted(missing)} (posted: {sorted(seen)})")
bad = []
for name, (factory, fields) in sorted(seen.items()):
    desc = Gst.ElementFactory.find(factory).get_metadata("description")
    at = desc.find(f"\n  {name} (")  # the message's own line in the "Bus messages:" list
    if at < 0:
        bad.append(f"{factory}'s description does not document {name}")
        continue
    entry = desc[at + 1:].split("\n")[0]
    bad += [f"{factory}: {name} field '{f}' undocumented (line: {entry})" for f in sorted(fields) if f"{f} (" not in entry]
    print(f"{factory}: {name} ({', '.join(sorted(fields))}) documented")
if bad:
    sys.exit("\n".join(bad))
