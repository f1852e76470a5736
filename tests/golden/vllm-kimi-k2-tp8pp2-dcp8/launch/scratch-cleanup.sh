#!/bin/bash
# Removes this job's private temporary directories on the node it runs on: hpcserve_job.py runs
# it on every node of the job (one srun per component) after the job's steps ended.
set -uo pipefail
me="${SLURMD_NODENAME:?run this through srun}"
rm -rf -- "${TMPDIR:-/tmp}/hpcserve-9275f374a1f5"
rm -f -- /jobs/vllm-kimi-k2-tp8pp2-dcp8/run/scratch/*."$me"
