#!/bin/bash
# decode-0: simulated SGLang 0.5.23 decode instance 0, TP 16, DP-attention 16, EP 16 (component 1 nodes 0-1)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --het-group=1 \
  --nodes=2 \
  --ntasks=2 \
  --ntasks-per-node=1 \
  --nodelist="${NODELIST}" \
  --overlap \
  --wait=5 \
  --job-name=decode-0"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  --container-image=/shared/hpcserve-jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sqsh \
  --container-mounts=/lustre:/lustre,/shared/hpcserve-jobs/demo-golden:/shared/hpcserve-jobs/demo-golden,/models/Kimi-K2-Instruct:/models/Kimi-K2-Instruct:ro \
  --container-workdir=/shared/hpcserve-jobs/demo-golden \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_DEBUG,HPCSERVE_API_KEY \
  bash /shared/hpcserve-jobs/demo-golden/launch/container-task.sh decode-0 bash /shared/hpcserve-jobs/demo-golden/launch/decode-0.sh
