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
  --container-image=/shared/hpcserve-jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sqsh \
  --container-mounts=/lustre:/lustre,/shared/hpcserve-jobs/demo-golden:/shared/hpcserve-jobs/demo-golden,/models/Kimi-K2-Instruct:/models/Kimi-K2-Instruct:ro \
  --container-workdir=/shared/hpcserve-jobs/demo-golden \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_DEBUG,HPCSERVE_API_KEY \
  bash /shared/hpcserve-jobs/demo-golden/launch/container-task.sh router bash /shared/hpcserve-jobs/demo-golden/launch/router.sh
