"""Every config value reaches the job directory.

A deployment with an inline site gives every field a unique canary value; each canary must show
up in the rendered files (plan.json counts: it is part of the job directory). The fields are found
by walking the config records (config.Site, config.Deployment and what they hold), so a field
added later without reaching the output fails here until it gets a canary below or a commented
place on the allow-list. String fields without a pattern get an automatic canary; everything else
is in CANARY (value + where its trace must appear), VARIANT (a field another one shadows, checked
in its own render) or DIFFERENTIAL (booleans and choices whose effect is not a distinctive text:
flipping them must change the output).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hpcserve.author.config import Deployment
from unitkit import Leaf, del_path, leaf_fields, set_path, string_carrying, write_yaml

F_P0, F_P1 = "launch/prefill-0.sh", "launch/prefill-1.sh"
F_D0, F_D1 = "launch/decode-0.sh", "launch/decode-1.sh"
F_R, F_JOB, F_PLAN = "launch/router.sh", "job.sbatch", "plan.json"
F_B = "launch/bench.sh"

# The canary deployment's topology: 6-GPU nodes; prefill 2 instances x 2 nodes (TP 3 x PP 4),
# decode 2 instances x 3 nodes (TP 9 x PP 2), the router on its own component.
BASE: dict = {
    "name": "canary-job",
    "model": {"profile": "deepseek-r1", "path": "/canary/model/path"},
    "site": {"container": {"runtime": "pyxis"}},
    "engine": {"simulate": True},
    "roles": {"prefill": {}, "decode": {}},
    "router": {"placement": "own"},
}

# path -> (value, [(file or None for anywhere, text that must appear)])
CANARY: dict[tuple, tuple[Any, list[tuple[str | None, str]]]] = {
    # roles.<role>.autoscale: the front's plan.json autoscale (1 prefill slot, 2 decode slots)
    ("roles", "prefill", "autoscale", "min"): (1, [(F_PLAN, '"prefill": {"min": 1, "max": 3,')]),
    ("roles", "prefill", "autoscale", "max"): (3, [(F_PLAN, '/scale/prefill-s1"]')]),
    ("roles", "prefill", "autoscale", "signal"): ("running", [(F_PLAN, '"kind": "running"')]),
    ("roles", "prefill", "autoscale", "target"): (2.75, [(F_PLAN, '"target": 2.75,')]),
    ("roles", "prefill", "autoscale", "cool_down"): ("71s", [(F_PLAN, '"cool_down_s": 71,')]),
    ("roles", "prefill", "autoscale", "interval"): (1.25, [(F_PLAN, '"interval_s": 1.25,')]),
    ("roles", "prefill", "autoscale", "drain_timeout"): (41, [(F_PLAN, '"drain_timeout_s": 41')]),
    ("roles", "decode", "autoscale", "min"): (2, [(F_PLAN, '"decode": {"min": 2, "max": 4,')]),
    ("roles", "decode", "autoscale", "max"): (4, [(F_PLAN, '/scale/decode-s2"]')]),
    ("roles", "decode", "autoscale", "signal"): ("kv_usage", [(F_PLAN, '"kind": "kv_usage"')]),
    ("roles", "decode", "autoscale", "target"): (0.625, [(F_PLAN, '"target": 0.625,')]),
    ("roles", "decode", "autoscale", "cool_down"): ("3m", [(F_PLAN, '"cool_down_s": 180,')]),
    ("roles", "decode", "autoscale", "interval"): (3.5, [(F_PLAN, '"interval_s": 3.5,')]),
    ("roles", "decode", "autoscale", "drain_timeout"): (57, [(F_PLAN, '"drain_timeout_s": 57')]),
    ("name",): ("canary-job", [(F_JOB, "#SBATCH --job-name=canary-job\n")]),
    ("model", "profile"): ("deepseek-r1", [(F_JOB, "model profile deepseek-r1\n")]),
    # paths mounted into the container must be absolute
    ("model", "path"): ("/canary/model/path", [(F_P0, "--model-path /canary/model/path ")]),
    ("site", "container", "workdir"): ("/canary/workdir", [(None, "/canary/workdir")]),
    # pattern-checked (a digest pin must be whole), so not an automatic canary
    ("engine", "image"): ("canary-engine-image",
                          [(F_PLAN, '"uri": "docker://canary-engine-image"')]),
    ("site", "container", "image_cache", "dir"): (
        "/canary/image/cache", [(F_PLAN, '"sqsh": "/canary/image/cache/canary-engine-image.sqsh"')]),
    ("site", "container", "image_cache", "owner"): ("canaryowner",
                                                    [(F_PLAN, '"owner": "canaryowner"')]),
    ("time_limit",): ("12:34:56", [(F_JOB, "#SBATCH --time=12:34:56\n")]),
    ("site", "network", "interface"): ("canaryif0", [(F_P0, "GLOO_SOCKET_IFNAME=canaryif0\n"),
                                                     ("launch/discover.sh", "--iface canaryif0")]),
    ("requeue",): (3, [(F_JOB, "#SBATCH --requeue\n"), (F_PLAN, '"requeue": 3')]),
    ("engine", "version"): ("0.5.22", [(F_P0, "SGLang 0.5.22 prefill"), (F_PLAN, '"0.5.22"')]),
    ("engine", "sim_startup_delay"): (1.5, [(F_P0, "HPCSERVE_SIM_STARTUP_DELAY=1.5\n")]),
    ("engine", "sim_prefill_s_per_token"): (0.125, [(F_D0, "_PREFILL_S_PER_TOKEN=0.125\n")]),
    ("engine", "sim_decode_s_per_token"): (0.0625, [(F_D1, "_DECODE_S_PER_TOKEN=0.0625\n")]),
    ("site", "slurm", "extra_directives"): ({"canary-directive": "canary-directive-value"},
                                            [(F_JOB, "--canary-directive=canary-directive-value")]),
    ("site", "slurm", "signal_grace"): (137, [(F_JOB, "#SBATCH --signal=B:TERM@137\n")]),
    ("site", "metrics", "file_sd_dir"): ("/canary/prometheus/sd",
                                         [(F_PLAN, '"file_sd_dir": "/canary/prometheus/sd"')]),
    ("site", "node", "gpus"): (6, [(F_JOB, "#SBATCH --gpus-per-node=6\n")]),
    ("site", "node", "gpu_memory_gb"): (400, []),   # fit check only, see ALLOW
    ("site", "container", "mounts"): (["/canary/mount/src:/canary/mount/dst"],
                                      [("steps/prefill-0.sh", "/canary/mount/src:/canary/mount/dst")]),
    ("site", "container", "env"): (["CANARY_CONTAINER_ENV"],
                                   [("steps/decode-0.sh", "--container-env=CANARY_CONTAINER_ENV")]),
    ("site", "network", "ib_devices"): (["canary-ib-0", "canary-ib-1"],
                                        [(F_P0, "--disaggregation-ib-device canary-ib-0,canary-ib-1"),
                                         (F_D0, "NCCL_IB_HCA=canary-ib-0,canary-ib-1")]),
    ("router", "port"): (8123, [(F_R, "--port 8123 ")]),
    ("router", "prometheus_port"): (29123, [(F_R, "--prometheus-port 29123")]),
    ("router", "args"): ({"canary-router-flag": "canary-router-flag-value"},
                         [(F_R, "--canary-router-flag canary-router-flag-value")]),
    ("readiness", "engine_timeout"): (4321, [(F_PLAN, '"engine_timeout": 4321')]),
    ("readiness", "router_timeout"): (321, [(F_PLAN, '"router_timeout": 321')]),
    ("readiness", "poll_interval"): (0.37, [(F_PLAN, '"poll_interval": 0.37')]),
    ("readiness", "smoke_tokens"): (9, [(F_PLAN, '"smoke_tokens": 9')]),
    ("liveness", "interval"): (7.5, [(F_PLAN, '"interval": 7.5')]),
    ("liveness", "timeout"): (3.25, [(F_PLAN, '"timeout": 3.25')]),
    ("liveness", "failures"): (11, [(F_PLAN, '"failures": 11')]),
    ("liveness", "node_interval"): (17.5, [(F_PLAN, '"node_interval": 17.5')]),
    # prefill: 2 instances x 2 nodes of 6 GPUs = TP 3 x PP 4
    ("roles", "prefill", "instances"): (2, [(F_P1, "# prefill-1: ")]),
    ("roles", "prefill", "nodes"): (2, [(F_P0, "--nnodes 2 ")]),
    ("roles", "prefill", "tp"): (3, [(F_P0, "--tp-size 3 ")]),
    ("roles", "prefill", "pp"): (4, [(F_P0, "--pp-size 4 ")]),
    ("roles", "prefill", "attn_dp"): (3, [(F_P0, "--attn-dp-size 3 ")]),
    ("roles", "prefill", "dp"): (5, [(F_P0, "--dp-size 5 ")]),
    ("roles", "prefill", "ep"): (3, [(F_P0, "--ep-size 3 ")]),
    ("roles", "prefill", "moe_a2a_backend"): ("mooncake", [(F_P0, "--moe-a2a-backend mooncake")]),
    ("roles", "prefill", "deepep_mode"): ("auto", [(F_P0, "--deepep-mode auto ")]),
    ("roles", "prefill", "redundant_experts"): (2, [(F_P0, "--ep-num-redundant-experts 2 ")]),
    ("roles", "prefill", "cuda_graph_max_bs"): (123, [(F_P0, "--cuda-graph-max-bs-decode 123")]),
    ("roles", "prefill", "cuda_graph_bs"): ([11, 13], [(F_P0, "--cuda-graph-bs-decode 11 13 ")]),
    ("roles", "prefill", "mem_fraction_static"): (0.777, [(F_P0, "--mem-fraction-static 0.777")]),
    ("roles", "prefill", "max_running_requests"): (4321, [(F_P0, "--max-running-requests 4321")]),
    ("roles", "prefill", "context_length"): (7777, [(F_P0, "--context-length 7777 ")]),
    ("roles", "prefill", "chunked_prefill_size"): (8191, [(F_P0, "--chunked-prefill-size 8191")]),
    ("roles", "prefill", "tool_call_parser"): ("deepseekv31", [(F_P0, "--tool-call-parser deepseekv31")]),
    ("roles", "prefill", "reasoning_parser"): ("qwen3-thinking",
                                               [(F_P0, "--reasoning-parser qwen3-thinking")]),
    ("roles", "prefill", "args"): ({"chat-template": "canary-chat-template-prefill"},
                                   [(F_P0, "--chat-template canary-chat-template-prefill")]),
    ("roles", "prefill", "port"): (31111, [(F_P0, "--port 31111 ")]),
    ("roles", "prefill", "bootstrap_port"): (31222, [(F_P0, "--disaggregation-bootstrap-port 31222"),
                                                     (F_R, ":31111 31222 ")]),
    ("roles", "prefill", "dist_init_port"): (31333, [(F_P0, '"${LEADER_IP}":31333 ')]),
    ("roles", "prefill", "sim_fault", "after"): (3.5, [(F_P1, "HPCSERVE_SIM_FAULT=exit:66:3.5\n")]),
    ("roles", "prefill", "sim_fault", "exit_code"): (66, [(F_P1, "HPCSERVE_SIM_FAULT=exit:66:")]),
    ("roles", "prefill", "sim_fault", "instances"): ([1], []),  # see DIFFERENTIAL
    ("roles", "prefill", "sim_fault", "ranks"): ([1], [(F_P1, "HPCSERVE_SIM_FAULT_RANKS=1\n")]),
    # 2 instances x 2 nodes + 3 spares
    ("roles", "prefill", "spares"): (3, [(F_JOB, "#SBATCH --nodes=7\n"), (F_PLAN, '"spares": 3')]),
    ("roles", "prefill", "recovery", "max_restarts"): (7, [(F_PLAN, '"max_restarts": 7')]),
    ("roles", "prefill", "hung_after"): (41.5, [(F_PLAN, '"hung_after": 41.5')]),
    ("roles", "prefill", "recovery", "backoff_s"): (2.5, [(F_PLAN, '"backoff_s": 2.5')]),
    ("roles", "prefill", "recovery", "min_serving"): (2, [(F_PLAN, '"min_serving": 2')]),
    ("roles", "prefill", "sim_fault", "attempts"): ([0, 2], [
        (F_P1, "HPCSERVE_SIM_FAULT_ATTEMPTS=0,2\n")]),
    # decode: 2 instances x 3 nodes of 6 GPUs = TP 9 x PP 2
    ("roles", "decode", "instances"): (2, [(F_D1, "# decode-1: ")]),
    ("roles", "decode", "nodes"): (3, [(F_D0, "--nnodes 3 ")]),
    ("roles", "decode", "tp"): (9, [(F_D0, "--tp-size 9 ")]),
    ("roles", "decode", "pp"): (2, [(F_D0, "--pp-size 2 ")]),
    ("roles", "decode", "attn_dp"): (9, [(F_D0, "--attn-dp-size 9 ")]),
    ("roles", "decode", "dp"): (7, [(F_D0, "--dp-size 7 ")]),
    ("roles", "decode", "ep"): (9, [(F_D0, "--ep-size 9 ")]),
    ("roles", "decode", "moe_a2a_backend"): ("mori", [(F_D0, "--moe-a2a-backend mori ")]),
    ("roles", "decode", "deepep_mode"): ("normal", [(F_D0, "--deepep-mode normal ")]),
    ("roles", "decode", "redundant_experts"): (5, [(F_D0, "--ep-num-redundant-experts 5 ")]),
    ("roles", "decode", "cuda_graph_max_bs"): (321, [(F_D0, "--cuda-graph-max-bs-decode 321")]),
    ("roles", "decode", "cuda_graph_bs"): ([17, 19], [(F_D0, "--cuda-graph-bs-decode 17 19 ")]),
    ("roles", "decode", "mem_fraction_static"): (0.666, [(F_D0, "--mem-fraction-static 0.666")]),
    ("roles", "decode", "max_running_requests"): (5432, [(F_D0, "--max-running-requests 5432")]),
    ("roles", "decode", "context_length"): (6666, [(F_D0, "--context-length 6666 ")]),
    ("roles", "decode", "chunked_prefill_size"): (4095, [(F_D0, "--chunked-prefill-size 4095")]),
    ("roles", "decode", "tool_call_parser"): ("glm45", [(F_D0, "--tool-call-parser glm45 ")]),
    ("roles", "decode", "reasoning_parser"): ("kimi", [(F_D0, "--reasoning-parser kimi ")]),
    ("roles", "decode", "args"): ({"chat-template": "canary-chat-template-decode"},
                                  [(F_D0, "--chat-template canary-chat-template-decode")]),
    ("roles", "decode", "port"): (32111, [(F_D0, "--port 32111 "), (F_R, ":32111 ")]),
    ("roles", "decode", "bootstrap_port"): (32222, []),  # see ALLOW
    ("roles", "decode", "dist_init_port"): (32333, [(F_D0, '"${LEADER_IP}":32333 ')]),
    ("roles", "decode", "sim_fault", "after"): (7.25, [(F_D0, "HPCSERVE_SIM_FAULT=exit:77:7.25\n")]),
    ("roles", "decode", "sim_fault", "exit_code"): (77, [(F_D1, "HPCSERVE_SIM_FAULT=exit:77:")]),
    ("roles", "decode", "sim_fault", "instances"): ([0, 1], []),  # see DIFFERENTIAL
    ("roles", "decode", "sim_fault", "ranks"): ([2, 0], [(F_D0, "HPCSERVE_SIM_FAULT_RANKS=2,0\n")]),
    # 2 instances x 3 nodes + 5 spares
    ("roles", "decode", "spares"): (5, [(F_JOB, "#SBATCH --nodes=11\n"), (F_PLAN, '"spares": 5')]),
    ("roles", "decode", "recovery", "max_restarts"): (8, [(F_PLAN, '"max_restarts": 8')]),
    ("roles", "decode", "hung_after"): (42.5, [(F_PLAN, '"hung_after": 42.5')]),
    ("roles", "decode", "recovery", "backoff_s"): (3.5, [(F_PLAN, '"backoff_s": 3.5')]),
    ("roles", "decode", "recovery", "min_serving"): (0, [(F_PLAN, '"min_serving": 0')]),
    ("roles", "decode", "sim_fault", "attempts"): ([3], [(F_D1, "HPCSERVE_SIM_FAULT_ATTEMPTS=3\n")]),
    ("site", "network", "gid_index"): (3, [(F_PLAN, '"gid_index": 3')]),
    ("preflight", "waive"): (["ports", "clock"], [(F_PLAN, '"waive": ["ports", "clock"]')]),
    ("preflight", "max_clock_skew_s"): (4.5, [(F_PLAN, '"max_clock_skew_s": 4.5')]),
    ("preflight", "min_shm_gb"): (2.0, [(F_PLAN, '"min_shm_bytes": 2147483648')]),
    ("preflight", "min_gpu_free_fraction"): (0.85, [(F_PLAN, '"min_gpu_free_fraction": 0.85')]),
    ("benchmark", "input_tokens"): (1234, [(F_B, "--random-input-len 1234 ")]),
    ("benchmark", "output_tokens"): (56, [(F_B, "--random-output-len 56 ")]),
    ("benchmark", "concurrency"): ([3, 5], [(F_B, "\npoint c3-r2.5 "),
                                            (F_B, "--max-concurrency 5 ")]),
    ("benchmark", "request_rate"): ([2.5], [(F_B, "--request-rate 2.5 ")]),
    ("benchmark", "prompts_per_point"): (77, [(F_B, "--num-prompts 77 ")]),
    ("benchmark", "warmup"): (3, [(F_B, "--warmup-requests 3 ")]),
    ("benchmark", "point_timeout_s"): (999, [(F_B, "point c5-r2.5 999 "),
                                             (F_PLAN, '"point_timeout_s": 999')]),
    ("benchmark", "min_success"): (0.75, [(F_PLAN, '"min_success": 0.75')]),
    ("benchmark", "output_tolerance"): (0.35, [(F_PLAN, '"output_tolerance": 0.35')]),
    ("benchmark", "metrics_interval_s"): (12.5, [(F_PLAN, '"metrics_interval_s": 12.5')]),
}

# Fields another field shadows: checked in their own render, `mods` applied first.
# path -> (value, [(file, text)], {path: value or None (= remove)})
VARIANT: dict[tuple, tuple[Any, list, dict]] = {
    # a role's own hung_after wins over the deployment's
    ("liveness", "hung_after"): (43.5, [(F_PLAN, '"hung_after": 43.5')],
                                 {("roles", "prefill", "hung_after"): None,
                                  ("roles", "decode", "hung_after"): None}),
    # engine.image wins over the site's image
    ("site", "container", "image"): ("canary-site-image",
                                     [(F_PLAN, '"uri": "docker://canary-site-image"')],
                                     {("engine", "image"): None}),
    # pattern-checked (no % or backslash), so not an automatic canary
    ("jobs_dir",): ("/canary/dep/jobs", [(F_PLAN, '"/canary/dep/jobs"')], {}),
    # the deployment's jobs_dir wins over the site's
    ("site", "paths", "jobs_dir"): ("/canary/site/jobs", [(F_PLAN, '"/canary/site/jobs"')],
                                    {("jobs_dir",): None}),
    # engine.python wins over the site's python for the (real) engine, router.python over the
    # site's router python
    ("site", "paths", "engine_python"): ({"sglang": "/canary/site/engine/python"},
                                         [(F_P0, "  /canary/site/engine/python ")],
                                         {("engine", "python"): None,
                                          ("engine", "simulate"): False}),
    ("site", "paths", "router_python"): ("/canary/site/router/python",
                                         [(F_R, "  /canary/site/router/python ")],
                                         {("router", "python"): None}),
    # request faults count requests, not seconds
    ("roles", "prefill", "sim_fault", "after_requests"): (
        5, [(F_P1, "HPCSERVE_SIM_FAULT=kv-lost:5\n")],
        {("roles", "prefill", "sim_fault", "kind"): "kv_lost"}),
    ("roles", "decode", "sim_fault", "after_requests"): (
        6, [(F_D0, "HPCSERVE_SIM_FAULT=empty:6\n")],
        {("roles", "decode", "sim_fault", "kind"): "empty"}),
    # a fault fired by a signal has no time after start (it shadows `after`)
    ("roles", "prefill", "sim_fault", "on_signal"): (
        True, [(F_P1, "HPCSERVE_SIM_FAULT=exit:66:SIGUSR1\n")], {}),
    ("roles", "decode", "sim_fault", "on_signal"): (
        True, [(F_D0, "HPCSERVE_SIM_FAULT=exit:77:SIGUSR1\n")], {}),
    # only the slow fault has a delay
    ("roles", "prefill", "sim_fault", "delay"): (
        4.5, [(F_P1, "HPCSERVE_SIM_FAULT=slow:4.5:")],
        {("roles", "prefill", "sim_fault", "kind"): "slow"}),
    ("roles", "decode", "sim_fault", "delay"): (
        9.5, [(F_D0, "HPCSERVE_SIM_FAULT=slow:9.5:")],
        {("roles", "decode", "sim_fault", "kind"): "slow"}),
    # only for a release outside the flag matrix; plan.json keeps the warning that names it
    ("engine", "check_flags_as"): ("0.5.22", [(F_PLAN, "checked against 0.5.22 "
                                                       "(engine.check_flags_as: 0.5.22)")],
                                   {("engine", "version"): "0.5.22.post9"}),
    # gres replaces --gpus-per-node
    ("site", "slurm", "gres"): ("gpu:canary:6", [(F_JOB, "#SBATCH --gres=gpu:canary:6\n")], {}),
    # a share of one node instead of whole nodes
    ("roles", "prefill", "gpus"): (3, [(F_P1, "CUDA_VISIBLE_DEVICES=3,4,5\n")],
                                   {("roles", "prefill", "nodes"): None,
                                    ("roles", "prefill", "pp"): None}),
    ("roles", "decode", "gpus"): (2, [(F_D1, "CUDA_VISIBLE_DEVICES=2,3\n")],
                                  {("roles", "decode", "nodes"): None,
                                   ("roles", "decode", "pp"): None,
                                   ("roles", "decode", "tp"): 2, ("roles", "decode", "attn_dp"): 2,
                                   ("roles", "decode", "ep"): 2,
                                   ("roles", "decode", "redundant_experts"): 4,
                                   # 322 GiB of weights per GPU: room for a KV cache
                                   ("roles", "decode", "mem_fraction_static"): 0.95}),
}

_FABRIC = {("site", "fabric", "nvlink_domain_nodes"): 6, ("site", "fabric", "topology"): "block",
           ("roles", "prefill", "spares"): 2, ("roles", "decode", "spares"): 3}

# Booleans and choices: rendering with `a` and with `b` (after `mods`) must differ.
# path -> (a, b, {path: value or None})
DIFFERENTIAL: dict[tuple, tuple[Any, Any, dict]] = {
    ("site", "slurm", "exclusive"): (True, False, {}),
    ("site", "slurm", "request_gpus"): (True, False, {}),
    ("site", "container", "runtime"): ("pyxis", "apptainer", {}),
    ("engine", "simulate"): (True, False, {}),
    # PD needs its router: the switch is checked on a plain (worker) deployment
    ("router", "enabled"): (True, False, {("roles", "prefill"): None, ("roles", "decode"): None,
                                          ("roles", "worker"): {"instances": 1}}),
    ("router", "placement"): ("own", "prefill", {}),
    ("roles", "prefill", "sim_fault", "instances"): ([1], [0], {}),
    ("roles", "prefill", "recovery", "restart"): (True, False, {}),
    ("roles", "decode", "recovery", "restart"): (True, False, {}),
    ("roles", "decode", "sim_fault", "instances"): ([0, 1], [], {}),
    ("roles", "prefill", "sim_fault", "kind"): ("exit", "unhealthy", {}),
    ("roles", "decode", "sim_fault", "kind"): ("exit", "hang", {}),
    ("roles", "prefill", "prefetch_checkpoints"): (False, True, {}),
    ("roles", "decode", "prefetch_checkpoints"): (False, True, {}),
    # The compile caches: SGLang's variables are set from 0.5.23 on (the release read), and the
    # canaries' engine.version is 0.5.22 (tests/unit/test_compile_caches.py checks the paths).
    ("site", "paths", "cache_dir"): (None, "/canary/cache", {("engine", "version"): "0.5.23"}),
    # node-local or shared: the launch scripts' comment and plan.json's caches block say which
    ("site", "paths", "cache_storage"): ("shared", "node-local",
                                         {("site", "paths", "cache_dir"): "/canary/cache",
                                          ("engine", "version"): "0.5.23"}),
    # Weight staging: the engines' model path becomes the staged copy, plan.json's stage block
    # carries the stage directory and its size bound.
    ("model", "stage"): (False, True, {("site", "paths", "stage_dir"): "/canary/stage",
                                       ("site", "paths", "stage_max_gb"): 10}),
    ("site", "paths", "stage_dir"): ("/canary/stage-a", "/canary/stage-b",
                                     {("model", "stage"): True,
                                      ("site", "paths", "stage_max_gb"): 10}),
    ("site", "paths", "stage_max_gb"): (10, 20, {("model", "stage"): True,
                                                 ("site", "paths", "stage_dir"): "/canary/stage"}),
    ("roles", "prefill", "disable_cuda_graph"): (False, True, {}),
    ("roles", "decode", "disable_cuda_graph"): (False, True, {}),
    ("roles", "prefill", "trust_remote_code"): (True, False, {}),
    ("roles", "decode", "trust_remote_code"): (True, False, {}),
    # an explicit attn_dp would win over dp_attention
    ("roles", "prefill", "dp_attention"): (False, True, {("roles", "prefill", "attn_dp"): None}),
    ("roles", "decode", "dp_attention"): (False, True, {("roles", "decode", "attn_dp"): None}),
    ("preflight", "enabled"): (True, False, {}),
    ("benchmark", "client"): ("auto", "vllm", {}),
    ("benchmark", "then"): ("stop", "serve", {}),
    ("preflight", "mpi"): ("auto", "pmix", {}),
    # a site whose nodes have no GPU: the preflight's GPU check does not apply (real engine)
    ("site", "node", "gpu_type"): ("H200", "simulated", {("engine", "simulate"): False}),
    # --segment per instance (block) or --switches=1 per role that fits one domain (tree)
    # (spares in whole segments: prefill 2 x 2 + 2, decode 2 x 3 + 3)
    ("site", "fabric", "topology"): ("block", "tree",
                                     {k: v for k, v in _FABRIC.items() if k[-1] != "topology"}),
    # the preflight's ClusterUUID check, in plan.json's preflight block
    ("site", "fabric", "check"): (True, False, _FABRIC),
}

# Fields that legitimately leave no trace in the job directory.
ALLOW = {
    ("renew", "margin"): "reaches only instance jobs (`hpcserve scale`'s, and autoscale slots "
                         "rendered beside the front: their plan.json renew.margin_s, their "
                         "--signal): tests/unit/test_renew.py, test_autoscale.py",
    ("renew", "time_limit"): "the instance jobs' own --time, not the front's: "
                             "tests/unit/test_renew.py",
    ("site", "name"): "names the site file; the job directory records the site's values, not "
                      "its name",
    ("site", "description"): "informational: shown to people choosing a site",
    ("site", "node", "gpu_memory_gb"): "only the planner's fit check (tests/unit/test_plan.py)",
    ("site", "slurm", "max_nodes"): "only the planner's node-count check (test_broken_configs)",
    ("engine", "name"): "the engine's own tests cover each (tests/unit/test_vllm_plan.py)",
    ("roles", "decode", "bootstrap_port"): "decode instances run no bootstrap server",
    ("workload", "input_tokens"): "the fit report of `hpcserve plan` (tests/unit/test_fit.py)",
    ("workload", "output_tokens"): "the fit report of `hpcserve plan` (tests/unit/test_fit.py)",
    # The CPU facts of a node reach the job only through an engine that computes on CPUs.
    ("site", "node", "cpu_cores"): "KTransformers' --kt-cpuinfer (tests/unit/test_kt_plan.py)",
    ("site", "node", "cpus"): "KTransformers' --cpus-per-task (tests/unit/test_kt_plan.py)",
    ("site", "node", "numa_nodes"): "KTransformers' --kt-threadpool-count "
                                    "(tests/unit/test_kt_plan.py)",
    ("site", "node", "memory_gb"): "KTransformers' host memory check (tests/unit/test_kt_plan.py)",
    ("site", "fabric", "nvlink_domain_nodes"): "the planner's one-domain check and the tree "
                                               "directive's condition (tests/unit/test_fabric.py)",
    ("site", "fabric", "slurm_version"): "only refuses topology block before Slurm 24.05 "
                                         "(tests/unit/test_fabric.py)",
}
# Prefixes whose values are mapping entries checked by key and value (auto canaries below).
AUTO_MAPS = {("env",), ("router", "env"), ("site", "network", "env"), ("roles", "prefill", "env"),
             ("roles", "decode", "env")}


def _leaves() -> list[Leaf]:
    return list(leaf_fields(Deployment))


def _auto(leaf: Leaf) -> tuple[Any, list] | None:
    """Automatic canary for plain string fields and env mappings."""
    tag = "canary-" + "-".join(map(str, leaf.path)).replace("_", "-")
    kind = string_carrying(leaf)
    if leaf.path in AUTO_MAPS:
        key = "CANARY_" + "_".join(map(str, leaf.path)).upper()
        return {key: tag}, [(None, f"export {key}={tag}\n")]
    if kind == "str" and "pattern" not in leaf.meta:
        return tag, [(None, tag)]
    return None


def _plan(leaves: list[Leaf]) -> dict[tuple, tuple[Any, list]]:
    out = {}
    for leaf in leaves:
        p = leaf.path
        if p in CANARY:
            out[p] = CANARY[p]
        elif p in VARIANT or p in DIFFERENTIAL or p in ALLOW:
            continue
        else:
            auto = _auto(leaf)
            if auto is not None:
                out[p] = auto
    return out


def _doc(values: dict[tuple, Any], mods: dict | None = None) -> dict:
    doc = copy.deepcopy(BASE)
    for p, v in values.items():
        set_path(doc, p, v)
    for p, v in (mods or {}).items():
        del_path(doc, p) if v is None else set_path(doc, p, v)
    return doc


def _render(tmp_path, doc: dict, name: str) -> dict[str, str]:
    from unitkit import render
    f = write_yaml(tmp_path / f"{name}.yaml", doc)
    files = render(f, "/canary/job/dir")
    return {rel: text for rel, (text, _) in files.items() if not rel.endswith(".py")}


def _missing(files: dict[str, str], expect: list) -> list[str]:
    everything = "\n".join(f"=== {rel}\n{text}" for rel, text in sorted(files.items()))
    bad = []
    for rel, text in expect:
        hay = everything if rel is None else files.get(rel)
        if hay is None:
            bad.append(f"no file {rel}")
        elif text not in hay:
            bad.append(f"{text!r} not in {rel or 'any file'}")
    return bad


def test_every_field_is_covered():
    """A new config field must get a canary, a variant, a differential check or an allow-list
    entry with its reason."""
    leaves = _leaves()
    planned = _plan(leaves)
    uncovered = [leaf.dotted for leaf in leaves if leaf.path not in planned
                 and leaf.path not in VARIANT and leaf.path not in DIFFERENTIAL
                 and leaf.path not in ALLOW]
    assert not uncovered, f"fields without a canary or an allow-list entry: {uncovered}"
    known = {leaf.path for leaf in leaves}
    stale = [p for p in list(CANARY) + list(VARIANT) + list(DIFFERENTIAL) + list(ALLOW)
             if p not in known]
    assert not stale, f"canary tables name fields that no longer exist: {stale}"
    assert len(leaves) > 80


def test_every_canary_reaches_the_job_directory(tmp_path):
    planned = _plan(_leaves())
    files = _render(tmp_path, _doc({p: v for p, (v, _) in planned.items()}), "canary")
    problems = {".".join(map(str, p)): m for p, (_, expect) in planned.items()
                if (m := _missing(files, expect))}
    assert not problems, f"config values missing from the rendered job directory: {problems}"
    # each automatic canary is unique, so finding it anywhere proves its own field reached it
    texts = [t for _, (_, expect) in planned.items() for (rel, t) in expect if rel is None]
    assert len(texts) == len(set(texts)) and len(texts) >= 15


@pytest.mark.parametrize("path", list(VARIANT), ids=[".".join(map(str, p)) for p in VARIANT])
def test_shadowed_fields_reach_the_job_directory(tmp_path, path):
    planned = _plan(_leaves())
    value, expect, mods = VARIANT[path]
    values = {p: v for p, (v, _) in planned.items()}
    values[path] = value
    files = _render(tmp_path, _doc(values, mods), "variant")
    assert not _missing(files, expect), _missing(files, expect)


@pytest.mark.parametrize("path", list(DIFFERENTIAL),
                         ids=[".".join(map(str, p)) for p in DIFFERENTIAL])
def test_switches_change_the_job_directory(tmp_path, path):
    planned = _plan(_leaves())
    a, b, mods = DIFFERENTIAL[path]
    values = {p: v for p, (v, _) in planned.items()}
    fa = _render(tmp_path, _doc({**values, path: a}, mods), "a")
    fb = _render(tmp_path, _doc({**values, path: b}, mods), "b")
    assert fa != fb, f"{'.'.join(map(str, path))}: {a!r} and {b!r} render the same job directory"


def test_canary_base_uses_every_role_setting_name():
    """The role settings of the canary deployment cover SGLang's settings completely (a new
    setting must be spelled for SGLang and get a canary)."""
    from hpcserve.engines.base import setting_names
    from hpcserve.engines.sglang import SPELLINGS, SGLangSettings
    assert set(setting_names(SGLangSettings)) - {"dp_attention"} == {n for n, _ in SPELLINGS}
