#!/usr/bin/env bash
# The LibTorch 2.x check that needs no GPU: builds gst-videotrain and runs its tests on Debian trixie
# (LibTorch 2.6 CPU, GStreamer 1.26, GCC 14) in a debootstrap chroot on this (bookworm) machine.
# Usage, as root: scripts/check-trixie.sh [ROOTFS]   (default /var/tmp/videotrain-trixie, kept for reruns;
# its build/ is kept too, so a rerun rebuilds only what changed). About 10 minutes the first time on 2 cores.
# Left out there: the torchrun test, because trixie's torchrun cannot start at all (its rendezvous asks
# for a libuv TCPStore, which Debian's LibTorch lacks, whatever USE_LIBUV says).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-/var/tmp/videotrain-trixie}
[[ $(id -u) -eq 0 ]] || { echo "check-trixie.sh needs root (debootstrap, mount, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q debootstrap; }
[[ -x $root/usr/bin/apt-get ]] || debootstrap --variant=minbase trixie "$root" http://deb.debian.org/debian
mounts=(proc sys dev)
# The CUDA toolkit's headers, where this machine has them, for the cuda-compile test.
if [[ -d /usr/local/cuda/include ]]; then mkdir -p "$root/usr/local/cuda" && mounts+=(usr/local/cuda); fi
cleanup() { for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "$root/${mounts[i]}" 2>/dev/null || true; done; }
trap cleanup EXIT
for d in "${mounts[@]}"; do mountpoint -q "$root/$d" || mount --bind "/$d" "$root/$d"; done
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The working tree (tracked and untracked files, not ignored ones), with nothing beside it (a clone has no shared folder).
# Only files whose content changed are copied, with the time of the copy: a file edited after the
# kept build/ was made but dated before it (a merge, a checkout) must still be rebuilt.
dst=$root/work/main stage=$root/work/stage
rm -rf "$stage" && mkdir -p "$dst" "$stage"
(cd "$src" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$stage"
(cd "$dst" && find . -path ./build -prune -o -type f -print0) | while IFS= read -r -d '' f; do
  [[ -e $stage/$f ]] || rm -f "$dst/$f"
done
(cd "$stage" && find . -type f -print0) | while IFS= read -r -d '' f; do
  cmp -s "$stage/$f" "$dst/$f" || { mkdir -p "$(dirname "$dst/$f")" && cp "$stage/$f" "$dst/$f"; }
done
rm -rf "$stage"
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  bash -c 'cd /work/main && apt-get update -q >/dev/null && bash scripts/test.sh --no-suite torchrun'
