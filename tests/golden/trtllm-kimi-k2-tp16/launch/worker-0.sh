#!/bin/bash
# worker-0: TensorRT-LLM 1.3.0rc3 plain instance 0, TP 16, EP 8, attention-DP 16 (component 0 nodes 0-1)
# Runs as 8 tasks on each of the instance's 2 node(s), one per GPU under srun --mpi=pmix
# (MPI ranks, each with its own log), inside the container. The node rank and the
# addresses are looked up in the task from this node's own name (SLURMD_NODENAME) in
# run/worker-0.nodes, which hpcserve_runtime writes after address discovery.
set -euo pipefail
JOB_DIR=/jobs/trtllm-kimi-k2-tp16
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
exec >"$JOB_DIR/logs/worker-0${ATTEMPT_TAG}.node${NODE_RANK}.${me}.task${SLURM_LOCALID:?}.log" 2>&1
echo "hpcserve: worker-0 node-rank $NODE_RANK task ${SLURM_LOCALID} (rank ${SLURM_PROCID:?}) on $me ($NODE_IP), leader $LEADER_IP"

export PYTHONUNBUFFERED=1
export GLOO_SOCKET_IFNAME=ib0
export NCCL_SOCKET_IFNAME=ib0
export NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
export UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1
export NCCL_IB_GID_INDEX=3
export NCCL_CROSS_NIC=0
export UCX_TLS=rc,ud,sm,cuda_copy,cuda_ipc,gdr_copy,tcp

if [ "$NODE_RANK" = 0 ] && [ "${SLURM_LOCALID}" = 0 ]; then
  # Where the instance serves, another deployment sharing the node could hold its ports and
  # answer for it: hpcserve_runtime/ownport.py records whose process listens on them (this script's
  # PID is the engine's after exec), and the instance counts as ready only when it is its own.
  mkdir -p -- "$JOB_DIR/run/ports"
  (exec python3 -S -I "$JOB_DIR/hpcserve_runtime/ownport.py" $$ 8200 \
    "$JOB_DIR/run/ports/worker-0" 5460 </dev/null &)
fi

exec \
  trtllm-llmapi-launch trtllm-serve \
  serve /lustre/models/Kimi-K2-Instruct \
  --host "${NODE_IP}" \
  --port 8200 \
  --backend pytorch \
  --tp_size 16 \
  --ep_size 8 \
  --kv_cache_free_gpu_memory_fraction 0.95 \
  --trust_remote_code \
  --max_batch_size 128 \
  --max_num_tokens 4096 \
  --tool_parser kimi_k2 \
  --extra_llm_api_options "${JOB_DIR}"/llm-api/worker.yaml
