#!/bin/bash
# worker-0: KTransformers 0.2.1.post1 plain instance 0, 8 GPU(s), 104 CPU expert threads (component 0 nodes 0)
# Started by hpcserve_runtime with NODELIST set to this step's nodes.
set -euo pipefail
exec srun \
  --nodes=1 \
  --ntasks=1 \
  --ntasks-per-node=1 \
  --cpus-per-task=224 \
  --nodelist="${NODELIST}" \
  --overlap \
  --job-name=worker-0"${HPCSERVE_ATTEMPT_TAG:-}" \
  --kill-on-bad-exit=1 \
  --container-image=/lustre/images/ktransformers-0.2.1.post1.sqsh \
  --container-mounts=/lustre:/lustre,/jobs/ktransformers-legacy-deepseek-v3:/jobs/ktransformers-legacy-deepseek-v3 \
  --container-workdir=/jobs/ktransformers-legacy-deepseek-v3 \
  --no-container-mount-home \
  --container-writable \
  --container-env=NCCL_IB_HCA,NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,UCX_NET_DEVICES \
  bash /jobs/ktransformers-legacy-deepseek-v3/launch/container-task.sh worker-0 bash /jobs/ktransformers-legacy-deepseek-v3/launch/worker-0.sh
