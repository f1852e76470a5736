"""The planner: ports from one registry, GPU shares, per-version flag spelling."""

from __future__ import annotations

from collections import Counter

import pytest

from hpcserve.errors import ConfigError
from hpcserve.author.plan import PortRegistry
from hpcserve.author.words import Var, show
from unitkit import ROOT, plan_of, render, small_pd, write_yaml

KIMI_4P12D = ROOT / "examples" / "kimi-k2-instruct-4p12d.yaml"


def _ports_by_node(plan) -> dict[tuple[int, int], list[tuple[str, int]]]:
    """Every port bound on each (component, node): instances' ports on all their nodes, the
    router's on its node."""
    out: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for i in plan.instances:
        for n in range(i.node_offset, i.node_offset + i.nodes):
            for kind, p in i.ports:
                out.setdefault((i.component, n), []).append((f"{i.name}.{kind}", p))
    if plan.router:
        r = plan.router
        out.setdefault((r.component, r.node_offset), []).extend(
            [("router.port", r.port), ("router.prometheus_port", r.prometheus_port)])
    return out


def _assert_no_collision(plan):
    for node, ports in _ports_by_node(plan).items():
        dup = [p for p, c in Counter(p for _, p in ports).items() if c > 1]
        assert not dup, f"node {node}: port(s) {dup} taken twice: {ports}"


def _opt(argv, flag):
    i = list(argv).index(flag)
    return argv[i + 1]


def _shared_pd(tmp_path, **router):
    """Kimi-K2-Thinking (INT4, fits 4 x 192 GiB): two prefill and two decode instances of 4 GPUs
    each, two per 8-GPU node."""
    doc = small_pd()
    doc["model"] = {"profile": "kimi-k2-thinking", "path": "/models/k2t"}
    doc["roles"] = {"prefill": {"instances": 2, "gpus": 4}, "decode": {"instances": 2, "gpus": 4}}
    if router:
        doc["router"] = router
    return plan_of(tmp_path, doc)


def test_instances_sharing_a_node_get_distinct_ports_and_gpus(tmp_path):
    plan = _shared_pd(tmp_path)
    assert [(c.name, c.nodes) for c in plan.components] == [("prefill", 1), ("decode", 1)]
    for role in ("prefill", "decode"):
        a, b = [i for i in plan.instances if i.role == role]
        assert a.component == b.component and a.node_offset == b.node_offset == 0
        for kind in ("http", "dist_init", "nccl") + (("bootstrap",) if role == "prefill" else ()):
            assert a.port_of(kind) is not None and a.port_of(kind) != b.port_of(kind), kind
        ga, gb = set(a.gpu_ids.split(",")), set(b.gpu_ids.split(","))
        assert len(ga) == len(gb) == 4 and not ga & gb and ga | gb == {str(g) for g in range(8)}
        for inst in (a, b):
            env = dict(inst.env)
            assert env["CUDA_VISIBLE_DEVICES"] == inst.gpu_ids
            assert _opt(inst.argv, "--port") == str(inst.port)
            assert _opt(inst.argv, "--nccl-port") == str(inst.port_of("nccl"))
            assert _opt(inst.argv, "--tp-size") == "4"
            if role == "prefill":
                assert (_opt(inst.argv, "--disaggregation-bootstrap-port")
                        == str(inst.port_of("bootstrap")))
            assert "--dist-init-addr" not in inst.argv  # one node: no multi-node init
    _assert_no_collision(plan)


def test_router_on_the_prefill_head_node_never_collides(tmp_path):
    # The router asks for exactly the engines' default ports; it keeps them, engines move.
    plan = _shared_pd(tmp_path, port=30000, prometheus_port=8998)
    assert (plan.router.component, plan.router.node_offset) == (0, 0)
    assert (plan.router.port, plan.router.prometheus_port) == (30000, 8998)
    prefill = [i for i in plan.instances if i.role == "prefill"]
    assert all(i.port != 30000 and i.port_of("bootstrap") != 8998 for i in prefill)
    _assert_no_collision(plan)
    # the router's URLs carry the ports the prefill instances really got
    words = [show(w, {}) for w in plan.router.argv]
    for i in prefill:
        k = words.index(f"http://${i.role.upper()}_{i.index}_IP:{i.port}")
        assert words[k - 1] == "--prefill" and words[k + 1] == str(i.port_of("bootstrap"))


