#!/usr/bin/python3
"""A Python app that trains with gst-videotrain: it builds the training pipeline (with an
optional validation branch), follows the bus (progress, replaced videos, validation results,
checkpoints), stops after optimizer step N (ddptrainsink's max-steps: the ranks agree on the last
step, the final checkpoint is written and validated), and resumes from that checkpoint when run
again with --resume. Ctrl-C or SIGTERM stops it early with EOS (a validation pass in progress is
dropped with a message) and it exits 130 or 143, like videotrain-run; while the ranks still wait
for each other at start, it exits at once with the same codes.

    export GST_PLUGIN_PATH=$PWD/build/plugins/videotrain
    bash scripts/make_dataset.sh data 12 && build/tools/videotrain-make-vae vae --tiny
    /usr/bin/python3 examples/python/train_app.py --data data/train.csv --vae vae --steps 10 --checkpoint-dir ckpt
    /usr/bin/python3 examples/python/train_app.py --data data/train.csv --vae vae --steps 20 --checkpoint-dir ckpt --resume

Several ranks: start one process per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
set (build/tools/videotrain-launch -n 2 -- /usr/bin/python3 examples/python/train_app.py ...).
The last line printed is a JSON summary (first and last step, checkpoints, validation losses).
"""
import argparse
import json
import os
import signal
import sys
import threading

import gi

gi.require_version("Gst", "1.0")
from gi.repository import GLib, Gst  # noqa: E402


def pipeline_text(a):
    train = (
        f"csvvideosrc location={a.data} num-frames={a.frames} width={a.width} height={a.height} "
        f"num-epochs=0 prefetch=2 seed={a.seed} ! vaeencoder model={a.vae} ! queue max-size-buffers=16 ! "
        f"microbatcher batch-size={a.batch_size} micro-batch-size={a.micro_batch_size} ! "
        f"ddptrainsink name=trainer model={a.model} lr={a.lr} log-every=1 seed={a.seed} max-steps={a.steps} "
        f"checkpoint-dir={a.checkpoint_dir} checkpoint-every={a.checkpoint_every} resume={str(a.resume).lower()}"
    )
    if not a.val:
        return train
    return train + (
        f" csvvideosrc location={a.val} num-epochs=0 shuffle=false clip-start=center num-frames={a.frames} "
        f"width={a.width} height={a.height} prefetch=1 ! vaeencoder model={a.vae} latent=mode ! "
        f"queue ! ddpvalsink trainer=trainer every={a.val_every}"
    )


