#!/bin/bash
# apptainer-build.sh IMAGE TARGET.sif
#
# Builds a registry image into an Apptainer SIF file, once, however many nodes and jobs ask at the
# same time (the Apptainer counterpart of enroot-import.sh):
#   IMAGE   docker://REGISTRY/NAME:TAG (also oras://, library://): what `apptainer build` takes
#   TARGET  the .sif file to produce, normally on a file system every node shares
#
# - A TARGET that is a whole SIF file is left alone (exit 0). Whole: its global header carries
#   SIF's magic and the data the header declares (data offset + length) lies inside the file
#   (the header's layout: apptainer/sif, pkg/sif/sif.go), so a partial copy is not whole.
# - Otherwise the build runs under `flock` on TARGET.lock, so concurrent callers wait for the
#   first one and then find a finished file.
# - apptainer writes its output as it builds, so it builds into a temporary file next to TARGET,
#   which is checked and only then renamed to TARGET (atomic in one directory): nobody ever sees
#   a partial TARGET, even where flock only locks per node.
#
# hpcserve copies this file into Apptainer job directories whose image is a registry URI; the
# job runs it once on the batch node before any step. It is also the way to build by hand.
set -euo pipefail

usage() { echo "usage: ${0##*/} IMAGE TARGET.sif" >&2; exit 2; }
say() { echo "apptainer-build: $*" >&2; }

[ $# -eq 2 ] || usage
case "$1" in -*) usage ;; esac
image=$1
target=$2
case "$target" in *.sif) ;; *) say "TARGET must end in .sif: $target"; exit 2 ;; esac
case "$image" in
  docker://?* | oras://?* | library://?*) ;;
  *) say "IMAGE must be a registry URI apptainer builds from (docker://, oras://, library://):" \
         "$image"; exit 2 ;;
esac
for cmd in apptainer flock od; do
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

# int64 little-endian at byte offset $2 of file $1
i64() { od -An -t d8 -j "$2" -N 8 -- "$1" | tr -d ' '; }
whole() {
  [ -f "$1" ] || return 1
  [ "$(od -An -c -j 32 -N 9 -- "$1" | tr -d ' ')" = SIF_MAGIC ] || return 1
  local end size
  end=$(( $(i64 "$1" 112) + $(i64 "$1" 120) ))
  size=$(stat -c %s -- "$1")
  [ "$end" -le "$size" ]
}

if whole "$target"; then
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

if whole "$target"; then
  say "$target was built by another process"
  exit 0
fi
if [ -e "$target" ]; then
  say "$target is not a whole SIF file; building it again"
  rm -f -- "$target"
fi

tmp="${target%.sif}.tmp-$(hostname -s 2>/dev/null || hostname)-$$.sif"
trap 'rm -f -- "$tmp"' EXIT
rm -f -- "$tmp"
say "building $image"
apptainer build "$tmp" "$image"
if ! whole "$tmp"; then
  say "the built file is not a whole SIF file: $tmp"
  exit 1
fi
sync -- "$tmp" 2>/dev/null || true
mv -f -- "$tmp" "$target"
trap - EXIT
say "built $image into $target"
