#!/bin/bash
# worker-1: SGLang 0.5.23 plain instance 1, TP 8 (component 0 nodes 1)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --nodelist="${NODELIST}" \
  --overlap \
  --job-name=worker-1"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  --container-image=/jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/kimi-k2-thinking:/jobs/kimi-k2-thinking,/raid/hpcserve-cache:/raid/hpcserve-cache \
  --container-workdir=/jobs/kimi-k2-thinking \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES,HPCSERVE_API_KEY \
  bash /jobs/kimi-k2-thinking/launch/container-task.sh worker-1 bash /jobs/kimi-k2-thinking/launch/worker-1.sh
