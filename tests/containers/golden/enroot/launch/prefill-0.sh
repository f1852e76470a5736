#!/bin/bash
# prefill-0: simulated SGLang 0.5.23 prefill instance 0, TP 8, DP-attention 8, EP 8 (component 0 nodes 0)
# Runs once on each of the instance's 1 node(s), inside the container. The node rank and the
# addresses are looked up in the task from this node's own name (SLURMD_NODENAME) in
# run/prefill-0.nodes, which hpcserve_runtime writes after address discovery.
set -euo pipefail
JOB_DIR=/shared/hpcserve-jobs/demo-golden
NODES_FILE="$JOB_DIR/run/prefill-0.nodes"
me="${SLURMD_NODENAME:?SLURMD_NODENAME is not set: run this through srun}"
# columns: node-rank  node-name  address  interface  ib-devices
read -r NODE_RANK _ NODE_IP NODE_IFACE IB_DEVICES < <(awk -v me="$me" '$2 == me' "$NODES_FILE") || true
if [ -z "${NODE_RANK:-}" ]; then
  echo "hpcserve: node $me is not one of prefill-0's nodes ($NODES_FILE)" >&2
  exit 3
fi
read -r _ _ LEADER_IP _ < <(awk '$1 == 0' "$NODES_FILE")
[ "$IB_DEVICES" = "-" ] && IB_DEVICES=""
IB_PORTS="${IB_DEVICES:+${IB_DEVICES//,/:1,}:1}"  # mlx5_0,mlx5_1 -> mlx5_0:1,mlx5_1:1 (UCX form)
# A restart of the instance (hpcserve_runtime replaces a failed one) is attempt 1, 2...: its logs
# carry ".attemptN" in their names, beside the earlier attempts' (empty for the first start).
ATTEMPT_TAG="${HPCSERVE_ATTEMPT_TAG:-}"
exec >"$JOB_DIR/logs/prefill-0${ATTEMPT_TAG}.node${NODE_RANK}.${me}.log" 2>&1
echo "hpcserve: prefill-0 node-rank $NODE_RANK on $me ($NODE_IP), leader $LEADER_IP"

export PYTHONUNBUFFERED=1
export GLOO_SOCKET_IFNAME=eth0
export NCCL_SOCKET_IFNAME=eth0
export NCCL_IB_HCA=mlx5_0,mlx5_1
export UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1
export SGLANG_HOST_IP="${NODE_IP}"
export HPCSERVE_SIM_STARTUP_DELAY=1.0
export HPCSERVE_SIM_PREFILL_S_PER_TOKEN=0.0
export HPCSERVE_SIM_DECODE_S_PER_TOKEN=0.01
export HPCSERVE_SIM_INIT_TIMEOUT=60
export HPCSERVE_SIM_VERSION=0.5.23
export HPCSERVE_SECRET_ARGS='--api-key HPCSERVE_API_KEY'

if [ "$NODE_RANK" = 0 ]; then
  # Where the instance serves, another deployment sharing the node could hold its ports and
  # answer for it: hpcserve_runtime/ownport.py records whose process listens on them (this script's
  # PID is the engine's after exec), and the instance counts as ready only when it is its own.
  mkdir -p -- "$JOB_DIR/run/ports"
  (exec python3 -S -I "$JOB_DIR/hpcserve_runtime/ownport.py" $$ 30000,8998,5757 \
    "$JOB_DIR/run/ports/prefill-0" 180 </dev/null &)
fi

# Where Slurm tracks a step's processes by parentage (proctrack/linuxproc), the engine's own
# children (vLLM's engine core and workers) outlive a killed engine, holding the node's GPUs and
# ports against the instance's next attempt. Slurm makes the first task on a node the leader of
# the tasks' process group: once the engine (this PID, after exec) is gone, what is left of the
# group goes with it.
read -r _ _ _ _ TASK_PGID _ </proc/$$/stat
if [ "$TASK_PGID" = "$$" ]; then
  (trap '' TERM INT HUP; while kill -0 $$ 2>/dev/null; do sleep 1; done
   kill -KILL -- "-$$" 2>/dev/null) </dev/null >/dev/null 2>&1 &
fi

exec \
  python3 "${JOB_DIR}"/hpcserve_runtime/secret_argv.py /shared/hpcserve-jobs/demo-golden/hpcserve_sim.py \
  --model-path /models/Kimi-K2-Instruct \
  --served-model-name kimi-k2 \
  --host "${NODE_IP}" \
  --port 30000 \
  --enable-metrics \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-ib-device mlx5_0,mlx5_1 \
  --tp-size 8 \
  --attn-dp-size 8 \
  --moe-a2a-backend deepep \
  --deepep-mode normal \
  --tool-call-parser kimi_k2 \
  --trust-remote-code \
  --disable-radix-cache