def test_user_ports_are_honoured_and_counted_up_on_shared_nodes(tmp_path):
    doc = small_pd()
    doc["model"] = {"profile": "kimi-k2-thinking", "path": "/models/k2t"}
    doc["roles"] = {"prefill": {"instances": 2, "gpus": 4, "port": 40000, "bootstrap_port": 41000,
                                "dist_init_port": 42000},
                    "decode": {"instances": 1, "nodes": 2, "port": 40000, "dist_init_port": 42000}}
    plan = plan_of(tmp_path, doc)
    p0, p1, d0 = plan.instances
    assert (p0.port, p0.port_of("bootstrap"), p0.port_of("dist_init")) == (40000, 41000, 42000)
    assert p1.port > 40000 and p1.port_of("bootstrap") > 41000 and p1.port_of("dist_init") > 42000
    assert (d0.port, d0.port_of("dist_init")) == (40000, 42000)  # another component: its own nodes
    assert show(d0.argv[d0.argv.index("--dist-init-addr") + 1], {"LEADER_IP": "L"}) == "L:42000"
    _assert_no_collision(plan)


def test_port_registry_counts_up_per_node():
    reg = PortRegistry()
    assert reg.take(0, range(0, 2), 100) == 100
    assert reg.take(0, range(1, 3), 100) == 101   # node 1 has 100
    assert reg.take(0, range(2, 3), 100) == 100   # node 2 only has 101
    assert reg.take(1, range(0, 1), 100) == 100   # other component, other nodes
    assert reg.take(0, range(0, 3), 100) == 102


def test_router_on_its_own_component(tmp_path):
    doc = small_pd()
    doc["router"] = {"placement": "own"}
    plan = plan_of(tmp_path, doc)
    assert [(c.name, c.nodes) for c in plan.components] == [("prefill", 1), ("decode", 2),
                                                            ("router", 1)]
    assert plan.router.component == 2
    router_directives = dict(plan.components[2].directives)
    assert "gpus-per-node" not in router_directives and router_directives["nodes"] == "1"
    assert dict(plan.components[0].directives)["gpus-per-node"] == "8"


def test_idle_gpus_are_noted(tmp_path):
    doc = small_pd()
    doc["model"] = {"profile": "kimi-k2-thinking", "path": "/models/k2t"}
    doc["roles"] = {"prefill": {"instances": 3, "gpus": 4}, "decode": {"nodes": 1}}
    plan = plan_of(tmp_path, doc)
    assert plan.components[0].nodes == 2
    assert any("prefill: 4 GPU(s)" in n for n in plan.notes)


@pytest.mark.parametrize("change,field,message", [
    ({"roles": {"prefill": {"gpus": 3}}}, "roles.prefill.gpus",
     "gpus 3 (per instance) does not divide the 8 GPUs of a node (site.node.gpus)"),
    ({"roles": {"prefill": {"gpus": 4, "nodes": 2}}}, "roles.prefill.gpus", "cannot be combined"),
    ({"roles": {"prefill": {"gpus": 2}}}, "roles.prefill.gpus", "do not fit"),
    ({"roles": {"decode": {"nodes": 2, "ep": 8}}}, "roles.decode.ep", "forces ep to tp"),
    ({"roles": {"decode": {"nodes": 2, "redundant_experts": 3}}},
     "roles.decode.redundant_experts",
     "= 259 do not divide over the 16 expert-parallel ranks of decode's layout (tp 16, "),
    ({"site": {"container": {"runtime": "pyxis"}}}, "engine.image", "needs an image"),
])
def test_topology_errors(tmp_path, change, field, message):
    doc = small_pd()
    for k, v in change.items():
        if k == "roles":
            for role, over in v.items():
                doc["roles"][role] = {**doc["roles"][role], **over}
        else:
            for sub, over in v.items():
                doc["site"][sub] = {**doc["site"][sub], **over}
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, doc)
    assert e.value.field == field and message in e.value.message, str(e.value)
    assert e.value.file == str(tmp_path / "deploy.yaml") and e.value.line


# --------------------------------------------------------------------------- version spelling

def _argv(plan, role):
    (inst,) = [i for i in plan.instances if i.role == role]
    return [show(w, {}) for w in inst.argv]


def _has_run(words, seq):
    return any(words[i:i + len(seq)] == seq for i in range(len(words) - len(seq) + 1))


def test_matrix_facts_the_spelling_tests_rely_on(flag_matrix):
    f = {v: set(flag_matrix[v]["flags"]) for v in ("0.4.9.post6", "0.5.21", "0.5.23")}
    assert "--attn-dp-size" in f["0.5.23"] and "--attn-dp-size" not in f["0.5.21"]
    assert "--enable-dp-attention" in f["0.5.21"]
    assert "--enable-dp-attention" in flag_matrix["0.5.23"]["deprecated"]
    assert "--moe-a2a-backend" in f["0.5.21"] and "--moe-a2a-backend" not in f["0.4.9.post6"]
    assert "--enable-deepep-moe" in f["0.4.9.post6"] and "--enable-deepep-moe" not in f["0.5.21"]
    assert "--cuda-graph-bs" in f["0.4.9.post6"] and "--cuda-graph-bs" not in f["0.5.21"]
    assert "--cuda-graph-bs-decode" in f["0.5.21"] and "--cuda-graph-bs-decode" in f["0.5.23"]


