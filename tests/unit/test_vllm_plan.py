"""The vLLM adapter: every seed layout planned per node rank (what the launch scripts really run,
through bash), its topology checks and flag matrix refusals, its ports and its router."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcserve.author.config import role_type
from hpcserve.errors import ConfigError
from hpcserve.author.schema import fields_of
from hpcserve.author.words import show
from unitkit import (ROOT, plan_of, read_stub_log, run_bash, small_site, stub_env, write_nodes)

HCAS = "mlx5_0"


def vllm_doc(roles: dict, **over) -> dict:
    d = {"name": "t", "site": small_site(),
         "model": {"profile": "kimi-k2-instruct", "path": "/models/k2", "served_name": "k2"},
         "engine": {"name": "vllm", "version": "0.33.0"}, "roles": roles}
    d.update(over)
    return d


def _ranks_run(tmp_path, stubs, plan, inst_name: str) -> list[list[str]]:
    """Write the job, run launch/<inst>.sh on every node of the instance; each node's argv."""
    from hpcserve.author.render import render_files, write_job
    bindir, log = stubs
    jd = tmp_path / "job"
    write_job(render_files(plan, str(jd)), jd)
    inst = next(i for i in plan.instances if i.name == inst_name)
    rows = [(r, f"n{r}", f"10.9.0.{r + 1}", "eth0", HCAS) for r in range(inst.nodes)]
    write_nodes(jd, inst_name, rows)
    (tmp_path / "tmp").mkdir(exist_ok=True)  # the node's TMPDIR, under which the engine's is made
    for _, name, *_ in rows:
        r = run_bash(jd / "launch" / f"{inst_name}.sh",
                     stub_env(bindir, log, tmp_path, SLURMD_NODENAME=name, SLURM_JOB_ID="77",
                              TMPDIR=str(tmp_path / "tmp")), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    calls = read_stub_log(log)
    assert [c["prog"] for c in calls] == ["python3"] * inst.nodes
    return [c["argv"] for c in calls], [c["env"] for c in calls]


def _opt(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_tp_across_nodes_uses_the_mp_executor_and_headless_followers(tmp_path, stubs):
    plan = plan_of(tmp_path, vllm_doc({"worker": {"nodes": 2, "tp": 16}}))
    argvs, envs = _ranks_run(tmp_path, stubs, plan, "worker-0")
    for rank, argv in enumerate(argvs):
        assert argv[:4] == ["-m", "vllm.entrypoints.cli.main", "serve", "/models/k2"]
        assert (_opt(argv, "--nnodes"), _opt(argv, "--node-rank")) == ("2", str(rank))
        assert _opt(argv, "--master-addr") == "10.9.0.1"  # node rank 0's address on both
        assert _opt(argv, "--master-port") == "29501"
        assert _opt(argv, "--distributed-executor-backend") == "mp"
        assert _opt(argv, "--tensor-parallel-size") == "16"
        assert ("--headless" in argv) == (rank > 0)
        assert envs[rank]["VLLM_HOST_IP"] == f"10.9.0.{rank + 1}"
        # vLLM's leftovers go to a directory of the job's own, made new (0700) and recorded
        # for the cleanup
        tmp = Path(envs[rank]["TMPDIR"])
        assert tmp.parent == tmp_path / "tmp" and \
            tmp.name.startswith(f"hpcserve-job77-worker-0.{rank}.")
        assert tmp.is_dir() and tmp.stat().st_mode & 0o777 == 0o700
        rec = tmp_path / "job" / "run" / "scratch" / f"worker-0.{rank}.n{rank}"
        assert rec.read_text() == f"{tmp}\n"
    assert "--enable-auto-tool-choice" in argvs[0] and _opt(argvs[0], "--tool-call-parser") == "kimi_k2"


def test_dp_across_nodes_gives_each_node_its_start_rank_and_the_head_none(tmp_path, stubs):
    doc = vllm_doc({"worker": {"nodes": 3, "dp": 24, "expert_parallel": True}})
    plan = plan_of(tmp_path, doc)
    (inst,) = plan.instances
    assert dict(inst.parallel) == {"tp": 1, "dp": 24, "ep": 24}
    argvs, _ = _ranks_run(tmp_path, stubs, plan, "worker-0")
    for rank, argv in enumerate(argvs):
        assert (_opt(argv, "--data-parallel-size"), _opt(argv, "--data-parallel-size-local")) \
            == ("24", "8")
        assert _opt(argv, "--data-parallel-address") == "10.9.0.1"
        assert _opt(argv, "--data-parallel-rpc-port") == "29550"
        # vLLM 0.33 takes a start rank on the API-server node as hybrid load balancing
        assert _opt(argv, "--data-parallel-start-rank") == (None if rank == 0 else str(8 * rank))
        assert ("--headless" in argv) == (rank > 0)
        assert "--enable-expert-parallel" in argv and "--nnodes" not in argv


def test_seed_tp8_pp2_dcp8_example_spells_every_setting():
    from unitkit import load_plan
    p = load_plan(ROOT / "examples" / "vllm-kimi-k2-tp8pp2-dcp8.yaml")
    words = [show(w, {}) for w in p.instances[0].argv]
    for flag, value in (("--tensor-parallel-size", "8"), ("--pipeline-parallel-size", "2"),
                        ("--decode-context-parallel-size", "8"), ("--kv-cache-dtype", "fp8"),
                        ("--max-model-len", "2048"), ("--max-num-seqs", "1"),
                        ("--max-num-batched-tokens", "1024"), ("--dtype", "bfloat16"),
                        ("--quantization", "fp8"), ("--tokenizer-mode", "auto")):
        assert _opt(words, flag) == value, flag
    assert "--enable-chunked-prefill" in words and "--disable-log-requests" in words


def test_pd_with_nixl_sets_the_side_channel_to_the_nodes_own_address(tmp_path):
    plan = plan_of(tmp_path, vllm_doc({"prefill": {"nodes": 1}, "decode": {"nodes": 1}}))
    for inst in plan.instances:
        env = {k: show(v, {"NODE_IP": "IP"}) for k, v in inst.env}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "IP"
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(inst.port_of("side_channel"))
        assert env["UCX_NET_DEVICES"] == "mlx5_0:1"
        kv = json.loads(_opt(list(inst.argv), "--kv-transfer-config"))
        assert kv == {"kv_connector": "NixlConnector",
                      "kv_role": "kv_producer" if inst.role == "prefill" else "kv_consumer"}
    words = [show(w, {}) for w in plan.router.argv]
    assert plan.router.name == "vllm-router" and words[0] == "--vllm-pd-disaggregation"
    # NIXL needs no bootstrap port: each --prefill has its URL only
    assert words[words.index("--prefill") + 2] == "--decode"
    assert plan.router.readiness_count == ("prefill.healthy", "decode.healthy")


def test_pd_with_mooncake_gives_the_prefill_a_bootstrap_port_and_tells_the_router(tmp_path):
    roles = {"prefill": {"nodes": 1, "kv_connector": "mooncake", "bootstrap_port": 9100},
             "decode": {"nodes": 1, "kv_connector": "mooncake"}}
    plan = plan_of(tmp_path, vllm_doc(roles))
    pre = plan.instances[0]
    assert dict(pre.env)["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "9100"
    words = [show(w, {}) for w in plan.router.argv]
    assert words[words.index("--prefill") + 2] == "9100"
    assert words[-2:] == ["--kv-connector", "mooncake"]


def test_instances_sharing_a_node_get_distinct_ports(tmp_path):
    doc = vllm_doc({"worker": {"instances": 2, "gpus": 4}},
                   model={"profile": "kimi-k2-thinking", "path": "/m"})
    a, b = plan_of(tmp_path, doc).instances
    assert a.node_offset == b.node_offset and a.port != b.port


def test_side_channel_reserves_one_port_per_dp_rank(tmp_path):
    # two PD instances of DP 4 on one node: 5600-5603 and the next free block, never overlapping
    doc = vllm_doc({"prefill": {"instances": 2, "gpus": 4, "dp": 4,
                                 "expert_parallel": True},
                    "decode": {"nodes": 1}}, model={"profile": "kimi-k2-thinking", "path": "/m"})
    a, b = [i for i in plan_of(tmp_path, doc).instances if i.role == "prefill"]
    ra = set(range(a.port_of("side_channel"), a.port_of("side_channel") + 4))
    rb = set(range(b.port_of("side_channel"), b.port_of("side_channel") + 4))
    assert len(ra) == len(rb) == 4 and not ra & rb


@pytest.mark.parametrize("roles,field,says", [
    ({"worker": {"nodes": 2, "tp": 8}}, "roles.worker.tp",
     "tp 8 must equal the instance's 16 GPUs (nodes 2 x 8 GPUs per node)"),
    ({"worker": {"nodes": 3, "dp": 6, "tp": 2}}, "roles.worker.tp",
     "tp 2 x dp 6 = 12 must equal the instance's 24 GPUs (nodes 3 x 8 GPUs per node)"),
    # tp derived from dp: the message says so, not "TP 3 x DP 5"
    ({"worker": {"nodes": 2, "dp": 5}}, "roles.worker.dp",
     "dp 5 does not divide the instance's 16 GPUs (nodes 2 x 8 GPUs per node): tp is derived "
     "as GPUs / (pp x dp)"),
    ({"worker": {"nodes": 4, "dp": 2, "tp": 16}}, "roles.worker.dp",
     "dp 2 does not divide over the instance's 4 nodes"),
    ({"worker": {"nodes": 1, "tp": 8, "dcp": 3}}, "roles.worker.dcp", "divisible by dcp 3"),
    ({"worker": {"nodes": 1, "dp": 2, "dcp": 3}}, "roles.worker.dcp",
     "tp 4 (derived: 8 GPUs / (pp 1 x dp 2)) must be divisible by dcp 3"),
    ({"worker": {"nodes": 1, "redundant_experts": 8}}, "roles.worker.redundant_experts",
     "need eplb: true and expert_parallel: true"),
    ({"worker": {"nodes": 1, "kv_connector": "nixl"}}, "roles.worker.kv_connector",
     "prefill/decode disaggregation"),
    ({"worker": {"nodes": 1, "args": {"num-redundant-experts": 8}}},
     "roles.worker.args.num-redundant-experts", "--eplb-config"),
    ({"worker": {"nodes": 1, "args": {"headless": True}}}, "roles.worker.args.headless",
     "set by hpcserve"),
    ({"worker": {"nodes": 1, "deepep_mode": "normal"}}, "roles.worker.deepep_mode",
     "unknown key 'deepep_mode'"),
], ids=["tp-mismatch", "dp-tp-mismatch", "derived-tp", "dp-not-dividing", "dcp", "dcp-derived-tp",
        "redundant-no-eplb",
        "connector-no-pd", "planted-num-redundant-experts", "owned-headless", "sglang-key"])
def test_layouts_vllm_refuses(tmp_path, roles, field, says):
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, vllm_doc(roles))
    assert e.value.field == field and says in e.value.message, str(e.value)
    assert e.value.line is not None


def test_an_unknown_key_lists_vllms_own_vocabulary(tmp_path):
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, vllm_doc({"worker": {"attn_dp": 8}}))
    msg = e.value.message
    n = len(fields_of(role_type("vllm")))
    assert n != len(fields_of(role_type("sglang")))  # so the count tells them apart
    assert f"; {n} keys are valid here: see `hpcserve schema deployment`" in msg, msg
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, vllm_doc({"worker": {"expert_paralel": True}}), "near.yaml")
    assert "(did you mean 'expert_parallel'?)" in e.value.message


