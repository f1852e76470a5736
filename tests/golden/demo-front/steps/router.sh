#!/bin/bash
# router: sglang-router on node 0 of component 0
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --nodelist="${NODELIST}" \
  --overlap \
  --job-name=router \
  --kill-on-bad-exit=1 \
  bash /jobs/demo-front/launch/router.sh
