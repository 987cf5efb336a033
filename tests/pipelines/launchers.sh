#!/usr/bin/env bash
# The training pipeline as a plain gst-launch-1.0 command under a real launcher, 2 ranks
# that train together and write a checkpoint of world size 2:
#   launchers.sh torchrun   Debian's torchrun --no-python: the ranks use its agent's store.
#                           Its 1.13 on Python 3.11 cannot parse -r/-t 0 (Std.NONE is not
#                           iterable there): -r 1 -t 1 (a log, teed with a rank prefix).
#   launchers.sh mpirun     OpenMPI's mpirun: ranks from OMPI_COMM_WORLD_*, MASTER_* by -x.
#   launchers.sh srun       SLURM's srun: ranks from SLURM_PROCID/NTASKS/LOCALID, MASTER_* from
#                           the environment it exports. Skipped (77) where no SLURM controller
#                           answers: deps.sh installs no cluster.
set -euo pipefail
launcher=${1:?torchrun, mpirun or srun}
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
py=${PYTHON:-/usr/bin/python3}
if [[ $launcher == srun ]] && ! { command -v srun >/dev/null && timeout 20 sinfo -h >/dev/null 2>&1; }; then
  echo "SKIP: no SLURM controller answers here (srun/sinfo)"; exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-$launcher-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 6 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
steps=3
case $launcher in
  torchrun) launch=("$py" -m torch.distributed.run --no_python --nproc_per_node 2 -r 1 -t 1 --log_dir "$work/logs"
                    --master_addr 127.0.0.1 --master_port "$port") ;;
  mpirun) launch=(mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port"
                  -x GST_PLUGIN_PATH) ;;
  srun) export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
        launch=(srun --ntasks 2 --nodes 1 --export ALL --chdir "$work") ;;
  *) echo "unknown launcher $launcher"; exit 2 ;;
esac
command -v "${launch[0]}" >/dev/null || { echo "$launcher is not installed (bash scripts/deps.sh installs it)"; exit 1; }
timeout 300 "${launch[@]}" \
  gst-launch-1.0 -q \
    csvvideosrc location="$work/data/train.csv" num-frames=5 width=32 height=32 num-epochs=0 prefetch=1 ! \
    vaeencoder model="$work/vae" ! queue ! microbatcher batch-size=2 micro-batch-size=1 ! \
    ddptrainsink model=builtin:tiny-unet3d max-steps=$steps log-every=1 timeout=60 \
      checkpoint-dir="$work/ckpt" metrics-file="$work/metrics.jsonl" \
  > "$work/run.log" 2>&1 || { cat "$work/run.log"; echo "$launcher run failed"; exit 1; }
"$py" - "$work/metrics.jsonl" "$work/ckpt" "$steps" "$launcher" <<'PY'
import json, os, sys
metrics, ckpt, steps, launcher = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
done = [json.loads(l)["step"] for l in open(metrics) if json.loads(l).get("type") == "step"]
assert done == list(range(1, steps + 1)), f"steps in metrics-file: {done}"
last = sorted(d for d in os.listdir(ckpt) if d.startswith("step-"))[-1]
state = json.load(open(os.path.join(ckpt, last, "trainer.json")))
assert state["world_size"] == 2, f"world_size in the checkpoint: {state['world_size']}"
print(f"{launcher}: 2 ranks trained {steps} steps; checkpoint {last}")
print("1 passed, 0 failed")
PY
