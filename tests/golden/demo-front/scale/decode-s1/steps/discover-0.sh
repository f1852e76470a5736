#!/bin/bash
# address discovery on every node of component 0 (decode): one task per node prints its preflight checks, then its name, address, interface and IB devices
# Started by hpcserve_runtime.
set -euo pipefail
exec srun \
  --nodes=2 \
  --ntasks=2 \
  --ntasks-per-node=1 \
  --overlap \
  --job-name=discover-decode \
  --kill-on-bad-exit=1 \
  bash /jobs/demo-front/scale/decode-s1/launch/discover.sh 0