@pytest.mark.parametrize("version,prefill_has,decode_has,absent", [
    ("0.5.23", [["--tp-size", "32", "--attn-dp-size", "32"], ["--moe-a2a-backend", "deepep"]],
     [["--attn-dp-size", "96"], ["--cuda-graph-bs-decode", "480"]],
     ["--dp-size", "--enable-dp-attention", "--enable-deepep-moe", "--cuda-graph-bs"]),
    ("0.5.21", [["--tp-size", "32", "--dp-size", "32", "--enable-dp-attention"],
                ["--moe-a2a-backend", "deepep"]],
     [["--dp-size", "96", "--enable-dp-attention"], ["--cuda-graph-bs-decode", "480"]],
     ["--attn-dp-size", "--enable-deepep-moe", "--cuda-graph-bs"]),
    ("0.5.20", [["--tp-size", "32", "--dp-size", "32", "--enable-dp-attention"],
                ["--moe-a2a-backend", "deepep"]],
     [["--dp-size", "96", "--enable-dp-attention"], ["--cuda-graph-bs-decode", "480"]],
     ["--attn-dp-size", "--enable-deepep-moe", "--cuda-graph-bs"]),
])
def test_same_deployment_spelled_per_version(version, prefill_has, decode_has, absent):
    from unitkit import load_plan
    plan = load_plan(KIMI_4P12D, [f"engine.version={version}"])
    assert plan.version == version
    for role, want in (("prefill", prefill_has), ("decode", decode_has)):
        words = _argv(plan, role)
        for seq in want:
            assert _has_run(words, seq), f"{version} {role}: {seq} not in {words}"
        assert not set(absent) & set(words), f"{version} {role}: {set(absent) & set(words)}"
        # every flag exists in that release
        from hpcserve.engines import sglang
        rel = sglang.ADAPTER.release(version)
        assert [w for w in words if w.startswith("--") and not rel.has(w)] == []
    assert f"SGLang {version}" in render(KIMI_4P12D, "/j", (f"engine.version={version}",))[
        "launch/prefill-0.sh"][0]


def test_disable_cuda_graph_uses_the_fresh_spelling(tmp_path):
    doc = small_pd()
    doc["roles"]["decode"]["disable_cuda_graph"] = True
    words = _argv(plan_of(tmp_path, doc), "decode")
    assert "--disable-cuda-graph" not in words  # deprecated in 0.5.23
    assert _has_run(words, ["--cuda-graph-backend-decode", "disabled"])
    # Every accepted release has the fresh spelling (0.4.9.post6, with only the old one, is
    # refused: hpcserve/engines/sglang.py CHECKED).
    doc["engine"]["version"] = "0.5.20"
    words = _argv(plan_of(tmp_path, doc, "d2.yaml"), "decode")
    assert _has_run(words, ["--cuda-graph-backend-decode", "disabled"])


@pytest.mark.parametrize("version,nearest", [
    ("0.5.22.post9", "the nearest it knows are 0.5.22 and 0.5.23"),
    ("0.99.1", "the newest it knows is 0.5.23"),
    ("0.0.1", "the oldest it knows is 0.5.20"),
])
def test_a_release_outside_the_matrix_is_refused_naming_the_nearest(tmp_path, flag_matrix,
                                                                     version, nearest):
    doc = small_pd()
    doc["engine"]["version"] = version
    assert version not in flag_matrix
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, doc)
    assert e.value.field == "engine.version" and e.value.line is not None
    assert f"SGLang '{version}' is not in hpcserve's flag matrix ({nearest})" in e.value.message
    assert "engine.check_flags_as: newest" in e.value.message


@pytest.mark.parametrize("check_as,used", [("newest", "0.5.23"), ("0.5.22", "0.5.22")])
def test_check_flags_as_accepts_a_release_outside_the_matrix(tmp_path, check_as, used):
    doc = small_pd()
    doc["engine"].update(version="0.5.22.post9", check_flags_as=check_as)
    plan = plan_of(tmp_path, doc)
    assert plan.version == "0.5.22.post9"
    assert plan.warnings[0] == (f"SGLang 0.5.22.post9 is not in hpcserve's flag matrix: its "
                                f"flags are checked against {used} (engine.check_flags_as: "
                                f"{check_as})")
    # a release the matrix has needs no such setting and gets no warning
    doc["engine"]["version"] = "0.5.22"
    assert not any("flag matrix" in w for w in plan_of(tmp_path, doc, "known.yaml").warnings)


