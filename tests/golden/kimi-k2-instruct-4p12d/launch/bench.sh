#!/bin/bash
# benchmark: SGLang bench_serving against sglang-router (the router), 3 point(s) of 2000
# input and 100 output tokens per request.
# Started by hpcserve_runtime once the deployment serves (SERVING_URL: run/endpoints.env).
# The gate reads each point's results (bench/POINT.json) and its client's exit
# (bench/POINT.run.json).
set -uo pipefail
JOB_DIR=/jobs/kimi-k2-instruct-4p12d
BENCH_DIR="$JOB_DIR"/bench
source "$JOB_DIR/run/endpoints.env"
mkdir -p -- "$BENCH_DIR"
exec >>"$BENCH_DIR/bench.log" 2>&1
echo "hpcserve-bench: Slurm job ${SLURM_JOB_ID:-none} step ${SLURM_STEP_ID:-none} on" \
  "${SLURMD_NODENAME:-$(hostname)}, against $SERVING_URL"

export PYTHONUNBUFFERED=1
export MC_TE_METRIC=true
export SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=10000000
export SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000
export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000
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

point c480 1800 \
  python3 -m sglang.bench_serving \
  --backend sglang-oai \
  --base-url "${SERVING_URL}" \
  --model kimi-k2 \
  --tokenizer /lustre/models/Kimi-K2-Instruct \
  --dataset-name random-ids \
  --random-input-len 2000 \
  --random-output-len 100 \
  --random-range-ratio 1.0 \
  --num-prompts 1920 \
  --max-concurrency 480 \
  --warmup-requests 32 \
  --output-file "${BENCH_DIR}"/c480.json \
  --output-details \
  --disable-tqdm \
  --seed 1 \
  || exit

point c1920 1800 \
  python3 -m sglang.bench_serving \
  --backend sglang-oai \
  --base-url "${SERVING_URL}" \
  --model kimi-k2 \
  --tokenizer /lustre/models/Kimi-K2-Instruct \
  --dataset-name random-ids \
  --random-input-len 2000 \
  --random-output-len 100 \
  --random-range-ratio 1.0 \
  --num-prompts 7680 \
  --max-concurrency 1920 \
  --warmup-requests 32 \
  --output-file "${BENCH_DIR}"/c1920.json \
  --output-details \
  --disable-tqdm \
  --seed 1 \
  || exit

point c3840 1800 \
  python3 -m sglang.bench_serving \
  --backend sglang-oai \
  --base-url "${SERVING_URL}" \
  --model kimi-k2 \
  --tokenizer /lustre/models/Kimi-K2-Instruct \
  --dataset-name random-ids \
  --random-input-len 2000 \
  --random-output-len 100 \
  --random-range-ratio 1.0 \
  --num-prompts 15360 \
  --max-concurrency 3840 \
  --warmup-requests 32 \
  --output-file "${BENCH_DIR}"/c3840.json \
  --output-details \
  --disable-tqdm \
  --seed 1 \
  || exit
