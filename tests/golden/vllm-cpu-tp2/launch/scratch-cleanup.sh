#!/bin/bash
# Removes this job's private temporary directories on the node it runs on: hpcserve_job.py runs
# it on every node of the job (one srun per component) after the job's steps ended.
set -uo pipefail
me="${SLURMD_NODENAME:?run this through srun}"
# SLURM_JOB_ID is the het-job component's own id in its steps, this one's as the engines'.
rm -rf -- "${TMPDIR:-/tmp}/hpcserve-job${SLURM_JOB_ID:?}"
rm -f -- /jobs/vllm-cpu-tp2/run/scratch/*."$me"
