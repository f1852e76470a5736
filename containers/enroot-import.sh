#!/bin/bash
# enroot-import.sh [-a ARCH] [--owner USER] IMAGE TARGET.sqsh
#
# Imports a container image into an enroot squashfs file, once, however many nodes and jobs ask
# at the same time:
#   IMAGE   docker://[USER@][REGISTRY#]IMAGE[:TAG][@sha256:DIGEST] (also dockerd://, podman://);
#           without a scheme docker:// is assumed, as pyxis does: lmsysorg/sglang:v0.5.23,
#           nvcr.io#nvidia/pytorch:24.01-py3. A digest needs enroot 4.0 or later
#           (https://github.com/NVIDIA/enroot/blob/v4.0.0/src/docker.sh, docker::_parse_uri).
#   TARGET  the .sqsh file to produce, normally on a file system every node shares
#   --owner USER  TARGET is in the site's image cache, which USER alone writes (see
#                 hpcserve_image_cache.sh)
#
# A TARGET that exists, that `unsquashfs -l` reads completely and that is the right user's is
# left alone (exit 0); otherwise the import runs once, under a lock, and is renamed into place
# (hpcserve_image_cache.sh, beside this file, says how).
#
# hpcserve copies this file into enroot job directories whose image is a URI; it is also the way
# to import an image by hand before submitting.
set -euo pipefail

usage() { echo "usage: ${0##*/} [-a ARCH] [--owner USER] IMAGE TARGET.sqsh" >&2; exit 2; }
say() { echo "enroot-import: $*" >&2; }

arch= owner=
while [ $# -gt 0 ]; do
  case "$1" in
    -a | --arch) [ $# -ge 2 ] && [ -n "$2" ] || usage; arch=$2; shift 2 ;;
    --owner) [ $# -ge 2 ] && [ -n "$2" ] || usage; owner=$2; shift 2 ;;
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

valid() { [ -f "$1" ] && unsquashfs -l "$1" >/dev/null 2>&1; }
make() { enroot import ${arch:+--arch "$arch"} --output "$1" "$2"; }

. "$(dirname -- "${BASH_SOURCE[0]}")/hpcserve_image_cache.sh"
cache_image "$uri" "$target" "$owner"
