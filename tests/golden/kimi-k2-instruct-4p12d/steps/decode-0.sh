#!/bin/bash
# decode-0: SGLang 0.5.23 decode instance 0, TP 96, DP-attention 96, EP 96 (component 1 nodes 0-11)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --het-group=1 \
  --nodes=12 \
  --ntasks=12 \
  --ntasks-per-node=1 \
  --nodelist="${NODELIST}" \
  --overlap \
  --wait=5 \
  --job-name=decode-0"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  --container-image=/jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/kimi-k2-instruct-4p12d:/jobs/kimi-k2-instruct-4p12d,/raid/hpcserve-cache:/raid/hpcserve-cache \
  --container-workdir=/jobs/kimi-k2-instruct-4p12d \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES,HPCSERVE_API_KEY \
  bash /jobs/kimi-k2-instruct-4p12d/launch/container-task.sh decode-0 bash /jobs/kimi-k2-instruct-4p12d/launch/decode-0.sh
