#!/bin/bash
# address discovery on every node of component 0 (worker): one task per node prints its preflight checks, then its name, address, interface and IB devices
# Started by hpcserve_runtime.
set -euo pipefail
exec srun \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --overlap \
  --job-name=discover-worker \
  --kill-on-bad-exit=1 \
  bash /jobs/ktransformers-legacy-deepseek-v3/launch/discover.sh 0
