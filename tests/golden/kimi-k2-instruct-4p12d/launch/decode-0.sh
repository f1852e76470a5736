#!/bin/bash
# decode-0: SGLang 0.5.23 decode instance 0, TP 96, DP-attention 96, EP 96 (component 1 nodes 0-11)
# Runs once on each of the instance's 12 node(s), inside the container. The node rank and the
# addresses are looked up in the task from this node's own name (SLURMD_NODENAME) in
# run/decode-0.nodes, which hpcserve_runtime writes after address discovery.
set -euo pipefail
JOB_DIR=/jobs/kimi-k2-instruct-4p12d
NODES_FILE="$JOB_DIR/run/decode-0.nodes"
me="${SLURMD_NODENAME:?SLURMD_NODENAME is not set: run this through srun}"
# columns: node-rank  node-name  address  interface  ib-devices
read -r NODE_RANK _ NODE_IP NODE_IFACE IB_DEVICES < <(awk -v me="$me" '$2 == me' "$NODES_FILE") || true
if [ -z "${NODE_RANK:-}" ]; then
  echo "hpcserve: node $me is not one of decode-0's nodes ($NODES_FILE)" >&2
  exit 3
fi
read -r _ _ LEADER_IP _ < <(awk '$1 == 0' "$NODES_FILE")
[ "$IB_DEVICES" = "-" ] && IB_DEVICES=""
IB_PORTS="${IB_DEVICES:+${IB_DEVICES//,/:1,}:1}"  # mlx5_0,mlx5_1 -> mlx5_0:1,mlx5_1:1 (UCX form)
# A restart of the instance (hpcserve_runtime replaces a failed one) is attempt 1, 2...: its logs
# carry ".attemptN" in their names, beside the earlier attempts' (empty for the first start).
ATTEMPT_TAG="${HPCSERVE_ATTEMPT_TAG:-}"
exec >"$JOB_DIR/logs/decode-0${ATTEMPT_TAG}.node${NODE_RANK}.${me}.log" 2>&1
echo "hpcserve: decode-0 node-rank $NODE_RANK on $me ($NODE_IP), leader $LEADER_IP"

export PYTHONUNBUFFERED=1
export GLOO_SOCKET_IFNAME=ib0
export NCCL_SOCKET_IFNAME=ib0
export NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
export UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1
export SGLANG_CACHE_DIR=/raid/hpcserve-cache/alice/Kimi-K2-Instruct/sglang-0.5.23/H200/sglang
export TRITON_CACHE_DIR=/raid/hpcserve-cache/alice/Kimi-K2-Instruct/sglang-0.5.23/H200/triton
export SGLANG_DG_CACHE_DIR=/raid/hpcserve-cache/alice/Kimi-K2-Instruct/sglang-0.5.23/H200/deep_gemm
export FLASHINFER_WORKSPACE_BASE=/raid/hpcserve-cache/alice/Kimi-K2-Instruct/sglang-0.5.23/H200/flashinfer
export NCCL_IB_GID_INDEX=3
export NCCL_CROSS_NIC=0
export UCX_TLS=rc,ud,sm,cuda_copy,cuda_ipc,gdr_copy,tcp
export MC_TE_METRIC=true
export SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=10000000
export SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000
export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000
export SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=480
export SGLANG_HOST_IP="${NODE_IP}"
export HPCSERVE_SECRET_ARGS='--api-key HPCSERVE_API_KEY'

# Compile and JIT caches kept between jobs (site.paths.cache_dir, node-local): a cache is
# warm when the directory its variable names (its probe part, where only compiled artifacts go)
# holds a file as the engine starts. Said in this log and in run/caches/, which hpcserve_runtime
# puts in state.json.
#
# The caches hold code the engine runs (compiled kernels): only this user's own directory,
# <cache_dir>/<user>, is used. <cache_dir> is made like /tmp (anyone may add a directory, none
# may remove another's), <user> 0700; one another user owns, a link, or one others may write
# is refused, naming its owner, before the engine starts.
cache_root=/raid/hpcserve-cache/alice
if [ ! -e "$cache_root" ] && [ ! -L "$cache_root" ]; then
  [ -d "${cache_root%/*}" ] ||
    { mkdir -p -- "${cache_root%/*/*}" && mkdir -m 1777 -- "${cache_root%/*}"; } 2>/dev/null || :
  mkdir -m 700 -- "$cache_root" 2>/dev/null || :
