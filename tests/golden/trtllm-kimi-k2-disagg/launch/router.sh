#!/bin/bash
# router: trtllm-serve disaggregated in PD mode in front of 1 prefill and 1 decode instance(s).
# Runs as one task; hpcserve_runtime starts it once every instance answers /health, and writes
# run/endpoints.env with each instance's node-rank-0 address.
set -euo pipefail
JOB_DIR=/jobs/trtllm-kimi-k2-disagg
source "$JOB_DIR/run/endpoints.env"
exec >"$JOB_DIR/logs/router.log" 2>&1

export PYTHONUNBUFFERED=1

# run/disagg.yaml: the router's configuration, with the workers' addresses from endpoints.env
printf '%s\n' \
  'hostname: '"${ROUTER_IP}" \
  'port: 8000' \
  context_servers: \
  '  num_instances: 1' \
  '  urls:' \
  '  - "'"${PREFILL_0_IP}":8200'"' \
  generation_servers: \
  '  num_instances: 1' \
  '  urls:' \
  '  - "'"${DECODE_0_IP}":8200'"' \
  >"$JOB_DIR/run/disagg.yaml"

# Another deployment's router on this node could answer for this one: hpcserve_ownport.py
# records whose process listens on the router's ports (this script's PID is the router's after
# exec).
mkdir -p -- "$JOB_DIR/run/ports"
(exec python3 -S -I "$JOB_DIR/hpcserve_runtime/ownport.py" $$ 8000,29000 "$JOB_DIR/run/ports/router" \
  660 </dev/null &)

exec \
  trtllm-serve disaggregated \
  -c "${JOB_DIR}"/run/disagg.yaml -t 5400
