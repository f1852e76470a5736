#!/usr/bin/env bash
# Creates, idempotently, a virtualenv holding vLLM's REAL `vllm serve` argument parser, so tests
# can parse every generated vLLM command line with the engine itself (tests/engine_parsers/).
#
#   scripts/setup-vllm-parser.sh        # -> .venv-engines-vllm (override: HPCSERVE_VLLM_PARSER_VENV)
#
# Nothing in it needs a GPU: vllm==$VLLM_VERSION with --no-deps (its metadata wants CUDA torch and
# kernels), the CPU build of torch, and the pure-Python packages the parser's imports need, found
# by importing `vllm.entrypoints.cli.serve` until it stopped failing, each pinned. Download: the
# vllm wheel (~340 MB) and ~60 MB of others; about a minute on CI's network.
# A stamp file (hash of this script + python version) makes a re-run a no-op (~0.1 s).
set -euo pipefail
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SELF")/.."

VENV=${HPCSERVE_VLLM_PARSER_VENV:-$PWD/.venv-engines-vllm}
PY=${PYTHON:-python3}
VLLM_VERSION=0.33.0
TORCH_VERSION=2.13.0
DEPS=(
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
  annotated-types==0.8.0 anyio==4.16.0 apache-tvm-ffi==0.1.11 attrs==26.1.0 cachetools==8.0.1
  cbor2==6.3.0 certifi==2026.10.18 cloudpickle==3.1.2 fastapi==0.136.3 filelock==4.2.11
  frozenlist==1.8.0 h11==0.16.0 httpcore2==2.16.2 httpx2==2.16.2 huggingface_hub==2.4.0
  idna==3.20 llguidance==1.7.6 mpmath==1.4.1 msgspec==0.22.0 multidict==7.2.1 networkx==3.6.1
  numpy==2.4.6 openai==3.54.0 openai-harmony==0.0.8 packaging==26.3
  partial-json-parser==0.2.1.1.post7 pillow==13.0.0 prometheus_client==0.26.0 propcache==0.5.4
  psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1 pydantic==2.14.3 pydantic_core==2.50.4
  PyYAML==6.0.3 pyzmq==27.3.0 regex==2026.11.15 requests==2.34.2 safetensors==0.8.0
  sniffio==1.3.1 starlette==1.10.0 sympy==1.14.0 tokenizers==0.23.3 tqdm==4.70.1
  transformers==5.20.2 truststore==0.10.5 typing-inspection==0.4.5 typing_extensions==4.16.0
  urllib3==2.8.0 uvloop==0.23.0 xgrammar==0.2.8 yarl==1.25.1 uvicorn==0.54.0 click==8.5.1
  watchfiles==1.3.0 orjson==3.13.0
)

stamp=$VENV/.hpcserve-vllm-parser-stamp
want="$(sha256sum < "$SELF" | cut -d' ' -f1) $("$PY" -c 'import sys; print(sys.version.split()[0])')"
current() { [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
current && exit 0

mkdir -p "$VENV"
# Serialise concurrent callers (e.g. two pytest sessions) on a lock inside the venv folder.
exec 9>"$VENV/.hpcserve-vllm-parser.lock"
if command -v flock >/dev/null; then flock 9; fi
current && exit 0

t0=$(date +%s)
echo "hpcserve setup-vllm-parser: building $VENV (vllm==$VLLM_VERSION, CPU torch==$TORCH_VERSION)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# --no-compile: only the tests' parser process imports from this venv, and only a small part
# of it; Python compiles what it imports on first use. Compiling every module at install
# costs more than that (torch alone: 24 s of install instead of 9).
pip=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
# Some pip configs point at local mirrors that print a warning per missing project: keep it quiet.
quiet() { "$@" 2> >(grep -v -e '^WARNING: Location ' -e 'dependency conflicts' -e ' requires ' >&2); }

quiet "${pip[@]}" install --no-compile --no-deps "torch==$TORCH_VERSION" "vllm==$VLLM_VERSION"
quiet "${pip[@]}" install --no-compile --no-deps "${DEPS[@]}"

# Refuse a GPU build, and prove the parser `vllm serve` uses builds.
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md, sys
bad = sorted(d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia"))
import torch
if torch.version.cuda is not None or bad:
    sys.exit(f"setup-vllm-parser: GPU packages in the venv (torch cuda={torch.version.cuda}, {bad})")
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
ServeSubcommand().subparser_init(FlexibleArgumentParser().add_subparsers())
EOF
echo "$want" > "$stamp"
echo "hpcserve setup-vllm-parser: done in $(( $(date +%s) - t0 )) s" >&2
