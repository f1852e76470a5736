#!/bin/bash
# Removes this job's private temporary directories on the node it runs on: hpcserve_runtime runs
# it on every node of the job (one srun per component) after the job's steps ended.
set -uo pipefail
me="${SLURMD_NODENAME:?run this through srun}"
# SLURM_JOB_ID is the het-job component's own id in its steps, this one's as the engines'.
rm -rf -- "${TMPDIR:-/tmp}/hpcserve-job${SLURM_JOB_ID:?}"
rm -f -- /jobs/vllm-cpu-pd/run/scratch/*."$me"
# Shared memory segments an engine left in /dev/shm (a crashed worker never unlinks its own):
# this user's, made after the engine started on this node, and held open or mapped by no
# process.
for before in /jobs/vllm-cpu-pd/run/shm/*."$me"; do
  [ -f "$before" ] || continue
  for f in /dev/shm/*; do
    [ -f "$f" ] && [ -O "$f" ] || continue
    grep -qxF -- "${f##*/}" "$before" && continue
    [ -n "$(find /proc/[0-9]*/fd -maxdepth 1 -lname "$f" -print -quit 2>/dev/null)" ] && continue
    grep -qsF -- "$f" /proc/[0-9]*/maps && continue
    rm -f -- "$f"
  done
  rm -f -- "$before"
done
