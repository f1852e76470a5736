#!/bin/bash
# worker-0: vLLM 0.32.0 plain instance 0, TP 2 (component 0 nodes 0-1)
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
  bash /jobs/vllm-cpu-tp2/launch/worker-0.sh
