#!/bin/bash
# The task of every engine and router step: `container-task.sh TASK COMMAND...`, where TASK is the
# instance name (or "router") and COMMAND runs its launch script.
# Runs on the host and execs COMMAND in `apptainer exec` of /shared/hpcserve-jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sif.
# (hpcserve_runtime built it from docker://lmsysorg/sglang:v0.5.23 once for every node, before any step.)
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

# The host environment passes into the container (no --cleanenv): the launch script needs
# SLURMD_NODENAME, and it exports the engine's own variables inside anyway. For a name the image
# also defines the image's value wins; APPTAINERENV_<NAME> forces the host value instead.
for v in HPCSERVE_API_KEY; do
  if [ -n "${!v+x}" ]; then export "APPTAINERENV_$v=${!v}"; fi
done
# --pwd: the spelling every Apptainer release accepts (1.5 documents it as --cwd)
exec apptainer exec --nv \
  --bind /shared/hpcserve-jobs/demo-golden:/shared/hpcserve-jobs/demo-golden \
  --bind /models/Kimi-K2-Instruct:/models/Kimi-K2-Instruct:ro \
  --pwd /shared/hpcserve-jobs/demo-golden \
  /shared/hpcserve-jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sif \
  "$@"
