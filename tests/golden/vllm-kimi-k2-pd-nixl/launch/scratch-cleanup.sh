#!/bin/bash
# Removes this job's private temporary directories on the node it runs on: hpcserve_runtime runs
# it on every node of the job (one srun per component) after the job's steps ended.
set -uo pipefail
me="${SLURMD_NODENAME:?run this through srun}"
# The directories the launch scripts made here (each attempt its own), as they recorded them:
# only one of this user's own, no link, of the name they give (never a path guessed from the
# job id, which another user could have made).
for rec in /jobs/vllm-kimi-k2-pd-nixl/run/scratch/*."$me"; do
  [ -f "$rec" ] || continue
  while IFS= read -r d; do
    case "${d##*/}" in hpcserve-job[0-9]*-*) ;; *) continue ;; esac
    if [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ]; then rm -rf -- "$d"; fi
  done <"$rec"
  rm -f -- "$rec"
done
# Shared memory segments an engine left in /dev/shm (a crashed worker never unlinks its own):
# this user's, made after the engine started on this node, and held open or mapped by no
# process.
for before in /jobs/vllm-kimi-k2-pd-nixl/run/shm/*."$me"; do
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
