#!/bin/bash
# address discovery on every node of component 0 (worker): one task per node prints its name, address, interface and IB devices
# Started by hpcserve_job.py.
set -euo pipefail
exec srun \
  --nodes=2 \
  --ntasks=2 \
  --ntasks-per-node=1 \
  --overlap \
  --job-name=discover-worker \
  --kill-on-bad-exit=1 \
  python3 /jobs/vllm-cpu-tp2/hpcserve_job.py discover --iface eth0 --ib none
