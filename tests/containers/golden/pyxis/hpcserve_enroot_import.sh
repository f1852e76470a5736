#!/bin/bash
# enroot-import.sh [-a ARCH] IMAGE TARGET.sqsh
#
# Imports a container image into an enroot squashfs file, once, however many nodes and jobs ask
# at the same time:
#   IMAGE   docker://[USER@][REGISTRY#]IMAGE[:TAG] (also dockerd://, podman://); without a scheme
#           docker:// is assumed, as pyxis does: lmsysorg/sglang:v0.5.23,
#           nvcr.io#nvidia/pytorch:24.01-py3
#   TARGET  the .sqsh file to produce, normally on a file system every node shares
#
# - A TARGET that exists and that `unsquashfs -l` reads completely is left alone (exit 0).
# - Otherwise the import runs under `flock` on TARGET.lock, so concurrent callers wait for the
#   first one and then find a finished file.
# - enroot writes the image progressively, so it writes to a temporary file next to TARGET; the
#   file is validated with `unsquashfs -l` and only then renamed to TARGET (atomic in one
#   directory), so nobody ever sees a partial TARGET, even where flock only locks per node
#   (Lustre mounted with localflock): at worst several nodes import, and each rename is whole.
#
# hpcserve copies this file into enroot job directories whose image is a URI; it is also the way
# to import an image by hand before submitting.
set -euo pipefail

usage() { echo "usage: ${0##*/} [-a ARCH] IMAGE TARGET.sqsh" >&2; exit 2; }
say() { echo "enroot-import: $*" >&2; }

arch=
while [ $# -gt 0 ]; do
  case "$1" in
    -a | --arch) [ $# -ge 2 ] && [ -n "$2" ] || usage; arch=$2; shift 2 ;;
    -h | --help) usage ;;
    --) shift; break ;;
    -*) usage ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || usage
image=$1
target=$2
case "$target" in *.sqsh) ;; *) say "TARGET must end in .sqsh: $target"; exit 2 ;; esac
case "$image" in
  docker://* | dockerd://* | podman://*) uri=$image ;;
  *://*)
    say "unsupported image URI (enroot imports docker://, dockerd://, podman://): $image"
    exit 2 ;;
  *) uri="docker://$image" ;;
esac
for cmd in enroot flock unsquashfs; do
  command -v "$cmd" >/dev/null || { say "$cmd is not installed"; exit 2; }
done

# The image is code the deployment runs as its user: TARGET's directory must be that user's
# own. Where it is missing it is made 0700 (and its parent, the cache shared by every user of
# the jobs folder, like /tmp: anyone may add a directory, nobody remove another's); one that
# another user owns, a link, or one others may write is refused, naming its owner, so that
# nobody else's file is ever taken for the image (nor their lock stalls the job).
own_dir() {
  local d=$1
  if [ ! -e "$d" ] && [ ! -L "$d" ]; then
    [ -d "${d%/*}" ] || { mkdir -p -- "$(dirname -- "${d%/*}")" &&
                          mkdir -m 1777 -- "${d%/*}"; } 2>/dev/null || :
    mkdir -m 700 -- "$d" 2>/dev/null || :
  fi
  if [ -L "$d" ] || [ ! -d "$d" ] || [ ! -O "$d" ] ||
     [ $(( 0$(stat -c %a -- "$d") & 022 )) != 0 ]; then
    say "refusing $d for images (owner $(stat -c %U -- "$d" 2>&1), mode" \
        "$(stat -c %a -- "$d" 2>&1)): it must be a directory of yours, not a link, that no" \
        "one else may write"
    exit 2
  fi
}
umask 077
own_dir "$(dirname -- "$target")"

valid() { [ -f "$1" ] && unsquashfs -l "$1" >/dev/null 2>&1; }

if valid "$target"; then
  say "$target is up to date"
  exit 0
fi

# The lock file is never deleted: removing it while another process waits on it would let a third
# one lock a new file of the same name. It lies in the user's own directory: only this user's
# jobs ever wait on it.
exec {lock}>>"$target.lock"
wait_s=${HPCSERVE_IMPORT_LOCK_TIMEOUT:-7200}
say "waiting for the lock on $target.lock (up to ${wait_s}s)"
if ! flock -w "$wait_s" "$lock"; then
  say "could not lock $target.lock within ${wait_s}s"
  exit 1
fi

if valid "$target"; then
  say "$target was imported by another process"
  exit 0
fi
if [ -e "$target" ]; then
  say "$target is not a readable squashfs file; importing it again"
  rm -f -- "$target"
fi

tmp="${target%.sqsh}.tmp-$(hostname -s 2>/dev/null || hostname)-$$.sqsh"
trap 'rm -f -- "$tmp"' EXIT
rm -f -- "$tmp"
say "importing $uri"
enroot import ${arch:+--arch "$arch"} --output "$tmp" "$uri"
if ! valid "$tmp"; then
  say "the imported file does not read back with unsquashfs -l: $tmp"
  exit 1
fi
sync -- "$tmp" 2>/dev/null || true
mv -f -- "$tmp" "$target"
trap - EXIT
say "imported $uri to $target"