def test_redundant_experts_are_spelled_as_eplb_config_on_0_33(tmp_path):
    roles = {"worker": {"nodes": 2, "dp": 16, "expert_parallel": True, "eplb": True,
                        "redundant_experts": 32}}
    (inst,) = plan_of(tmp_path, vllm_doc(roles)).instances
    words = list(inst.argv)
    assert "--enable-eplb" in words
    assert json.loads(_opt(words, "--eplb-config")) == {"num_redundant_experts": 32}
    assert "--num-redundant-experts" not in words


def test_the_sites_engine_python_runs_the_real_engine_and_never_a_stand_in(tmp_path):
    site = small_site()
    site["paths"]["engine_python"] = {"vllm": "/opt/vllm/bin/python"}
    site["paths"]["router_python"] = "/opt/routers/bin/python"
    doc = vllm_doc({"worker": {"nodes": 1}}, site=site)
    real = plan_of(tmp_path, doc, "real.yaml")
    assert real.engine_command[0] == "/opt/vllm/bin/python"
    assert real.router.command[0] == "/opt/routers/bin/python"
    doc["engine"]["simulate"] = True
    sim = plan_of(tmp_path, doc, "sim.yaml")
    assert sim.engine_python == "python3"  # the stand-in needs no engine environment
    doc["engine"]["python"] = "/usr/bin/python3.11"
    assert plan_of(tmp_path, doc, "own.yaml").engine_python == "/usr/bin/python3.11"


