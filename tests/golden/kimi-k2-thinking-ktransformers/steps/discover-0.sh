#!/bin/bash
# address discovery on every node of component 0 (worker): one task per node prints its name, address, interface and IB devices
# Started by hpcserve_job.py.
set -euo pipefail
exec srun \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --overlap \
  --job-name=discover-worker \
  --kill-on-bad-exit=1 \
  python3 /jobs/kimi-k2-thinking-ktransformers/hpcserve_job.py discover --iface ib0 --ib mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
