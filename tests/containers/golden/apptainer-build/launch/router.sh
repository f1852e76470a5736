#!/bin/bash
# router: sglang-router in PD mode in front of 1 prefill and 1 decode instance(s).
# Runs as one task; hpcserve_runtime starts it once every instance answers /health, and writes
# run/endpoints.env with each instance's node-rank-0 address.
set -euo pipefail
JOB_DIR=/shared/hpcserve-jobs/demo-golden
source "$JOB_DIR/run/endpoints.env"
exec >"$JOB_DIR/logs/router.log" 2>&1

export PYTHONUNBUFFERED=1
export HPCSERVE_SECRET_ARGS='--api-key HPCSERVE_API_KEY'

# Another deployment's router on this node could answer for this one: hpcserve_ownport.py
# records whose process listens on the router's ports (this script's PID is the router's after
# exec).
mkdir -p -- "$JOB_DIR/run/ports"
(exec python3 -S -I "$JOB_DIR/hpcserve_runtime/ownport.py" $$ 8000,29000 "$JOB_DIR/run/ports/router" \
  120 </dev/null &)

exec \
  python3 "${JOB_DIR}"/hpcserve_runtime/secret_argv.py -m sglang_router.launch_router \
  --pd-disaggregation \
  --prefill http://"${PREFILL_0_IP}":30000 8998 \
  --decode http://"${DECODE_0_IP}":30000 \
  --host "${ROUTER_IP}" \
  --port 8000 \
  --policy round_robin \
  --prometheus-host "${ROUTER_IP}" \
  --prometheus-port 29000
