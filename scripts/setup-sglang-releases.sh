#!/usr/bin/env bash
# Fetches, idempotently, the OLDER SGLang releases hpcserve accepts, so tests can parse every
# generated command line with each release's own parser (tests/engine_parsers/
# test_sglang_releases.py). .venv-engines (scripts/setup-engines.sh) holds the newest release;
# each older one is only its wheel's files, unpacked into a folder of its own:
#
#   scripts/setup-sglang-releases.sh   # -> .sglang-releases/<version>/sglang/...
#                                      #    (override: HPCSERVE_SGLANG_RELEASES_DIR=/path)
#
# The tests run the engines venv's python with that folder first on PYTHONPATH: the release's
# `sglang` package, the venv's torch (CPU) and light packages. Nothing is installed, so the venv's
# own release stays as it was. Wheels: https://pypi.org/project/sglang/#history, downloaded with
# `pip download --no-deps` (their metadata wants CUDA kernels); ~90 MB for the three, fetched side
# by side. A stamp file (hash of this script + python version) makes a re-run a no-op (~0.1 s).
#
# RELEASES is every SGLang release hpcserve accepts (hpcserve/engines/sglang.py CHECKED) except
# the engines venv's; tests/engine_parsers/test_sglang_releases.py keeps the lists equal.
set -euo pipefail
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SELF")/.."

DIR=${HPCSERVE_SGLANG_RELEASES_DIR:-$PWD/.sglang-releases}
PY=${PYTHON:-python3}
RELEASES=(0.5.20 0.5.21 0.5.22)

stamp=$DIR/.hpcserve-sglang-releases-stamp
pyver=$("$PY" -c 'import sys; print(sys.version.split()[0])')
want="$(sha256sum < "$SELF" | cut -d' ' -f1) $pyver"
current() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
current && exit 0

mkdir -p "$DIR"
# Serialise concurrent callers (e.g. two pytest sessions) on a lock inside the folder.
exec 9>"$DIR/.hpcserve-sglang-releases.lock"
if command -v flock >/dev/null; then flock 9; fi
current && exit 0

# A fetch that failed last time (a release PyPI lacks, a cut connection) leaves its folder.
rm -rf "$DIR"/.tmp-*
t0=$(date +%s)
echo "hpcserve setup-sglang-releases: fetching sglang ${RELEASES[*]} into $DIR" >&2
# Some pip configs point at local mirrors that print a warning per missing project: keep it quiet.
quiet() { "$@" 2> >(grep -v -e '^WARNING: Location ' >&2); }

fetch() {  # one release: download its wheel, unpack it beside the others, then move it in place
  local v=$1 tmp="$DIR/.tmp-$1"
  rm -rf "$tmp" && mkdir -p "$tmp/wheel"
  quiet "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$tmp/wheel" "sglang==$v"
  "$PY" -m zipfile -e "$tmp"/wheel/sglang-"$v"-*.whl "$tmp/files"
  # The wheel's own version, not the folder name, is what the tests compare with.
  grep -qx "Version: $v" "$tmp"/files/sglang-"$v".dist-info/METADATA
  rm -rf "${DIR:?}/$v" && mv "$tmp/files" "$DIR/$v" && rm -rf "$tmp"
}

pids=()
for v in "${RELEASES[@]}"; do fetch "$v" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
# Folders of releases no longer listed would only mislead a reader: drop them.
for d in "$DIR"/*/; do
  v=$(basename "$d")
  [[ " ${RELEASES[*]} " == *" $v "* ]] || rm -rf "$d"
done
echo "$want" > "$stamp"
echo "hpcserve setup-sglang-releases: done in $(( $(date +%s) - t0 )) s" >&2
