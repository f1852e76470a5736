"""KTransformers both ways: kt-kernel inside SGLang with the CPU side planned (threads from the
node's cores and NUMA nodes, every CPU in the Slurm request, the CPU experts' host memory and
what leaves the GPUs), and the legacy server of the releases that ship it, its argv accepted by
an argparse parser built from the release's extracted options."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from hpcserve.engines import ktransformers as kt
from hpcserve.errors import ConfigError
from hpcserve.author.render import render_files
from hpcserve.author.words import show
from unitkit import ROOT, plan_of, sbatch_components, small_site

CPU_NODE = {"gpus": 8, "gpu_memory_gb": 141, "cpu_cores": 64, "cpus": 128, "numa_nodes": 2,
            "memory_gb": 1024}


def kt_doc(worker: dict, node: dict | None = None, **over) -> dict:
    d = {"name": "t", "site": small_site(node={**CPU_NODE, **(node or {})}),
         "model": {"profile": "kimi-k2-thinking", "path": "/models/k2t", "served_name": "k2t"},
         "engine": {"name": "ktransformers", "version": "0.5.23"},
         "roles": {"worker": {"kt_weight_path": "/models/k2t-cpu", "kt_method": "AMXINT4",
                              **worker}}}
    d.update(over)
    return d


def _flags(inst) -> dict:
    words = [show(w, {"NODE_IP": "10.0.0.1"}) for w in inst.argv]
    return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--kt-")}


def test_cpu_threads_from_cores_minus_gpus_and_pools_per_numa_node(tmp_path):
    p = plan_of(tmp_path, kt_doc({"kt_num_gpu_experts": 100}))
    (inst,) = p.instances
    assert _flags(inst) == {"--kt-weight-path": "/models/k2t-cpu", "--kt-method": "AMXINT4",
                            "--kt-cpuinfer": "56", "--kt-threadpool-count": "2",
                            "--kt-num-gpu-experts": "100"}
    assert inst.size("cpu_threads") == 56
    files = render_files(p, "/jobs/j")
    (comp,) = sbatch_components(files["job.sbatch"][0])
    assert "--cpus-per-task=128" in comp
    step = files["steps/worker-0.sh"][0]
    assert "--cpus-per-task=128 \\\n  --cpu-bind=none" in step  # srun 22.05 needs it again


def test_explicit_threads_win_and_too_many_are_refused(tmp_path):
    p = plan_of(tmp_path, kt_doc({"kt_cpuinfer": 40, "kt_threadpool_count": 4}))
    assert _flags(p.instances[0])["--kt-cpuinfer"] == "40"
    assert _flags(p.instances[0])["--kt-threadpool-count"] == "4"
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, kt_doc({"kt_cpuinfer": 65}))
    assert e.value.field == "roles.worker.kt_cpuinfer" and "64 physical cores" in e.value.message


def test_unknown_cores_need_an_explicit_thread_count(tmp_path):
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, kt_doc({}, node={"cpu_cores": None, "cpus": None}))
    assert e.value.field == "roles.worker.kt_cpuinfer"
    assert "site.node.cpu_cores" in e.value.message


def test_host_memory_is_checked_against_the_cpu_experts(tmp_path):
    # Kimi-K2-Thinking: 384 experts x 60 MoE layers x 3 x 7168 x 2048 = 1015B expert
    # parameters; 284 of 384 per layer on the CPUs in AMXINT4 (0.5 byte) = 375 GB
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, kt_doc({"kt_num_gpu_experts": 100}, node={"memory_gb": 256}))
    assert e.value.field == "roles.worker.kt_method"
    assert "284 CPU experts per layer take 375 GB" in e.value.message
    assert "1015B expert parameters" in e.value.message and "256 GB" in e.value.message
    assert plan_of(tmp_path, kt_doc({"kt_num_gpu_experts": 100}, node={"memory_gb": 400}))


def test_the_cpu_experts_memory_is_requested_unless_the_site_asks_its_own(tmp_path):
    p = plan_of(tmp_path, kt_doc({"kt_num_gpu_experts": 100}))
    (comp,) = sbatch_components(render_files(p, "/jobs/j")["job.sbatch"][0])
    assert "--mem=413G" in comp  # 375.2 GB of AMXINT4 experts and a tenth more
    site = small_site(node=CPU_NODE)
    site["slurm"]["mem"] = "0"
    p = plan_of(tmp_path, kt_doc({"kt_num_gpu_experts": 100}, site=site))
    (comp,) = sbatch_components(render_files(p, "/jobs/j")["job.sbatch"][0])
    assert [c for c in comp if c.startswith("--mem")] == ["--mem=0"]


def test_experts_on_the_cpus_leave_the_gpus(tmp_path):
    """Kimi-K2-Instruct FP8 (1026 GB) does not fit 8 x 80 GiB for SGLang, but with every routed
    expert on the CPUs (1015 GB of it) the GPUs hold 11 GB."""
    doc = kt_doc({"kt_num_gpu_experts": 0}, node={"gpu_memory_gb": 80, "memory_gb": 2048})
    doc["model"]["profile"] = "kimi-k2-instruct"
    assert plan_of(tmp_path, doc)
    doc["engine"] = {"name": "sglang", "version": "0.5.23"}
    doc["roles"] = {"worker": {}}
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, doc)
    assert "do not fit" in e.value.message


@pytest.mark.parametrize("worker, key, text", [
    ({"kt_weight_path": None}, "roles.worker.kt_weight_path", "needs kt_weight_path"),
    ({"nodes": 2}, "roles.worker.nodes", "one node's CPUs"),
    ({"kt_method": "AMX4"}, "roles.worker.kt_method", "AMXINT4"),
    ({"args": {"kt-cpuinfer": 8}}, "roles.worker.args.kt-cpuinfer", "set by hpcserve"),
])
def test_refusals_name_the_field(tmp_path, worker, key, text):
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, kt_doc(worker))
    assert e.value.field == key and text in e.value.message, (e.value.field, e.value.message)


def test_an_sglang_release_only_in_the_table_is_refused(tmp_path):
    # SGLang 0.5.4.post3 spelled --kt-amx-*; its parser cannot be loaded to check them
    # (hpcserve/engines/sglang.py CHECKED), so KTransformers refuses it as SGLang does.
    model = {"profile": "kimi-k2-instruct", "path": "/models/k2", "served_name": "k2"}
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, kt_doc({"kt_cpuinfer": 8}, model=model,
                                 engine={"name": "ktransformers", "version": "0.5.4.post3"}))
    assert e.value.field == "engine.version", e.value.field
    assert "'0.5.4.post3' is no longer accepted" in e.value.message, e.value.message


# --------------------------------------------------------------------------- legacy server

LEGACY = ROOT / "examples" / "ktransformers-legacy-kimi-k2.yaml"


def legacy_parser(version: str) -> argparse.ArgumentParser:
    """ktransformers/server/args.py's parser as the extracted table describes it."""
    t = kt.LEGACY_ADAPTER.matrix.versions()[version]
    p = argparse.ArgumentParser(exit_on_error=False)
    for flag in t["flags"]:
        dest = flag.lstrip("-").replace("-", "_")
        if flag in t["bare"]:
            p.add_argument(flag, action="store_true", dest=dest)
        else:
            typ = {"int": int, "float": float}.get(t["types"].get(flag), str)
            p.add_argument(flag, type=typ, choices=t["choices"].get(flag), dest=dest)
    return p


