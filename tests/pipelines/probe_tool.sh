#!/usr/bin/env bash
# videotrain-probe on scripts/make_dataset.sh's dataset with its size columns blanked (empty in
# some rows, 0 in others). Checks that
#  - num_frames, height, width and fps come back as make_dataset.sh wrote them, and as ffprobe
#    reads them; the corrupt file gets 0s and a warning naming its row; a valid value already
#    there is kept; every other column is copied as it was,
#  - Ctrl-C (SIGINT) after the first rows stops with OUT.partial and no OUT, and a rerun
#    finishes from there to the same file as an uninterrupted run.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
py=${PYTHON:-/usr/bin/python3}
probe="$build/tools/videotrain-probe"
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-probe-XXXXXX")
pid=
cleanup() { [[ -n "$pid" ]] && kill "$pid" 2>/dev/null; exec 3>&- 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
bash "$src/scripts/make_dataset.sh" "$work/data" 12 >/dev/null
d=$work/data

# Blank the four columns (empty or 0), keep one valid height that is not the video's.
"$py" - "$d/manifest.csv" "$d/blank.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h = rows[0]
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(h)
    for i, r in enumerate(rows[1:]):
        for c in ("num_frames", "height", "width", "fps"):
            r[h.index(c)] = "0" if i % 2 else ""
        if i == 2:
            r[h.index("height")] = "999"
        w.writerow(r)
PY

"$probe" -j 2 "$d/blank.csv" "$d/out.csv" 2> "$work/probe.log" || { cat "$work/probe.log"; echo "FAIL: probe"; exit 1; }
grep -q "warning: row 13 (.*corrupt.mp4): cannot probe" "$work/probe.log" || {
  cat "$work/probe.log"; echo "FAIL: no warning for the corrupt row"; exit 1; }
grep -q "probed 13/13 videos, .* videos/s" "$work/probe.log" || { cat "$work/probe.log"; echo "FAIL: progress line"; exit 1; }
[[ ! -e "$d/out.csv.partial" ]] || { echo "FAIL: out.csv.partial left behind"; exit 1; }

"$py" - "$d/manifest.csv" "$d/out.csv" <<'PY'
import csv, json, os, subprocess, sys
want = list(csv.DictReader(open(sys.argv[1])))
got = list(csv.DictReader(open(sys.argv[2])))
assert len(got) == len(want), (len(got), len(want))
cols = ("num_frames", "height", "width", "fps")
for i, (w, g) in enumerate(zip(want, got)):
    for k in w:
        if k not in cols:
            assert g[k] == w[k], (i, k, g[k], w[k])
    if "corrupt" in w["path"]:
        assert [g[c] for c in cols] == ["0"] * 4, (i, g)
        continue
    height = "999" if i == 2 else w["height"]
    assert [g[c] for c in cols] == [w["num_frames"], height, w["width"], w["fps"]], (i, g, w)
    # An independent reader: ffprobe, counting the frames.
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-count_frames", "-show_entries",
                          "stream=width,height,avg_frame_rate,nb_read_frames", "-of", "json",
                          os.path.join(os.path.dirname(sys.argv[1]), w["path"])],
                         capture_output=True, text=True, check=True)
    s = json.loads(out.stdout)["streams"][0]
    num, den = map(int, s["avg_frame_rate"].split("/"))
    ff = [str(s["nb_read_frames"]), str(s["height"]), str(s["width"]), "%g" % (num / den)]
    if i == 2:
        ff[1] = "999"
    assert [g[c] for c in cols] == ff, (i, g, ff)
print("probe: %d rows as written by make_dataset.sh and read by ffprobe" % len(got))
PY

# Interrupted after the first rows: row 5 is a FIFO whose reader blocks until we close it, so
# SIGINT lands while the run is surely in the middle (one worker).
mv "$d/videos/clip004.mp4" "$d/clip004.mp4.keep"
mkfifo "$d/videos/clip004.mp4"
exec 3<>"$d/videos/clip004.mp4"
"$probe" -j 1 "$d/blank.csv" "$d/resumed.csv" 2> "$work/interrupted.log" 3>&- &
pid=$!
for ((i = 0; i < 1200; i++)); do
  [[ -f "$d/resumed.csv.partial" ]] && (($(wc -l < "$d/resumed.csv.partial") >= 5)) && break
  sleep 0.1
done
(($(wc -l < "$d/resumed.csv.partial") == 5)) || { cat "$work/interrupted.log"; echo "FAIL: the first 4 rows never came"; exit 1; }
kill -INT "$pid"
sleep 0.5
exec 3>&-  # the FIFO's reader sees the end: that probe fails, the run stops
rc=0
wait "$pid" || rc=$?
pid=
((rc == 130)) || { cat "$work/interrupted.log"; echo "FAIL: interrupted run exited $rc, expected 130"; exit 1; }
[[ ! -e "$d/resumed.csv" ]] || { echo "FAIL: OUT written by an interrupted run"; exit 1; }
grep -q "run again to go on" "$work/interrupted.log" || { cat "$work/interrupted.log"; echo "FAIL: stop message"; exit 1; }
kept=$(($(wc -l < "$d/resumed.csv.partial") - 1))
((kept >= 5 && kept < 13)) || { cat "$d/resumed.csv.partial"; echo "FAIL: $kept rows kept"; exit 1; }
# The FIFO stays an unreadable file for the rerun and the uninterrupted run alike.
rm "$d/videos/clip004.mp4"
: > "$d/videos/clip004.mp4"
"$probe" -j 2 "$d/blank.csv" "$d/resumed.csv" 2> "$work/rerun.log" || { cat "$work/rerun.log"; echo "FAIL: rerun"; exit 1; }
grep -q "resuming, $kept rows already probed" "$work/rerun.log" || { cat "$work/rerun.log"; echo "FAIL: rerun did not resume"; exit 1; }
grep -q "probed $((13 - kept))/$((13 - kept)) videos" "$work/rerun.log" || { cat "$work/rerun.log"; echo "FAIL: rerun probed again"; exit 1; }
"$probe" -j 2 "$d/blank.csv" "$d/whole.csv" 2> /dev/null
cmp "$d/resumed.csv" "$d/whole.csv" || { diff "$d/resumed.csv" "$d/whole.csv"; echo "FAIL: resumed file differs"; exit 1; }
[[ ! -e "$d/resumed.csv.partial" ]] || { echo "FAIL: partial left after the rerun"; exit 1; }
echo "probe: interrupted after $kept rows, resumed to the same file"
