#!/bin/bash
# router: trtllm-serve disaggregated on node 0 of component 0
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
  --container-image=/jobs/.hpcserve-images/alice/nvcr.io+nvidia+tensorrt-llm+release+1.3.0rc3.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/trtllm-kimi-k2-disagg:/jobs/trtllm-kimi-k2-disagg \
  --container-workdir=/jobs/trtllm-kimi-k2-disagg \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES \
  bash /jobs/trtllm-kimi-k2-disagg/launch/container-task.sh router bash /jobs/trtllm-kimi-k2-disagg/launch/router.sh