class App:
    def __init__(self, a):
        self.a = a
        self.pipeline = Gst.parse_launch(pipeline_text(a))
        self.loop = GLib.MainLoop()
        self.first_step = None
        self.last_step = None
        self.eos_sent = False
        self.signal = None
        self.error = None
        self.checkpoints = []
        self.val_losses = {}
        self.replaced = 0
        bus = self.pipeline.get_bus()
        bus.add_signal_watch()
        bus.connect("message", self.on_message)

    def stop(self, why):
        # EOS, not NULL: every rank's trainer finishes the steps its peers started, agrees on
        # the last one and writes the final checkpoint before EOS reaches the bus.
        if not self.eos_sent:
            self.eos_sent = True
            print(f"stopping: {why}", flush=True)
            self.pipeline.send_event(Gst.Event.new_eos())

    def on_message(self, _bus, msg):
        t = msg.type
        s = msg.get_structure()
        if t == Gst.MessageType.ELEMENT and s is not None:
            name = s.get_name()
            if name == "ddptrainsink-step":
                step = s.get_value("step")
                self.first_step = step if self.first_step is None else self.first_step
                self.last_step = step
                print(f"step {step} | epoch {s.get_value('epoch')} | loss {s.get_value('loss'):.4f} | "
                      f"lr {s.get_value('lr'):.2e} | samples/s {s.get_value('samples-per-second'):.1f}", flush=True)
            elif name == "ddptrainsink-checkpoint":
                self.checkpoints.append({"step": s.get_value("step"), "path": s.get_value("path")})
                print(f"checkpoint of step {s.get_value('step')}: {s.get_value('path')}", flush=True)
            elif name == "ddpvalsink-skipped":
                print(f"validation skipped: {s.get_value('text')}", flush=True)
            elif name == "ddpvalsink-result":
                self.val_losses[s.get_value("step")] = s.get_value("loss")
                print(f"validation at step {s.get_value('step')}: loss {s.get_value('loss'):.4f} over "
                      f"{s.get_value('samples')} samples in {s.get_value('seconds'):.1f} s", flush=True)
        elif t == Gst.MessageType.WARNING:
            err, _debug = msg.parse_warning()
            details = msg.parse_warning_details()
            if details is not None and details.get_name() == "csvvideosrc-replaced":
                self.replaced += 1
            print(f"warning from {msg.src.get_name()}: {err.message}", flush=True)
        elif t == Gst.MessageType.ERROR:
            err, debug = msg.parse_error()
            self.error = f"{msg.src.get_name()}: {err.message}"
            print(f"error from {self.error}\n{debug or ''}", file=sys.stderr, flush=True)
            self.loop.quit()
        elif t == Gst.MessageType.EOS:
            self.loop.quit()

    def run(self):
        starting = threading.Event()  # set while set_state(PLAYING) has not returned

        def on_signal(signum, why):
            if starting.is_set():
                # ddptrainsink waits for its peers inside the state change, which holds the
                # pipeline's state lock: EOS cannot get through, and nothing was trained yet.
                print(f"{why} while the pipeline is starting (waiting for the other ranks?): nothing was trained; "
                      "exiting", file=sys.stderr, flush=True)
                os._exit(128 + signum)
            self.signal = self.signal or signum
            self.stop(why)
            return True

        def start():
            # A failure posts an error message, which ends the loop.
            self.pipeline.set_state(Gst.State.PLAYING)
            starting.clear()

        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGINT, on_signal, signal.SIGINT, "Ctrl-C")
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, on_signal, signal.SIGTERM, "SIGTERM")
        # Off the main loop, so that signals and the rendezvous' waiting messages are served meanwhile.
        starting.set()
        threading.Thread(target=start, daemon=True).start()
        self.loop.run()
        self.pipeline.set_state(Gst.State.NULL)
        return self.error is None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="training manifest (CSV)")
    ap.add_argument("--val", help="validation manifest (CSV): adds a ddpvalsink branch")
    ap.add_argument("--vae", required=True, help="diffusers VAE folder (config.json + safetensors)")
    ap.add_argument("--model", default="builtin:tiny-unet3d",
                    help="builtin:tiny-unet3d or a TorchScript file (examples/models/video_model_template.py)")
    ap.add_argument("--steps", type=int, default=10, help="stop after this optimizer step (max-steps, counted "
                    "from 0, so a resumed run continues to it)")
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--checkpoint-every", type=int, default=1000)
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    ap.add_argument("--frames", type=int, default=9)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--height", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val-every", type=int, default=5)
    ap.add_argument("--plugin-path", help="where libgstvideotrain.so is (else GST_PLUGIN_PATH)")
    a = ap.parse_args()
    if a.plugin_path:
        os.environ["GST_PLUGIN_PATH"] = a.plugin_path + os.pathsep + os.environ.get("GST_PLUGIN_PATH", "")
    Gst.init(None)
    if Gst.ElementFactory.find("ddptrainsink") is None:
        sys.exit("the gst-videotrain plugin is not on GST_PLUGIN_PATH (build/plugins/videotrain) or --plugin-path")
    try:
        app = App(a)
    except GLib.Error as e:
        sys.exit(f"the pipeline does not parse: {e.message}")
    ok = app.run()
    print(json.dumps({"ok": ok, "first_step": app.first_step, "last_step": app.last_step,
                      "checkpoints": app.checkpoints, "val_losses": app.val_losses, "replaced": app.replaced,
                      "error": app.error}), flush=True)
    if not ok:
        return 1
    # Stopped by a signal: the conventional 128 + signal, so a job script can tell it from a finished run.
    return 128 + app.signal if app.signal else 0


if __name__ == "__main__":
    sys.exit(main())