@pytest.mark.parametrize("version,want", [
    ("0.33.0", ["--eplb-config", '{"num_redundant_experts":8}']),
    ("0.12.0", ["--eplb-config", '{"num_redundant_experts":8}']),
    # 0.10.2 and 0.11 have both; --num-redundant-experts is deprecated there, so the fresh one
    ("0.10.2", ["--eplb-config", '{"num_redundant_experts":8}']),
    ("0.10.0", ["--num-redundant-experts", "8"]),
])
def test_redundant_experts_are_spelled_per_release(tmp_path, version, want):
    doc = vllm_doc({"worker": {"nodes": 1, "dp": 8, "expert_parallel": True, "eplb": True,
                               "redundant_experts": 8}})
    doc["engine"]["version"] = version
    words = list(plan_of(tmp_path, doc).instances[0].argv)
    i = words.index(want[0])
    assert words[i:i + 2] == want


def test_tp_across_nodes_needs_a_release_with_nnodes(tmp_path):
    doc = vllm_doc({"worker": {"nodes": 2, "tp": 16}})
    doc["engine"]["version"] = "0.10.2"
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, doc)
    assert "vLLM 0.10.2 has no --nnodes" in e.value.message and "0.11.1" in e.value.message
    # DP across the same two nodes needs no --nnodes, and 0.10.2 has every flag of it
    doc["roles"]["worker"] = {"nodes": 2, "dp": 16, "expert_parallel": True}
    (inst,) = plan_of(tmp_path, doc, "dp.yaml").instances
    assert "--data-parallel-address" in inst.argv


def test_a_setting_the_release_cannot_spell_is_refused_naming_it(tmp_path):
    doc = vllm_doc({"worker": {"nodes": 1, "all2all_backend": "deepep_low_latency"}})
    doc["engine"]["version"] = "0.11.0"
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, doc)
    assert e.value.field == "roles.worker.all2all_backend"
    assert "vLLM 0.11.0 has no flag for all2all_backend (looked for --all2all-backend)" \
        in e.value.message


def test_several_plain_instances_sit_behind_vllm_routers_plain_mode(tmp_path):
    plan = plan_of(tmp_path, vllm_doc({"worker": {"instances": 3, "nodes": 1}}))
    words = [show(w, {}) for w in plan.router.argv]
    assert words[0] == "--worker-urls" and "--vllm-pd-disaggregation" not in words
    assert words[1:4] == [f"http://$WORKER_{i}_IP:8100" for i in range(3)]
    assert plan.router.readiness_count == ("healthy_workers",)
