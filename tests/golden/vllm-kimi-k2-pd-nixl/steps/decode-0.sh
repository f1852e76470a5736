#!/bin/bash
# decode-0: vLLM 0.33.0 decode instance 0, TP 1, DP 16, EP 16 (component 1 nodes 0-1)
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
  --container-image=/jobs/.hpcserve-images/alice/vllm+vllm-openai+v0.33.0.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/vllm-kimi-k2-pd-nixl:/jobs/vllm-kimi-k2-pd-nixl,/raid/hpcserve-cache:/raid/hpcserve-cache \
  --container-workdir=/jobs/vllm-kimi-k2-pd-nixl \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES,HPCSERVE_API_KEY \
  bash /jobs/vllm-kimi-k2-pd-nixl/launch/container-task.sh decode-0 bash /jobs/vllm-kimi-k2-pd-nixl/launch/decode-0.sh
