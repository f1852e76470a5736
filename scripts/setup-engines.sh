#!/usr/bin/env bash
# Creates, idempotently, a separate virtualenv holding SGLang's REAL argument parser, so tests can
# validate generated launch_server command lines against the engine itself (tests/engine_parsers/).
#
#   scripts/setup-engines.sh            # -> .venv-engines (override: HPCSERVE_ENGINES_VENV=/path)
#
# What goes in, and why nothing in it needs a GPU:
#   * torch==2.13.0 CPU build, installed with --no-deps (plus torch's own pure-Python deps) so no
#     nvidia-* wheel can be pulled; every later install is constrained to that torch.
#   * sglang==$SGLANG_VERSION with --no-deps (its metadata wants CUDA kernels, flashinfer, ...).
#   * the light packages `import sglang.srt.server_args` needs (found by importing it until it
#     stopped failing): numpy orjson psutil pybase64 requests triton packaging pillow starlette
#     msgspec pydantic pyzmq tqdm ipython aiohttp. triton is a large (~290 MB) but CPU-installable
#     wheel that sglang.srt.utils.common imports at module level.
# A stamp file (hash of this script + python version) makes a re-run a no-op (~0.1 s).
set -euo pipefail
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SELF")/.."

VENV=${HPCSERVE_ENGINES_VENV:-$PWD/.venv-engines}
PY=${PYTHON:-python3}
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
TORCH_PURE_DEPS=("setuptools>=77.0.3" filelock typing_extensions sympy networkx jinja2 fsspec)
LIGHT_DEPS=(
  numpy==2.4.6 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 triton==3.9.0
  packaging==26.3 pillow==13.0.0 starlette==1.10.0 msgspec==0.22.0 pydantic==2.14.3
  pyzmq==27.3.0 tqdm==4.70.1 ipython==9.18.1 aiohttp==3.14.5
)

stamp=$VENV/.hpcserve-engines-stamp
want="$(sha256sum < "$SELF" | cut -d' ' -f1) $("$PY" -c 'import sys; print(sys.version.split()[0])')"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

mkdir -p "$VENV"
# Serialise concurrent callers (e.g. two pytest sessions) on a lock inside the venv folder.
exec 9>"$VENV/.hpcserve-engines.lock"
if command -v flock >/dev/null; then flock 9; fi
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

t0=$(date +%s)
echo "hpcserve setup-engines: building $VENV (sglang==$SGLANG_VERSION, CPU torch==$TORCH_VERSION)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# --no-compile: only the tests' parser process imports from this venv, and only a small part
# of it; Python compiles what it imports on first use. Compiling every module at install
# costs more than that (torch alone: 24 s of install instead of 9).
pip=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
cons=$(mktemp)
trap 'rm -f "$cons"' EXIT
echo "torch==$TORCH_VERSION" > "$cons"

# Some pip configs point at local mirrors that print a warning per missing project: keep the log quiet.
quiet() { "$@" 2> >(grep -v -e '^WARNING: Location ' -e 'dependency conflicts' -e '^sglang .* requires ' >&2); }

quiet "${pip[@]}" install --no-compile --no-deps "torch==$TORCH_VERSION"
quiet "${pip[@]}" install --no-compile -c "$cons" "${TORCH_PURE_DEPS[@]}"
quiet "${pip[@]}" install --no-compile --no-deps "sglang==$SGLANG_VERSION"
quiet "${pip[@]}" install --no-compile -c "$cons" "${LIGHT_DEPS[@]}"

# Refuse a GPU build: a CUDA torch (or any nvidia-* wheel) here means the machine's pip found no CPU
# wheel for torch==$TORCH_VERSION; point pip at one (e.g. PIP_FIND_LINKS) and re-run.
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md, sys
bad = sorted(d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia"))
import torch
if torch.version.cuda is not None or bad:
    sys.exit(f"setup-engines: GPU packages in the engines venv (torch cuda={torch.version.cuda}, {bad}); "
             "install a CPU build of torch")
import argparse
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser(allow_abbrev=False)
ServerArgs.add_cli_args(p)
EOF
echo "$want" > "$stamp"
echo "hpcserve setup-engines: done in $(( $(date +%s) - t0 )) s" >&2
