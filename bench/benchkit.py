"""What the pipeline benchmarks share: paths, the plugin environment, a demo dataset with a tiny VAE."""
import atexit
import os
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("VIDEOTRAIN_BUILD_DIR", os.path.join(ROOT, "build"))
RUN = os.path.join(BUILD, "tools", "videotrain-run")


def plugin_env():
    return dict(os.environ, GST_PLUGIN_PATH=os.path.join(BUILD, "plugins", "videotrain"))


def demo_workdir(prefix):
    """A temporary folder with data/ (scripts/make_dataset.sh, 12 videos) and vae/ (tiny, seeded),
    removed when the bench exits (VIDEOTRAIN_BENCH_KEEP=1 keeps it)."""
    work = tempfile.mkdtemp(prefix=prefix)
    if os.environ.get("VIDEOTRAIN_BENCH_KEEP") != "1":
        atexit.register(shutil.rmtree, work, True)
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "make_dataset.sh"), work + "/data", "12"], check=True,
                   capture_output=True)
    subprocess.run([os.path.join(BUILD, "tools", "videotrain-make-vae"), work + "/vae", "--tiny"],
                   check=True, capture_output=True)
    return work
