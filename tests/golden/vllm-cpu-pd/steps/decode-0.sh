#!/bin/bash
# decode-0: vLLM 0.32.0 decode instance 0, TP 1 (component 1 nodes 0)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --het-group=1 \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --nodelist="${NODELIST}" \
  --overlap \
  --job-name=decode-0"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  bash /jobs/vllm-cpu-pd/launch/decode-0.sh
