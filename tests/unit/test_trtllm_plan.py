"""The TensorRT-LLM adapter: every argv it writes is accepted by a click command built from the
release's extracted option table (click itself parses, as trtllm-serve's does); the LLM API
options file holds only the release's fields; the front server's config, as the router's task
writes it, is what `trtllm-serve disaggregated` reads; topology and Slurm request; refusals."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click
import pytest
import yaml

from hpcserve.engines import trtllm
from hpcserve.errors import ConfigError
from hpcserve.author.render import render_files
from hpcserve.author.words import show
from unitkit import ROOT, plan_of, sbatch_components, small_site

TABLE = trtllm.ADAPTER.matrix.versions()["1.3.0rc3"]
EXAMPLES = [ROOT / "examples" / f"{n}.yaml" for n in ("trtllm-kimi-k2-tp16",
                                                      "trtllm-kimi-k2-disagg")]


def serve_command(table: dict) -> click.Command:
    """`trtllm-serve serve` as click sees it: every option of the table, its choices, its
    bare flags; MODEL positional."""
    params = [click.Argument(["model"])]
    for flag in table["flags"]:
        name = flag.lstrip("-").replace("-", "_")
        if flag in table["bare"]:
            params.append(click.Option([flag, name], is_flag=True))
        else:
            ch = table["choices"].get(flag)
            params.append(click.Option([flag, name], type=click.Choice(ch) if ch else str))
    return click.Command("serve", params=params, callback=lambda **kw: kw)


def parse(argv: list[str]) -> dict:
    assert argv[0] == "serve"
    return serve_command(TABLE).main(args=argv[1:], standalone_mode=False)


def trt_doc(roles: dict, **over) -> dict:
    d = {"name": "t", "site": small_site(),
         "model": {"profile": "kimi-k2-instruct", "path": "/models/k2", "served_name": "k2"},
         "engine": {"name": "trtllm", "version": "1.3.0rc3"}, "roles": roles,
         "router": {"enabled": False}}
    d.update(over)
    return d


VALS = {"NODE_IP": "10.0.0.1", "JOB_DIR": "/jobs/j"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_argv_parses_with_the_release_option_table(example):
    from hpcserve.author import config, plan
    p = plan.build(config.load(example))
    for inst in p.instances:
        v = parse([show(w, VALS) for w in inst.argv])
        assert v["host"] == "10.0.0.1" and int(v["port"]) == inst.port
        assert int(v["tp_size"]) == inst.size("tp")
        assert int(v["ep_size"]) == inst.size("ep")
        assert v["extra_llm_api_options"] == f"/jobs/j/llm-api/{inst.role}.yaml"
        assert v["tool_parser"] == "kimi_k2" and v["trust_remote_code"]
        # one MPI rank per GPU of each of the instance's nodes
        assert inst.tasks_per_node * inst.nodes == inst.size("tp") and inst.mpi == "pmix"


def test_the_seed_example_keeps_the_guides_values():
    from hpcserve.author import config, plan
    p = plan.build(config.load(EXAMPLES[0]))
    (inst,) = p.instances
    v = parse([show(w, VALS) for w in inst.argv])
    assert (v["backend"], v["kv_cache_free_gpu_memory_fraction"]) == ("pytorch", "0.95")
    assert (v["max_batch_size"], v["max_num_tokens"]) == ("128", "4096")
    api = yaml.safe_load(dict(p.files)["llm-api/worker.yaml"])
    assert api == {"cuda_graph_config": {"enable_padding": True,
                                         "batch_sizes": [1, 2, 4, 8, 16, 32, 64, 128]},
                   "print_iter_log": True, "enable_attention_dp": True}
    # 2 nodes x 8 ranks: the allocation has room for the step's 8 tasks per node
    (comp,) = sbatch_components(render_files(p, "/jobs/j")["job.sbatch"][0])
    assert "--ntasks-per-node=8" in comp and "--nodes=2" in comp


def test_options_files_hold_only_the_release_fields():
    from hpcserve.author import config, plan
    fields = set(TABLE["llm_api"]["fields"])
    p = plan.build(config.load(EXAMPLES[1]))
    files = dict(p.files)
    for role in ("prefill", "decode"):
        api = yaml.safe_load(files[f"llm-api/{role}.yaml"])
        assert set(api) <= fields, set(api) - fields
        assert api["cache_transceiver_config"] == {"backend": "UCX", "max_tokens_in_buffer": 8448}
        assert set(api.get("cuda_graph_config", {})) <= set(TABLE["llm_api"]["cuda_graph_config"])
    assert yaml.safe_load(files["llm-api/prefill.yaml"])["disable_overlap_scheduler"] is True


def test_front_server_config_as_the_router_task_writes_it(tmp_path):
    """Run the rendered router script's printf with the discovered addresses: the file is the
    disaggregated server's grammar, and its command has the deployment's start timeout."""
    from hpcserve.author import config, plan
    p = plan.build(config.load(EXAMPLES[1]))
    jd = tmp_path / "job"
    files = render_files(p, str(jd))
    script = files["launch/router.sh"][0]
    block = script[script.index("printf '%s\\n'"):script.index('>"$JOB_DIR/run/disagg.yaml"')]
    out = subprocess.run(["bash", "-c", "PREFILL_0_IP=10.1.0.1 DECODE_0_IP=10.1.0.2 "
                                        "ROUTER_IP=10.1.0.1\n" + block],
                         capture_output=True, text=True, check=True).stdout
    cfg = yaml.safe_load(out)
    # it listens on its node's address (run/endpoints.env's ROUTER_IP), not on every one
    assert cfg == {"hostname": "10.1.0.1", "port": 8000,
                   "context_servers": {"num_instances": 1, "urls": ["10.1.0.1:8200"]},
                   "generation_servers": {"num_instances": 1, "urls": ["10.1.0.2:8200"]}}
    argv = [show(w, {"JOB_DIR": str(jd)}) for w in p.router.command + p.router.argv]
    assert argv == ["trtllm-serve", "disaggregated", "-c", f"{jd}/run/disagg.yaml",
                    "-t", "5400"]
    assert set(TABLE["disagg_config"]["top"]) >= set(cfg)


def test_simulated_router_is_the_stand_in_of_the_front_server(tmp_path):
    doc = yaml.safe_load(EXAMPLES[1].read_text())
    doc["engine"]["simulate"] = True
    p = plan_of(tmp_path, doc)
    assert [show(w, {"JOB_DIR": "/j"}) for w in p.router.command] == \
        ["python3", "/j/hpcserve_sim.py", "disaggregated"]
    files = render_files(p, "/j")
    assert "hpcserve_sim.py" in files and "hpcserve_simcore.py" in files


@pytest.mark.parametrize("roles, key, text", [
    ({"worker": {"nodes": 2, "tp": 8}}, "roles.worker.tp",
     "tp 8 must equal the instance's 16 GPUs (nodes 2 x 8 GPUs per node)"),
    ({"worker": {"ep": 3}}, "roles.worker.ep", "ep 3 must divide tp 8"),
    ({"worker": {"cache_transceiver": "UCX"}}, "roles.worker.cache_transceiver",
     "disaggregated serving"),
    ({"worker": {"llm_api": {"cuda_graph_config": {"padding_enabled": True}}}},
     "roles.worker.llm_api.cuda_graph_config.padding_enabled", "did you mean enable_padding"),
    ({"worker": {"llm_api": {"enable_attention_dp": True}}},
     "roles.worker.llm_api.enable_attention_dp", "use the setting attention_dp"),
    ({"worker": {"llm_api": {"kv_cache_free_gpu_memory_fraction": 0.9}}},
     "roles.worker.llm_api.kv_cache_free_gpu_memory_fraction", "has no LLM API option"),
    ({"worker": {"args": {"tp_size": 4}}}, "roles.worker.args.tp_size", "set by hpcserve"),
    ({"worker": {"args": {"no_such_option": 1}}}, "roles.worker.args.no_such_option",
     "has no --no_such_option"),
    ({"worker": {"backend": "onnx"}}, "roles.worker.backend", "not a valid --backend"),
])
def test_refusals_name_the_field(tmp_path, roles, key, text):
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, trt_doc(roles))
    assert e.value.field == key and text in e.value.message, (e.value.field, e.value.message)


def test_plain_deployment_cannot_have_the_front_server(tmp_path):
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, trt_doc({"worker": {}}, router={"enabled": True}))
    assert e.value.field == "router.enabled"
    assert "needs context and generation servers" in e.value.message


def test_an_older_release_is_refused_or_checked_against_the_table_on_request(tmp_path):
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, trt_doc({"worker": {}}, engine={"name": "trtllm", "version": "1.2.1"}))
    assert e.value.field == "engine.version"
    assert "(the oldest it knows is 1.3.0rc3)" in e.value.message
    p = plan_of(tmp_path, trt_doc({"worker": {}}, engine={
        "name": "trtllm", "version": "1.2.1", "check_flags_as": "newest"}), "newest.yaml")
    assert p.warnings[0].endswith("checked against 1.3.0rc3 (engine.check_flags_as: newest)")


def test_sim_tables_equal_the_extracted_ones():
    """The stand-in refuses exactly what the table does."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("trtsim", Path(trtllm.__file__).parents[1]
                                                  / "sim" / "trtllm.py")
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    assert sim.SERVE_OPTIONS == set(TABLE["flags"])
    assert sim.SERVE_BARE == set(TABLE["bare"])
    assert sim.LLM_API_FIELDS == set(TABLE["llm_api"]["fields"])
    assert set(sim.TRANSCEIVER_BACKENDS) == set(TABLE["llm_api"]["cache_transceiver_backends"])
    assert {k for k in sim.DISAGG_OPTIONS if k.startswith("--")} == \
        set(TABLE["disaggregated"]["flags"])
    assert sim.TRTLLM_VERSION == "1.3.0rc3"