def test_the_seed_command_parses_with_the_release_parser():
    from hpcserve.author import config, plan
    p = plan.build(config.load(LEGACY))
    (inst,) = p.instances
    ns = legacy_parser("0.4.1").parse_args([show(w, {"NODE_IP": "10.0.0.5"})
                                            for w in inst.argv])
    assert (ns.host, ns.port) == ("10.0.0.5", 10002)
    assert (ns.model_path, ns.gguf_path) == ("/lustre/models/Kimi-K2-Instruct-GGUF",) * 2
    assert (ns.cache_lens, ns.max_new_tokens, ns.chunk_size, ns.max_batch_size) == \
        (30000, 1024, 256, 4)
    assert ns.backend_type == "balance_serve" and ns.model_name == "kimi-k2"
    assert ns.cpu_infer == 112 - 8
    home = dict(inst.env)["HOME"]
    assert show(home, {"JOB_DIR": "/j", "SLURMD_NODENAME": "n1"}) == "/j/run/ktransformers-home/n1"


def test_type_bool_options_get_a_true_value(tmp_path):
    doc = {"name": "t", "site": small_site(node=CPU_NODE),
           "model": {"profile": "kimi-k2-instruct", "path": "/m"},
           "engine": {"name": "ktransformers_legacy", "version": "0.4.1"},
           "roles": {"worker": {"gguf_path": "/g", "args": {"web": True, "json_mode": False}}},
           "router": {"enabled": False}}
    words = [show(w) for w in plan_of(tmp_path, doc).instances[0].argv]
    assert words[words.index("--web") + 1] == "True" and "--json_mode" not in words
    ns = legacy_parser("0.4.1").parse_args([show(w, {"NODE_IP": "1.2.3.4"}) for w in
                                            plan_of(tmp_path, doc).instances[0].argv])
    assert ns.web == "True"


