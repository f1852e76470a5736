#!/bin/bash
# address discovery on every node of component 0 (prefill): one task per node prints its preflight checks, then its name, address, interface and IB devices
# Started by hpcserve_runtime.
set -euo pipefail
exec srun \
  --het-group=0 \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --overlap \
  --job-name=discover-prefill \
  --kill-on-bad-exit=1 \
  bash /shared/hpcserve-jobs/demo-golden/launch/discover.sh 0
