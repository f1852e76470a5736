#!/bin/bash
# worker-0: KTransformers in SGLang 0.5.23 plain instance 0, TP 8, 104 CPU expert threads (component 0 nodes 0)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --cpus-per-task=224 \
  --cpu-bind=none \
  --nodelist="${NODELIST}" \
  --overlap \
  --job-name=worker-0"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  --container-image=/lustre/images/ktransformers-0.7.2.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/kimi-k2-thinking-ktransformers:/jobs/kimi-k2-thinking-ktransformers,/raid/hpcserve-cache:/raid/hpcserve-cache \
  --container-workdir=/jobs/kimi-k2-thinking-ktransformers \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES,HPCSERVE_API_KEY \
  bash /jobs/kimi-k2-thinking-ktransformers/launch/container-task.sh worker-0 bash /jobs/kimi-k2-thinking-ktransformers/launch/worker-0.sh
