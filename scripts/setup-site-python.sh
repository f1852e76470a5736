#!/usr/bin/env bash
# Creates, idempotently, the Python a site installs for every user of its nodes: the system's
# python3 with the routers hpcserve pins, and the system's mpi4py and PyYAML (Debian's
# python3-mpi4py, built for its OpenMPI, and python3-yaml: scripts/setup.sh installs them), in
# a directory everyone may read and run (/opt/hpcserve/site-python-<router releases>;
# override: HPCSERVE_SITE_PYTHON). The test tiers' deployments run as an unprivileged user
# (hpcserve-a), who cannot run the project venv's python where that lies in root's home
# (pyenv's, say), as it does on CI.
#
#   scripts/setup-site-python.sh      # prints the venv's path
#
# A stamp (hash of this script and the python's version) makes a re-run a no-op; concurrent
# callers wait on a lock in the directory. Download: the two routers' wheels, click, jinja2,
# submitit and matplotlib with their dependencies, about 40 s.
set -euo pipefail
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SELF")/.."

SGLANG_ROUTER=0.3.2   # pyproject.toml's test extra pins the same releases
VLLM_ROUTER=0.1.17
VENV=${HPCSERVE_SITE_PYTHON:-/opt/hpcserve/site-python-sglang-router-$SGLANG_ROUTER-vllm-router-$VLLM_ROUTER}
PY=/usr/bin/python3   # the system's: every user may run it (scripts/setup.sh installs it)
umask 022

stamp=$VENV/.hpcserve-site-python-stamp
want="$(sha256sum < "$SELF" | cut -d' ' -f1) $("$PY" -c 'import sys; print(sys.version.split()[0])')"
current() { [ -x "$VENV/bin/python3" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
done_() { echo "$VENV"; exit 0; }
current && done_

mkdir -p "$VENV"
exec 9>"$VENV/.hpcserve-site-python.lock"
flock 9
current && done_
t0=$(date +%s)
[ -x "$VENV/bin/python3" ] || "$PY" -m venv --system-site-packages "$VENV"
# Some pip configs point at local mirrors that print a warning per missing project: keep it quiet.
# Compiled to bytecode as pip does by default: its users cannot write __pycache__ here, and
# would compile each module from source at every import (sglang-router's: 1.7 s, not 0.8 s).
"$VENV/bin/python3" -m pip -q --disable-pip-version-check install \
  "sglang-router==$SGLANG_ROUTER" "vllm-router==$VLLM_ROUTER" \
  "click>=8.1" "jinja2>=3.1" "submitit>=1.5" "matplotlib>=3.7" \
  2> >(grep -v -e '^WARNING: Location ' >&2)
"$VENV/bin/python3" -c 'import sglang_router.launch_router, vllm_router.launch_router, mpi4py, yaml
import click, jinja2, submitit, matplotlib'
chmod -R a+rX "$VENV"
echo "$want" > "$stamp"
echo "hpcserve setup-site-python: $VENV built in $(( $(date +%s) - t0 )) s" >&2
done_
