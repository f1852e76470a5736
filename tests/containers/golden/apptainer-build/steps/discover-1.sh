#!/bin/bash
# address discovery on every node of component 1 (decode): one task per node prints its preflight checks, then its name, address, interface and IB devices
# Started by hpcserve_runtime.
set -euo pipefail
exec srun \
  --het-group=1 \
  --nodes=2 \
  --ntasks=2 \
  --ntasks-per-node=1 \
  --overlap \
  --job-name=discover-decode \
  --kill-on-bad-exit=1 \
  bash /shared/hpcserve-jobs/demo-golden/launch/discover.sh 1
