#!/bin/bash
# apptainer-build.sh [--owner USER] IMAGE TARGET.sif
#
# Builds a registry image into an Apptainer SIF file, once, however many nodes and jobs ask at the
# same time (the Apptainer counterpart of enroot-import.sh):
#   IMAGE   docker://REGISTRY/NAME:TAG[@sha256:DIGEST] (also oras://, library://): what
#           `apptainer build` takes
#   TARGET  the .sif file to produce, normally on a file system every node shares
#   --owner USER  TARGET is in the site's image cache, which USER alone writes (see
#                 hpcserve_image_cache.sh)
#
# A TARGET that is a whole SIF file and the right user's is left alone (exit 0). Whole: its
# global header carries SIF's magic and the data the header declares (data offset + length) lies
# inside the file (the header's layout: apptainer/sif, pkg/sif/sif.go), so a partial copy is not
# whole. Otherwise the build runs once, under a lock, and is renamed into place
# (hpcserve_image_cache.sh, beside this file, says how).
#
# hpcserve copies this file into Apptainer job directories whose image is a registry URI; the
# job runs it once on the batch node before any step. It is also the way to build by hand.
set -euo pipefail

usage() { echo "usage: ${0##*/} [--owner USER] IMAGE TARGET.sif" >&2; exit 2; }
say() { echo "apptainer-build: $*" >&2; }

owner=
if [ "${1-}" = --owner ]; then
  [ $# -ge 2 ] && [ -n "$2" ] || usage
  owner=$2
  shift 2
fi
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

# int64 little-endian at byte offset $2 of file $1
i64() { od -An -t d8 -j "$2" -N 8 -- "$1" | tr -d ' '; }
valid() {
  [ -f "$1" ] || return 1
  [ "$(od -An -c -j 32 -N 9 -- "$1" | tr -d ' ')" = SIF_MAGIC ] || return 1
  local end size
  end=$(( $(i64 "$1" 112) + $(i64 "$1" 120) ))
  size=$(stat -c %s -- "$1")
  [ "$end" -le "$size" ]
}
make() { apptainer build "$1" "$2"; }

. "$(dirname -- "${BASH_SOURCE[0]}")/hpcserve_image_cache.sh"
cache_image "$image" "$target" "$owner"
