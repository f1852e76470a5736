#!/bin/bash
# The task of every engine and router step: `container-task.sh TASK COMMAND...`, where TASK is the
# instance name (or "router") and COMMAND runs its launch script.
# Runs on the host: creates one enroot container for this task from the image
#   /lustre/images/sglang-0.5.23.sqsh
# starts COMMAND in it and removes the container when the task ends, also after TERM/INT/HUP
# (the engine is stopped first). Only a SIGKILL of the task can leave it behind; then
# `container-task.sh --cleanup`, run on that node, removes this job's leftovers there.
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

image=/lustre/images/sglang-0.5.23.sqsh
# One file per container this job made and has not removed yet, so that `container-task.sh
# --cleanup` run on a node after the job's steps finds what a SIGKILL left behind (srun's
# --kill-on-bad-exit SIGKILLs the other nodes' tasks of an instance whose engine failed).
made=/shared/hpcserve-jobs/demo-golden/run/containers
exists() {
  # not grep -q: under pipefail, enroot list dying of SIGPIPE would make the answer "no"
  enroot list 2>/dev/null | grep -xF -- "$1" >/dev/null
}
remove_container() {
  # ignores signals so that the removal always completes
  (trap '' TERM INT HUP; exec enroot remove --force "$1") && rm -f -- "$made/$1"
}
if [ "$task" = --cleanup ]; then
  rc=0
  for f in "$made"/*-"$node"; do
    [ -e "$f" ] || continue
    n=${f##*/}
    if exists "$n"; then
      remove_container "$n" && echo "hpcserve: removed leftover container $n on $node" >&2 || rc=1
    else
      rm -f -- "$f"
    fi
  done
  exit "$rc"
fi
# unique per job, step, task, Slurm task on the node (MPI engines run one per GPU) and node;
# enroot only refuses "/" in names
name="hpcserve-${SLURM_JOB_ID:?run this through srun}.${SLURM_STEP_ID:?}-$task.${SLURM_LOCALID:-0}-$node"

# enroot start passes no host variable unless named with --env: name Slurm's (the launch script
# reads SLURMD_NODENAME; CUDA_VISIBLE_DEVICES holds the GPUs Slurm bound to the task) and the
# site's container.env list, only those that are set (--env NAME of an unset one sets it empty).
# Names go on the command line, values never do. (Under srun --mpi=pmix, enroot's own
# 50-slurm-pmi.sh hook brings the PMIx variables and the PMIx server's directory in.)
env_args=()
for v in $(compgen -e); do
  case $v in SLURM_* | SLURMD_* | CUDA_VISIBLE_DEVICES) env_args+=(--env "$v") ;; esac
done
for v in NCCL_DEBUG HPCSERVE_API_KEY; do
  if [ -n "${!v+x}" ]; then env_args+=(--env "$v"); fi
done

# Each phase runs as its own process group so that a signal reaches all of it; if the engine has
# not exited 1 s after a TERM, its group is killed so the container can still be
# removed before hpcserve_runtime's SIGKILL of the step.
child= caught= stopping= killer=
stop_child() {
  kill -TERM -- "-$child" 2>/dev/null
  (
    sleep 1 &
    trap 'kill $! 2>/dev/null; exit 0' TERM
    wait $!
    kill -KILL -- "-$child" 2>/dev/null
  ) </dev/null >/dev/null 2>&1 &
  killer=$!
}
on_signal() {
  caught=1
  [ -n "$stopping" ] && return
  stopping=$1
  echo "hpcserve: $task on $node: SIG$1, stopping" >&2
  if [ -n "$child" ]; then stop_child; fi
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP

run() {
  set -m
  "$@" &
  child=$!
  set +m
  # a signal that came while the phase was being started
  if [ -n "$stopping" ] && [ -z "$killer" ]; then stop_child; fi
  local r rc=
  while :; do
    caught=
    wait "$child"
    r=$?
    # 127 after an interrupted wait: the earlier wait already collected the exit status.
    if [ "$r" -eq 127 ] && [ -n "$rc" ]; then break; fi
    rc=$r
    [ -z "$caught" ] && break
  done
  child=
  if [ -n "$killer" ]; then kill "$killer" 2>/dev/null; killer=; fi
  return "$rc"
}

# A task that was asked to stop has succeeded once it stopped: a non-zero exit would make srun's
# --kill-on-bad-exit SIGKILL the tasks on the other nodes before they have removed their
# containers. Otherwise the exit code is the engine's (or the failed phase's).
finish() {
  if [ -n "$stopping" ]; then exit 0; fi
  exit "$1"
}

mkdir -p -- "$made" && : >"$made/$name"
run enroot create --name "$name" "$image"
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "hpcserve: $task on $node: enroot create of $image failed (exit $rc)" >&2
  # an interrupted extraction leaves a partial root file system behind
  if exists "$name"; then
    remove_container "$name" >/dev/null 2>&1
  else
    rm -f -- "$made/$name"
  fi
  finish "$rc"
fi
if [ -z "$stopping" ]; then
  echo "hpcserve: $task on $node: starting container $name" >&2
  # enroot start has no working-directory option: cd inside, as the other runtimes do.
  run enroot start --rw \
    --mount /shared/hpcserve-jobs/demo-golden:/shared/hpcserve-jobs/demo-golden:none:x-create=auto,rbind \
    --mount /models/Kimi-K2-Instruct:/models/Kimi-K2-Instruct:none:x-create=auto,rbind,ro \
    ${env_args[@]+"${env_args[@]}"} \
    "$name" \
    bash -c 'cd -- "$1" && shift && exec "$@"' hpcserve-task /shared/hpcserve-jobs/demo-golden "$@"
  rc=$?
else
  rc=0
fi
if remove_container "$name"; then
  echo "hpcserve: $task on $node: removed container $name; exit $rc" >&2
else
  echo "hpcserve: $task on $node: could not remove container $name; exit $rc" >&2
fi
finish "$rc"
