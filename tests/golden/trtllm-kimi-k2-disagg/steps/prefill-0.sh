#!/bin/bash
# prefill-0: TensorRT-LLM 1.3.0rc3 prefill instance 0, TP 8, EP 8, attention-DP 8 (component 0 nodes 0)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --het-group=0 \
  --nodes=1 \
  --ntasks=8 \
  --ntasks-per-node=8 \
  --mpi=pmix \
  --nodelist="${NODELIST}" \
  --overlap \
  --wait=5 \
  --job-name=prefill-0"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  --container-image=/jobs/.hpcserve-images/alice/nvcr.io+nvidia+tensorrt-llm+release+1.3.0rc3.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/trtllm-kimi-k2-disagg:/jobs/trtllm-kimi-k2-disagg \
  --container-workdir=/jobs/trtllm-kimi-k2-disagg \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES \
  bash /jobs/trtllm-kimi-k2-disagg/launch/container-task.sh prefill-0 bash /jobs/trtllm-kimi-k2-disagg/launch/prefill-0.sh
