#!/bin/bash
# router: sglang-router on node 0 of component 0
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --het-group=0 \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --nodelist="${NODELIST}" \
  --overlap \
  --job-name=router \
  --kill-on-bad-exit=1 \
  bash /shared/hpcserve-jobs/demo-golden/launch/container-task.sh router bash /shared/hpcserve-jobs/demo-golden/launch/router.sh
