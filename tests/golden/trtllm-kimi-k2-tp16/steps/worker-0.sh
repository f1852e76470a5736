#!/bin/bash
# worker-0: TensorRT-LLM 1.3.0rc3 plain instance 0, TP 16, EP 8, attention-DP 16 (component 0 nodes 0-1)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --nodes=2 \
  --ntasks=16 \
  --ntasks-per-node=8 \
  --mpi=pmix \
  --nodelist="${NODELIST}" \
  --overlap \
  --wait=5 \
  --job-name=worker-0"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  --container-image=/jobs/.hpcserve-images/alice/nvcr.io+nvidia+tensorrt-llm+release+1.3.0rc3.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/trtllm-kimi-k2-tp16:/jobs/trtllm-kimi-k2-tp16 \
  --container-workdir=/jobs/trtllm-kimi-k2-tp16 \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES \
  bash /jobs/trtllm-kimi-k2-tp16/launch/container-task.sh worker-0 bash /jobs/trtllm-kimi-k2-tp16/launch/worker-0.sh
