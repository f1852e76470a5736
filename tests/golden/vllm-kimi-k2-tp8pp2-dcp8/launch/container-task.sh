#!/bin/bash
# The task of every engine and router step: `container-task.sh TASK COMMAND...`, where TASK is the
# instance name (or "router") and COMMAND runs its launch script.
# Runs inside the container pyxis made for this task from the step's --container-* flags, from
#   /jobs/.hpcserve-images/alice/vllm+vllm-openai+v0.33.0.sqsh
# (hpcserve_runtime imported a registry image there once for every node); pyxis removes the
# container after the task, as it is unnamed.
set -uo pipefail
task=${1:?usage: container-task.sh TASK COMMAND...}
shift
node=${SLURMD_NODENAME:-$(hostname)}

# RDMA (NCCL over InfiniBand, Mooncake, NVSHMEM) pins memory up to RLIMIT_MEMLOCK. Slurm's default
# PropagateResourceLimits=ALL gives the task the submitting shell's soft limit (often 64 KiB on a
# login node) below slurmd's hard limit (normally unlimited). Raising the soft limit to the hard one
# needs no privilege and never lowers anything; `srun --propagate=MEMLOCK` could only copy a limit
# that is the same or lower, and `ulimit -l unlimited` fails wherever the hard limit is finite.
ulimit -S -l "$(ulimit -H -l)" 2>/dev/null || true
if [ "$(ulimit -S -l)" != unlimited ]; then
  echo "hpcserve: warning: $task on $node: the locked-memory limit is $(ulimit -S -l) KiB;" \
       "RDMA registration may fail (slurmd needs LimitMEMLOCK=infinity)" >&2
fi

exec "$@"
