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
  --container-image=/lustre/images/ktransformers-0.7.2.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/kimi-k2-thinking-ktransformers:/jobs/kimi-k2-thinking-ktransformers,/raid/hpcserve-cache:/raid/hpcserve-cache \
  --container-workdir=/jobs/kimi-k2-thinking-ktransformers \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES,HPCSERVE_API_KEY \
  bash /jobs/kimi-k2-thinking-ktransformers/launch/container-task.sh router bash /jobs/kimi-k2-thinking-ktransformers/launch/router.sh
