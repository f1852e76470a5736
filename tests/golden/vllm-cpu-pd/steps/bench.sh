#!/bin/bash
# benchmark: vLLM bench serve on node 0 of component 0
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --het-group=0 \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --nodelist="${NODELIST}" \
  --overlap \
  --job-name=bench \
  --kill-on-bad-exit=1 \
  bash /jobs/vllm-cpu-pd/launch/bench.sh
