#!/bin/bash
# prefill-0: simulated SGLang 0.5.23 prefill instance 0, TP 8, DP-attention 8, EP 8 (component 0 nodes 0)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --het-group=0 \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --nodelist="${NODELIST}" \
  --overlap \
  --job-name=prefill-0"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  --container-image=/shared/hpcserve-jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sqsh \
  --container-mounts=/lustre:/lustre,/shared/hpcserve-jobs/demo-golden:/shared/hpcserve-jobs/demo-golden,/models/Kimi-K2-Instruct:/models/Kimi-K2-Instruct:ro \
  --container-workdir=/shared/hpcserve-jobs/demo-golden \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_DEBUG,HPCSERVE_API_KEY \
  bash /shared/hpcserve-jobs/demo-golden/launch/container-task.sh prefill-0 bash /shared/hpcserve-jobs/demo-golden/launch/prefill-0.sh
