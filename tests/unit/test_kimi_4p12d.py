"""Acceptance: examples/kimi-k2-instruct-4p12d.yaml is the seed's 4P12D SGLang deployment.

The seed (shared/seeds/001, "Data Parallelism + Expert Parallelism", SGLang) gives the commands
of a 4-node prefill and a 12-node decode instance for an older SGLang; hpcserve must produce every
one of those settings in SGLang 0.5.23's spelling, compute node ranks in the task, and point the
router at node 0 of each instance. The launch scripts are executed with bash, with a stub python3
that records the engine's argv.
"""

from __future__ import annotations

import re
import shlex
import time

import pytest

from unitkit import (EXAMPLES, ROOT, is_own_port, read_stub_log, run_bash, sbatch_components,
                     sbatch_options, stub_env, write_nodes)

EXAMPLE = ROOT / "examples" / "kimi-k2-instruct-4p12d.yaml"
HCAS = "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"  # site dgx-h200-pyxis

# The seed's flags (seed spelling) -> the words SGLang 0.5.23 needs in the launch script.
# `None` marks what is node-specific and checked on the executed argv below instead.
PREFILL_FLAGS = [
    ("--model-path $MODEL_PATH", "--model-path /lustre/models/Kimi-K2-Instruct"),
    ("--trust-remote-code", "--trust-remote-code"),
    ("--disaggregation-mode prefill", "--disaggregation-mode prefill"),
    ("--dist-init-addr $PREFILL_NODE0$:5757", '--dist-init-addr "${LEADER_IP}":5757'),
    ("--tp-size 32 --dp-size 32 --enable-dp-attention", "--tp-size 32 --attn-dp-size 32"),
    ("--host $LOCAL_IP", '--host "${NODE_IP}"'),
    ("--decode-log-interval 1", "--decode-log-interval 1"),
    ("--disable-radix-cache", "--disable-radix-cache"),
    ("--enable-deepep-moe", "--moe-a2a-backend deepep"),
    ("--moe-dense-tp-size 1", "--moe-dense-tp-size 1"),
    ("--enable-dp-lm-head", "--enable-dp-lm-head"),
    ("--disable-shared-experts-fusion", "--disable-shared-experts-fusion"),
    ("--watchdog-timeout 1000000", "--watchdog-timeout 1000000"),
    ("--enable-two-batch-overlap", "--enable-two-batch-overlap"),
    ("--disaggregation-ib-device $IB_DEVICE", f"--disaggregation-ib-device {HCAS}"),
    ("--chunked-prefill-size 131072", "--chunked-prefill-size 131072"),
    ("--mem-fraction-static 0.85", "--mem-fraction-static 0.85"),
    ("--deepep-mode normal", "--deepep-mode normal"),
    ("--ep-dispatch-algorithm dynamic", "--ep-dispatch-algorithm dynamic"),
    ("--eplb-algorithm deepseek", "--eplb-algorithm deepseek"),
    ("--max-running-requests 1024", "--max-running-requests 1024"),
    ("--nnodes 4", "--nnodes 4"),
    ("--node-rank $RANK", '--node-rank "${NODE_RANK}"'),
    ("--tool-call-parser kimi_k2", "--tool-call-parser kimi_k2"),
]
DECODE_FLAGS = [
    ("--model-path $MODEL_PATH", "--model-path /lustre/models/Kimi-K2-Instruct"),
    ("--trust-remote-code", "--trust-remote-code"),
    ("--disaggregation-mode decode", "--disaggregation-mode decode"),
    ("--dist-init-addr $DECODE_NODE0:5757", '--dist-init-addr "${LEADER_IP}":5757'),
    ("--tp-size 96 --dp-size 96 --enable-dp-attention", "--tp-size 96 --attn-dp-size 96"),
    ("--host $LOCAL_IP", '--host "${NODE_IP}"'),
    ("--decode-log-interval 1", "--decode-log-interval 1"),
    ("--context-length 2176", "--context-length 2176"),
    ("--disable-radix-cache", "--disable-radix-cache"),
    ("--enable-deepep-moe", "--moe-a2a-backend deepep"),
    ("--moe-dense-tp-size 1", "--moe-dense-tp-size 1"),
    ("--enable-dp-lm-head", "--enable-dp-lm-head"),
    ("--disable-shared-experts-fusion", "--disable-shared-experts-fusion"),
    ("--watchdog-timeout 1000000", "--watchdog-timeout 1000000"),
    ("--enable-two-batch-overlap", "--enable-two-batch-overlap"),
    ("--disaggregation-ib-device $IB_DEVICE", f"--disaggregation-ib-device {HCAS}"),
    ("--deepep-mode low_latency", "--deepep-mode low_latency"),
    ("--mem-fraction-static 0.8", "--mem-fraction-static 0.8"),
    ("--cuda-graph-bs 480", "--cuda-graph-bs-decode 480"),
    ("--max-running-requests 46080", "--max-running-requests 46080"),
    ("--ep-num-redundant-experts 96", "--ep-num-redundant-experts 96"),
    ("--nnodes 12", "--nnodes 12"),
    ("--node-rank $RANK", '--node-rank "${NODE_RANK}"'),
    ("--tool-call-parser kimi_k2", "--tool-call-parser kimi_k2"),
]
SEED_ENV = {"MC_TE_METRIC": "true", "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "10000000",
            "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "100000",
            "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "100000", "PYTHONUNBUFFERED": "1"}
DECODE_ENV = {**SEED_ENV, "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "480"}
# Spellings SGLang 0.5.23 no longer has (or deprecates), and the seed's shell placeholders.
REMOVED = ["--enable-dp-attention", "--dp-size", "--enable-deepep-moe", "--cuda-graph-bs",
           "--enable-ep-moe", "--cuda-graph-max-bs", "--disable-cuda-graph"]
PLACEHOLDERS = ["$LOCAL_IP", "$IB_DEVICE", "$RANK", "$MODEL_PATH", "$PREFILL_NODE0",
                "$DECODE_NODE0"]

P_NODES = [(r, f"gpu-p{r:02d}", f"10.10.0.{11 + r}", "ib0", HCAS) for r in range(4)]
D_NODES = [(r, f"gpu-d{r:02d}", f"10.20.0.{31 + r}", "ib0", HCAS) for r in range(12)]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The example rendered and written at a real directory (JOB_DIR is baked in at render time),
    with the run/ files the runtime writes after address discovery."""
    from hpcserve.author.render import render_files, write_job
    from unitkit import load_plan
    base = tmp_path_factory.mktemp("kimi")
    jd = base / "job"
    plan = load_plan(EXAMPLE)
    files = render_files(plan, str(jd))
    write_job(files, jd)
    write_nodes(jd, "prefill-0", P_NODES)
    write_nodes(jd, "decode-0", D_NODES)
    (jd / "run" / "endpoints.env").write_text(
        f"PREFILL_0_IP={P_NODES[0][2]}\nDECODE_0_IP={D_NODES[0][2]}\n"
        f"ROUTER_IP={P_NODES[0][2]}\n", encoding="utf-8")
    return {"dir": jd, "files": files, "plan": plan, "base": base}


def _launch_words(text: str) -> list[str]:
    """The words of the script's final `exec \\ ...` command, as the shell splits them
    (variables left as written)."""
    cmd = text[text.rindex("\nexec \\\n") + len("\nexec \\\n"):]
    return shlex.split(cmd.replace("\\\n", " "), posix=False)


def _contains_run(words: list[str], seq: list[str]) -> bool:
    n = len(seq)
    return any(words[i:i + n] == seq for i in range(len(words) - n + 1))


def test_example_is_among_the_examples():
    assert EXAMPLE in EXAMPLES


def test_het_job_of_4_plus_12_nodes(job):
    plan = job["plan"]
    assert [(c.name, c.nodes) for c in plan.components] == [("prefill", 4), ("decode", 12)]
    text = job["files"]["job.sbatch"][0]
    comps = sbatch_components(text)
    assert len(comps) == 2
    assert text.count("\n#SBATCH hetjob\n") == 1
    assert [dict(sbatch_options(c))["nodes"] for c in comps] == ["4", "12"]


@pytest.mark.parametrize("inst,table", [("prefill-0", PREFILL_FLAGS), ("decode-0", DECODE_FLAGS)])
def test_launch_script_carries_every_seed_setting_in_0_5_23_spelling(job, inst, table):
    text = job["files"][f"launch/{inst}.sh"][0]
    words = _launch_words(text)
    missing = [f"{seed!r} -> {new!r}" for seed, new in table
               if not _contains_run(words, shlex.split(new, posix=False))]
    assert not missing, f"launch/{inst}.sh lacks:\n" + "\n".join(missing)
    flags = [w for w in words if w.startswith("--")]
    assert not set(REMOVED) & set(flags), f"removed spellings in launch/{inst}.sh"
    for ph in PLACEHOLDERS:  # the seed's shell placeholders (not hpcserve's own variables)
        assert not [w for w in words if re.search(re.escape(ph) + r"(?![A-Za-z0-9_])", w)], ph
    # Every flag is one SGLang 0.5.23 has and does not deprecate.
    from hpcserve.engines import sglang
    rel = sglang.ADAPTER.release("0.5.23")
    assert [f for f in flags if not rel.fresh(f)] == []
    # Each flag once: a repeated flag would silently override the first.
    assert len(flags) == len(set(flags))


@pytest.mark.parametrize("inst,nodes", [("prefill-0", P_NODES), ("decode-0", D_NODES)])
def test_ranks_and_leader_come_from_the_task(job, stubs, inst, nodes):
    """Run launch/<inst>.sh on every node of the instance: the argv the engine gets."""
    bindir, log = stubs
    jd = job["dir"]
    env_want = DECODE_ENV if inst.startswith("decode") else SEED_ENV
    for rank, name, ip, _iface, _ib in nodes:
        r = run_bash(jd / "launch" / f"{inst}.sh",
                     stub_env(bindir, log, job["base"], SLURMD_NODENAME=name), cwd=job["base"])
        assert r.returncode == 0, (name, r.stderr, (jd / "logs").iterdir())
    calls = read_stub_log(log)
    assert len(calls) == len(nodes)
    seen = []
    for (rank, name, ip, _iface, _ib), call in zip(nodes, calls):
        assert call["prog"] == "python3"
        argv = call["argv"]
        assert argv[:2] == ["-m", "sglang.launch_server"]
        opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
        seen.append(int(opt["--node-rank"]))
        assert opt["--node-rank"] == str(rank)
        assert opt["--dist-init-addr"] == f"{nodes[0][2]}:5757"
        assert opt["--host"] == ip
        assert opt["--nnodes"] == str(len(nodes))
        assert opt["--disaggregation-ib-device"] == HCAS
        for k, v in env_want.items():
            assert call["env"].get(k) == v, k
        assert call["env"]["SGLANG_HOST_IP"] == ip
        assert call["env"]["NCCL_IB_HCA"] == HCAS
        assert call["env"]["NCCL_SOCKET_IFNAME"] == "ib0"
        # the engine's output goes to its per-node log
        assert (jd / "logs" / f"{inst}.node{rank}.{name}.log").exists()
    assert seen == list(range(len(nodes)))


def test_a_node_outside_the_instance_refuses_to_start(job, stubs):
    bindir, log = stubs
    r = run_bash(job["dir"] / "launch" / "prefill-0.sh",
                 stub_env(bindir, log, job["base"], SLURMD_NODENAME=D_NODES[0][1]), cwd=job["base"])
    assert r.returncode == 3 and "not one of prefill-0's nodes" in r.stderr
    assert read_stub_log(log) == []


def test_no_rank_expansion_in_the_batch_shell(job):
    for rel, (text, _) in job["files"].items():
        # launch/discover.sh is the one task that reports Slurm's node index, as the address
        # discovery that runs it does; everything else finds its rank in run/<inst>.nodes
        if rel == "job.sbatch" or rel.endswith(".sh") and rel != "launch/discover.sh":
            for var in ("SLURM_NODEID", "SLURM_PROCID", "SLURM_LOCALID"):
                assert var not in text, f"{rel} expands {var}"
    launch = job["files"]["launch/prefill-0.sh"][0]
    assert "SLURMD_NODENAME" in launch and 'run/prefill-0.nodes' in launch


def test_router_names_node_0_of_each_instance(job, stubs):
    bindir, log = stubs
    r = run_bash(job["dir"] / "launch" / "router.sh", stub_env(bindir, log, job["base"]),
                 cwd=job["base"])
    assert r.returncode == 0, r.stderr
    (call,) = read_stub_log(log)
    argv = call["argv"]
    assert argv[:2] == ["-m", "sglang_router.launch_router"]
    assert "--pd-disaggregation" in argv
    i = argv.index("--prefill")
    assert argv[i + 1:i + 3] == [f"http://{P_NODES[0][2]}:30000", "8998"]
    j = argv.index("--decode")
    assert argv[j + 1] == f"http://{D_NODES[0][2]}:30000"
    assert argv.count("--prefill") == 1 and argv.count("--decode") == 1
    assert argv[argv.index("--port") + 1] == "8000"


@pytest.mark.parametrize("inst,nodes,ports", [("prefill-0", P_NODES, "30000,8998,5757"),
                                              ("decode-0", D_NODES, "30000,5757")])
def test_only_the_serving_node_checks_who_holds_its_ports(job, stubs, inst, nodes, ports):
    bindir, log = stubs
    jd = job["dir"]
    for rank, name, *_ in nodes:
        run_bash(jd / "launch" / f"{inst}.sh",
                 stub_env(bindir, log, job["base"], SLURMD_NODENAME=name), cwd=job["base"])
    deadline = time.time() + 5  # the check runs in the background
    while time.time() < deadline and len(read_stub_log(log, own_port=True)) < len(nodes) + 1:
        time.sleep(0.05)
    checks = [c for c in read_stub_log(log, own_port=True) if is_own_port(c)]
    assert len(checks) == 1, checks  # node rank 0 only: the others serve no HTTP
    a = checks[0]["argv"]
    # no site-packages, no PYTHON* variables: it needs neither and starts faster without
    assert a[:3] == ["-S", "-I", f"{jd}/hpcserve_runtime/ownport.py"]
    assert a[4:6] == [ports, f"{jd}/run/ports/{inst}"] and int(a[3]) > 1
    assert checks[0]["env"]["SLURMD_NODENAME"] == nodes[0][1]
