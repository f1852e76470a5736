#!/bin/bash
# Run on every node by steps/discover-*.sh: the node's address, interface and IB devices,
# after its preflight checks (hpcserve_runtime/preflight.py). hpcserve_runtime needs Python 3.7 or
# later: a node whose python is older says so as its preflight report (check "python"), so that
# the job names the node instead of failing on a SyntaxError.
py=python3
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 7))' 2>/dev/null; then
  v="$("$py" -V 2>&1 | head -n 1 | tr -cd 'A-Za-z0-9 ._+-')"
  n="${SLURM_NODEID:-0}"
  echo "{\"node\": \"${SLURMD_NODENAME:-$(hostname)}\", \"component\": $1, \"nodeid\": $n," \
       "\"checks\": {\"python\": [\"fail\", \"${v:-no python}: hpcserve_runtime needs" \
       "Python 3.7 or later (site.paths.python)\"]}}" >/jobs/ktransformers-legacy-deepseek-v3/run/preflight/c$1-n$n.json
  exit 0
fi
cd /jobs/ktransformers-legacy-deepseek-v3  # python3 -m finds hpcserve_runtime/ here
exec "$py" -m hpcserve_runtime discover --component "$1" --iface ib0 \
  --ib mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 --preflight /jobs/ktransformers-legacy-deepseek-v3