def test_check_flags_as_must_name_a_known_release(tmp_path):
    doc = small_pd()
    doc["engine"].update(version="0.5.22.post9", check_flags_as="0.5.19")
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, doc)
    assert e.value.field == "engine.check_flags_as"
    assert "(the oldest it knows is 0.5.20)" in e.value.message


@pytest.mark.parametrize("field", ["version", "check_flags_as"])
def test_a_release_only_in_the_table_is_refused_naming_the_accepted(tmp_path, field):
    """0.5.9 is in the flag table but no test can load its parser: refused in one line."""
    doc = small_pd()
    doc["engine"].update({"version": "0.5.22.post9", field: "0.5.9"})
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, doc)
    assert e.value.field == f"engine.{field}" and e.value.line is not None
    assert e.value.message.endswith(
        "0.5.9' is no longer accepted: hpcserve's tests cannot check its flags with its own "
        "parser; the releases it accepts are 0.5.20, 0.5.21, 0.5.22, 0.5.23"), e.value.message


def test_leader_and_rank_are_task_variables(tmp_path):
    plan = plan_of(tmp_path, small_pd())
    (d,) = [i for i in plan.instances if i.role == "decode"]
    argv = list(d.argv)
    assert argv[argv.index("--node-rank") + 1] == (Var("NODE_RANK"),)
    assert argv[argv.index("--host") + 1] == (Var("NODE_IP"),)
    assert argv[argv.index("--dist-init-addr") + 1] == (Var("LEADER_IP"), f":{d.port_of('dist_init')}")


def test_no_ib_means_tcp_for_mooncake(tmp_path):
    doc = small_pd()
    doc["site"]["network"]["ib_devices"] = None
    plan = plan_of(tmp_path, doc)
    for i in plan.instances:
        env = dict(i.env)
        assert env["MC_FORCE_TCP"] == "1" and "NCCL_IB_HCA" not in env
        assert "--disaggregation-ib-device" not in i.argv
    doc["site"]["network"]["ib_devices"] = "auto"
    plan = plan_of(tmp_path, doc, "d2.yaml")
    for i in plan.instances:
        assert dict(i.env)["NCCL_IB_HCA"] == (Var("IB_DEVICES"),)
        assert i.argv[list(i.argv).index("--disaggregation-ib-device") + 1] == (Var("IB_DEVICES"),)


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "enroot"])
def test_model_path_must_be_mountable(tmp_path, runtime):
    """The model path is bind-mounted at the same path: mount syntax cannot hold , : or spaces."""
    doc = small_pd(runtime)
    for bad in ("/models/a b", "/models/a,b", "/models/a:b", "models/relative"):
        doc["model"]["path"] = bad
        with pytest.raises(ConfigError) as e:
            plan_of(tmp_path, doc)
        assert e.value.field == "model.path" and e.value.line, str(e.value)
        assert e.value.file == str(tmp_path / "deploy.yaml")
    # a site mount that covers it mounts it instead: then any path under it is fine
    doc["site"]["container"]["mounts"] = ["/models:/models"]
    doc["model"]["path"] = "/models/a b"
    assert plan_of(tmp_path, doc).model_path == "/models/a b"
    # no container: nothing is mounted
    doc = small_pd("none")
    doc["model"]["path"] = "models/a b,c:d"
    assert plan_of(tmp_path, doc).model_path == "models/a b,c:d"


def test_a_port_shift_moves_every_port_the_file_does_not_set(tmp_path):
    from hpcserve.author import config, plan as planner
    doc = small_pd()
    doc["roles"]["decode"]["dist_init_port"] = 42000
    doc["router"] = {"prometheus_port": 29500}
    cfg = config.load(write_yaml(tmp_path / "d.yaml", doc))
    base, moved = planner.build(cfg), planner.build(cfg, port_shift=40)
    for a, b in zip(base.instances, moved.instances):
        for (kind, pa), (_, pb) in zip(a.ports, b.ports):
            set_in_file = a.role == "decode" and kind == "dist_init"
            assert pb == (pa if set_in_file else pa + 40), (a.name, kind)
        assert _opt(b.argv, "--port") == str(a.port + 40)
    assert (moved.router.port, moved.router.prometheus_port) == (base.router.port + 40, 29500)
    # the router's worker URLs follow the engines
    assert f":{base.instances[0].port + 40}" in " ".join(show(w, {}) for w in moved.router.argv)
    _assert_no_collision(moved)
