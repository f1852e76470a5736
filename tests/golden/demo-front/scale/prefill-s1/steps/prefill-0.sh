#!/bin/bash
# prefill-0: simulated SGLang 0.5.23 prefill instance 0, TP 16, DP-attention 16, EP 16 (component 0 nodes 0-1)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --nodes=2 \
  --ntasks=2 \
  --ntasks-per-node=1 \
  --nodelist="${NODELIST}" \
  --overlap \
  --wait=5 \
  --job-name=prefill-0"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  bash /jobs/demo-front/scale/prefill-s1/launch/prefill-0.sh
