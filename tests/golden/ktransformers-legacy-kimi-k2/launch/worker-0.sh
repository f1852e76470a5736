#!/bin/bash
# worker-0: KTransformers 0.4.1 plain instance 0, 8 GPU(s), 104 CPU expert threads (component 0 nodes 0)
# Runs once on each of the instance's 1 node(s), inside the container. The node rank and the
# addresses are looked up in the task from this node's own name (SLURMD_NODENAME) in
# run/worker-0.nodes, which hpcserve_runtime writes after address discovery.
set -euo pipefail
JOB_DIR=/jobs/ktransformers-legacy-kimi-k2
NODES_FILE="$JOB_DIR/run/worker-0.nodes"
me="${SLURMD_NODENAME:?SLURMD_NODENAME is not set: run this through srun}"
# columns: node-rank  node-name  address  interface  ib-devices
read -r NODE_RANK _ NODE_IP NODE_IFACE IB_DEVICES < <(awk -v me="$me" '$2 == me' "$NODES_FILE") || true
if [ -z "${NODE_RANK:-}" ]; then
  echo "hpcserve: node $me is not one of worker-0's nodes ($NODES_FILE)" >&2
  exit 3
fi
read -r _ _ LEADER_IP _ < <(awk '$1 == 0' "$NODES_FILE")
[ "$IB_DEVICES" = "-" ] && IB_DEVICES=""
IB_PORTS="${IB_DEVICES:+${IB_DEVICES//,/:1,}:1}"  # mlx5_0,mlx5_1 -> mlx5_0:1,mlx5_1:1 (UCX form)
# A restart of the instance (hpcserve_runtime replaces a failed one) is attempt 1, 2...: its logs
# carry ".attemptN" in their names, beside the earlier attempts' (empty for the first start).
ATTEMPT_TAG="${HPCSERVE_ATTEMPT_TAG:-}"
exec >"$JOB_DIR/logs/worker-0${ATTEMPT_TAG}.node${NODE_RANK}.${me}.log" 2>&1
echo "hpcserve: worker-0 node-rank $NODE_RANK on $me ($NODE_IP), leader $LEADER_IP"

export PYTHONUNBUFFERED=1
export GLOO_SOCKET_IFNAME=ib0
export NCCL_SOCKET_IFNAME=ib0
export NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
export UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1
export HOME="${JOB_DIR}"/run/ktransformers-home/"${SLURMD_NODENAME}"
export NCCL_IB_GID_INDEX=3
export NCCL_CROSS_NIC=0
export UCX_TLS=rc,ud,sm,cuda_copy,cuda_ipc,gdr_copy,tcp

if [ "$NODE_RANK" = 0 ]; then
  # Where the instance serves, another deployment sharing the node could hold its ports and
  # answer for it: hpcserve_runtime/ownport.py records whose process listens on them (this script's
  # PID is the engine's after exec), and the instance counts as ready only when it is its own.
  mkdir -p -- "$JOB_DIR/run/ports"
  (exec python3 -S -I "$JOB_DIR/hpcserve_runtime/ownport.py" $$ 10002 \
    "$JOB_DIR/run/ports/worker-0" 5460 </dev/null &)
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
  python3 -m ktransformers.server.main \
  --host "${NODE_IP}" \
  --port 10002 \
  --model_path /lustre/models/Kimi-K2-Instruct-GGUF \
  --model_name kimi-k2 \
  --gguf_path /lustre/models/Kimi-K2-Instruct-GGUF \
  --optimize_config_path /workspace/ktransformers/ktransformers/optimize/optimize_rules/DeepSeek-V3-Chat-serve.yaml \
  --backend_type balance_serve \
  --cache_lens 30000 \
  --max_new_tokens 1024 \
  --max_batch_size 4 \
  --chunk_size 256 \
  --cpu_infer 104
