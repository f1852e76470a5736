#!/bin/bash
# address discovery on every node of component 0 (prefill): one task per node prints its preflight checks, then its name, address, interface and IB devices
# Started by hpcserve_runtime.
set -euo pipefail
exec srun \
  --het-group=0 \
  --nodes=4 \
  --ntasks=4 \
  --ntasks-per-node=1 \
  --overlap \
  --job-name=discover-prefill \
  --kill-on-bad-exit=1 \
  bash /jobs/kimi-k2-instruct-4p12d/launch/discover.sh 0