fi
if [ -L "$cache_root" ] || [ ! -d "$cache_root" ] || [ ! -O "$cache_root" ] ||
   [ $(( 0$(stat -c %a -- "$cache_root") & 022 )) != 0 ]; then
  echo "hpcserve: compile cache $cache_root refused (owner $(stat -c %U -- "$cache_root" 2>&1)," \
       "mode $(stat -c %a -- "$cache_root" 2>&1)): it must be a directory of yours, not a" \
       "link, that no one else may write (site.paths.cache_dir)" >&2
  exit 3
fi
cache_state() {  # NAME VAR DIR [PROBE]
  local state=cold
  if [ -n "$(find "$3${4:+/$4}" -type f -print -quit 2>/dev/null)" ]; then state=warm; fi
  mkdir -p -- "$3" 2>/dev/null || :
  echo "hpcserve: cache $1 ($2=$3) $state" >&2
  printf '%s %s %s\n' "$1" "$state" "$3"
}
CACHE_REPORT="$JOB_DIR/run/caches/decode-0${ATTEMPT_TAG}.$me"
mkdir -p -- "$JOB_DIR/run/caches"
{
  cache_state sglang SGLANG_CACHE_DIR "${SGLANG_CACHE_DIR:-}"
  cache_state triton TRITON_CACHE_DIR "${TRITON_CACHE_DIR:-}"
  cache_state deep_gemm SGLANG_DG_CACHE_DIR "${SGLANG_DG_CACHE_DIR:-}"
  cache_state flashinfer FLASHINFER_WORKSPACE_BASE "${FLASHINFER_WORKSPACE_BASE:-}"
} >"$CACHE_REPORT.$$" && mv -f -- "$CACHE_REPORT.$$" "$CACHE_REPORT" || rm -f -- "$CACHE_REPORT.$$"

if [ "$NODE_RANK" = 0 ]; then
  # Where the instance serves, another deployment sharing the node could hold its ports and
  # answer for it: hpcserve_runtime/ownport.py records whose process listens on them (this script's
  # PID is the engine's after exec), and the instance counts as ready only when it is its own.
  mkdir -p -- "$JOB_DIR/run/ports"
  (exec python3 -S -I "$JOB_DIR/hpcserve_runtime/ownport.py" $$ 30000,5757 \
    "$JOB_DIR/run/ports/decode-0" 5460 </dev/null &)
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
  python3 "${JOB_DIR}"/hpcserve_runtime/secret_argv.py -m sglang.launch_server \
  --model-path /lustre/models/Kimi-K2-Instruct \
  --served-model-name kimi-k2 \
  --host "${NODE_IP}" \
  --port 30000 \
  --enable-metrics \
  --disaggregation-mode decode \
  --disaggregation-ib-device mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 \
  --dist-init-addr "${LEADER_IP}":5757 \
  --nnodes 12 \
  --node-rank "${NODE_RANK}" \
  --tp-size 96 \
  --attn-dp-size 96 \
  --moe-a2a-backend deepep \
  --deepep-mode low_latency \
  --ep-num-redundant-experts 96 \
  --cuda-graph-bs-decode 480 \
  --mem-fraction-static 0.8 \
  --max-running-requests 46080 \
  --context-length 2176 \
  --tool-call-parser kimi_k2 \
  --trust-remote-code \
  --disable-radix-cache \
  --decode-log-interval 1 \
  --moe-dense-tp-size 1 \
  --enable-dp-lm-head \
  --disable-shared-experts-fusion \
  --watchdog-timeout 1000000 \
  --enable-two-batch-overlap
