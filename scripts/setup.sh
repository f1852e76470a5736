#!/usr/bin/env bash
# Installs what hpcserve's demo and tests need on a fresh Debian/Ubuntu machine, idempotently:
# system packages (Slurm, OpenMPI, OpenSSH, iproute2, Chromium for the report page test, the
# system python3 with mpi4py and PyYAML that the test jobs' unprivileged users run, and
# iptables, with which an adversarial test holds back a connection) and a project virtualenv
# in .venv.
# Every step is skipped when its result is already there, so re-running costs about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(slurmctld slurmd slurm-client openmpi-bin libopenmpi-dev iproute2 openssh-server procps squashfs-tools chromium
              python3 python3-venv python3-mpi4py python3-yaml munge iptables)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "hpcserve setup: missing system packages: ${missing[*]}" >&2
    echo "run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 2
  fi
  echo "hpcserve setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian's slurm packages start their daemons on install; the dev cluster runs its own, so stop
  # only the services the packages started (by unit, never by process name).
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now slurmctld slurmd >/dev/null 2>&1 || true
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.hpcserve-setup
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/pip install -q -U pip >/dev/null
  .venv/bin/pip install -q -e '.[test]' mpi4py
  echo "$want" > "$stamp"
fi

# Two unprivileged users for the adversarial tests (tests/adversary): the first owns the
# deployment under test, the second plays another user of the same shared cluster. Made only
# where this runs as root (CI does); as anyone else, those tests say what to run.
if [ "$(id -u)" = 0 ]; then
  for u in hpcserve-a hpcserve-b; do
    id -u "$u" >/dev/null 2>&1 || useradd --create-home --shell /bin/sh --user-group "$u"
    # no password, yet not locked ('!'): sshd lets a locked account in by no key at all, and
    # the SSH tests log in as hpcserve-a with a key, as HPC users do
    [ "$(getent shadow "$u" | cut -d: -f2)" = '*' ] || usermod -p '*' "$u"
  done
fi
