#!/bin/bash
# worker-0: SGLang 0.5.23 plain instance 0, TP 16 (component 0 nodes 0-1)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --nodes=2 \
  --ntasks=2 \
  --ntasks-per-node=1 \
  --nodelist="${NODELIST}" \
  --overlap \
  --wait=5 \
  --job-name=worker-0"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  --container-image=/jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/kimi-k2-instruct-tp16:/jobs/kimi-k2-instruct-tp16,/raid/hpcserve-cache:/raid/hpcserve-cache \
  --container-workdir=/jobs/kimi-k2-instruct-tp16 \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES,HPCSERVE_API_KEY \
  bash /jobs/kimi-k2-instruct-tp16/launch/container-task.sh worker-0 bash /jobs/kimi-k2-instruct-tp16/launch/worker-0.sh