def test_before_0_2_4_the_backend_is_spelled_type(tmp_path):
    doc = {"name": "t", "site": small_site(node=CPU_NODE),
           "model": {"profile": "kimi-k2-instruct", "path": "/m"},
           "engine": {"name": "ktransformers_legacy", "version": "0.2.3"},
           "roles": {"worker": {"gguf_path": "/g", "backend_type": "ktransformers"}},
           "router": {"enabled": False}}
    words = [show(w) for w in plan_of(tmp_path, doc).instances[0].argv]
    assert words[words.index("--type") + 1] == "ktransformers"
    legacy_parser("0.2.3").parse_args([show(w, {"NODE_IP": "1.2.3.4"}) for w in
                                       plan_of(tmp_path, doc).instances[0].argv])


@pytest.mark.parametrize("version, text", [
    ("0.4.2", "KTransformers 0.4.2 has no legacy server"),
    ("0.7.0", "KTransformers 0.7.0 has no legacy server"),
    ("0.7.2", "KTransformers '0.7.2' is not in hpcserve's flag matrix (the newest it knows is "
              "0.7.0)"),
    ("0.1.4", "predates --cache_lens"),
])
def test_releases_without_the_server_are_refused(tmp_path, version, text):
    doc = {"name": "t", "site": small_site(node=CPU_NODE),
           "model": {"profile": "kimi-k2-instruct", "path": "/m"},
           "engine": {"name": "ktransformers_legacy", "version": version},
           "roles": {"worker": {"gguf_path": "/g"}}, "router": {"enabled": False}}
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, doc)
    assert e.value.field == "engine.version" and text in e.value.message


def test_legacy_server_has_no_router(tmp_path):
    doc = {"name": "t", "site": small_site(node=CPU_NODE),
           "model": {"profile": "kimi-k2-instruct", "path": "/m"},
           "engine": {"name": "ktransformers_legacy", "version": "0.4.1"},
           "roles": {"worker": {"gguf_path": "/g"}}}
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, doc)
    assert e.value.field == "router.enabled" and "set router.enabled: false" in e.value.message


def test_legacy_sim_table_equals_the_extracted_one():
    spec = importlib.util.spec_from_file_location(
        "ktsim", Path(kt.__file__).parents[1] / "sim" / "ktransformers_legacy.py")
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    assert sim.KT_VERSION in sim.TABLES
    for version in sim.TABLES:
        t = kt.LEGACY_ADAPTER.matrix.versions()[version]
        opts = sim.options(version)
        flags = {o for o, kind in opts.items() if kind == "flag"}
        assert set(opts) | {"--no-" + o[2:] for o in flags} == set(t["flags"]), version
        assert flags | {"--no-" + o[2:] for o in flags} == set(t["bare"]), version
        assert {o: ("bool" if k == "flag" else k) for o, k in opts.items()} == \
            {o: k for o, k in t["types"].items()}, version
