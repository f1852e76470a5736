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
  --container-image=/jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/kimi-k2-instruct-tp16:/jobs/kimi-k2-instruct-tp16,/raid/hpcserve-cache:/raid/hpcserve-cache \
  --container-workdir=/jobs/kimi-k2-instruct-tp16 \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES,HPCSERVE_API_KEY \
  bash /jobs/kimi-k2-instruct-tp16/launch/container-task.sh router bash /jobs/kimi-k2-instruct-tp16/launch/router.sh
