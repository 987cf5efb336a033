#!/usr/bin/env bash
# Training from the latent cache gives the weights training without it gives: 2 ranks, plain
# gst-launch-1.0 pipelines, 12 steps over several epochs of clip-windows=1 with latent=sample
# (noise from seed, sample and epoch), once without cache-dir and once with a fresh one (the first
# epoch fills it, later epochs come from it). Every step's loss and the final parameters are equal,
# and later epochs decode nothing on either rank. A validation branch beside training (ddpvalsink,
# its own csvvideosrc and vaeencoder with the same cache-dir) encodes its set once: every pass after
# the first decodes nothing.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-cache-train-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 6 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
steps=12
run() {  # run NAME VAEENCODER-EXTRA
  "$build/tools/videotrain-launch" -n 2 -- gst-launch-1.0 -m \
    csvvideosrc location="$work/data/train.csv" num-frames=5 width=32 height=32 num-epochs=0 prefetch=1 seed=5 \
      clip-windows=1 ! \
    vaeencoder model="$work/vae" latent=sample $2 ! queue ! microbatcher batch-size=2 micro-batch-size=1 ! \
    ddptrainsink name=trainer model=builtin:tiny-unet3d seed=9 max-steps=$steps log-every=1 \
      checkpoint-dir="$work/$1" checkpoint-every=100 metrics-file="$work/$1.jsonl" timeout=60 \
    csvvideosrc name=valsrc location="$work/data/val.csv" num-frames=5 width=32 height=32 num-epochs=0 \
      shuffle=false clip-start=center prefetch=1 ! vaeencoder model="$work/vae" latent=mode $2 ! queue ! \
    ddpvalsink trainer=trainer every=3 \
    > "$work/$1.log" 2>&1 || { cat "$work/$1.log"; echo "run $1 failed"; exit 1; }
}
run plain ""
run cached "cache-dir=$work/cache"
/usr/bin/python3 - "$work" "$steps" <<'PY'
import json, re, struct, sys
work, steps = sys.argv[1], int(sys.argv[2])
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/{name}.jsonl"))
            if r.get("type", "step") == "step" and "loss" in r}
plain, cached = losses("plain"), losses("cached")
assert sorted(plain) == list(range(1, steps + 1)) and sorted(cached) == sorted(plain), (plain, cached)
bad = [(s, plain[s], cached[s]) for s in plain if plain[s] != cached[s]]
assert not bad, f"losses differ with the cache (step, without, with): {bad}"
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head, data = json.loads(f.read(n)), f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in head.items() if k != "__metadata__"}
final = f"step-{steps:08d}/model.safetensors"
a, b = tensors(f"{work}/plain/{final}"), tensors(f"{work}/cached/{final}")
assert a == b, "final parameters differ with the cache"
# Each rank's epochs after the first: nothing decoded (a clip looked up while its entry was being
# written, at the first epoch boundary, may miss once).
epochs, val = {}, {}
for line in open(f"{work}/cached.log"):
    m = re.search(r'\[rank (\d)\].*element "(\w+)".*csvvideosrc-epoch, epoch=\(uint\)(\d+), .*decoded=\(guint64\)(\d+), '
                  r'cached=\(guint64\)(\d+)', line)
    if m:
        into = val if m.group(2) == "valsrc" else epochs
        into.setdefault(int(m.group(1)), []).append(tuple(int(m.group(i)) for i in (3, 4, 5)))
assert set(epochs) == {0, 1}, epochs
for rank, es in epochs.items():
    assert es[0][1] > 0, f"rank {rank}: first epoch {es[0]}"  # (a row padded from the other rank may hit)
    later = [e for e in es if e[0] >= 2]
    assert later and all(e[1] == 0 for e in later), f"rank {rank}: epochs from the second on {es}"
for rank, es in val.items():  # the first pass encodes (the next one's lookups may run ahead of it)
    assert len(es) >= 3 and es[0][1] > 0 and all(e[1] == 0 for e in es[2:]), f"rank {rank}: validation epochs {es}"
assert set(val) == {0, 1}, val
print(f"train-cache: {steps} steps with equal losses and final weights; epochs per rank {epochs}; validation {val}")
print("4 passed, 0 failed")
PY
