"""Broken deployment files: the CLI refuses each with one line naming file:line and the field.

Each case is a deployment file whose offending line carries the marker `#<` (the expected line
number is computed from it), run as `hpcserve render FILE --out DIR` in a subprocess: exit code
2, stderr exactly one line `hpcserve: error: FILE:LINE: FIELD: message`, no traceback, nothing
written to DIR.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from unitkit import ROOT

BASE_HEAD = """name: broken
site: local
model:
  profile: deepseek-v3
  path: /models/dsv3
"""
PD = """roles:
  prefill:
    nodes: 1
  decode:
    nodes: 2
"""


@dataclass
class Case:
    name: str
    text: str
    field: str | None          # the field path the message names (None: the error has none)
    message: list[str]         # substrings of the message
    sets: list[str] = field(default_factory=list)
    where: str | None = None   # "--set:N" instead of FILE:LINE


CASES = [
    Case("recovery_min_serving_above_instances", BASE_HEAD + """roles:
  prefill:
    nodes: 1
  decode:
    instances: 2
    recovery:
      min_serving: 3  #<
""", "roles.decode.recovery.min_serving", ["3 instances of decode must serve",
                                          "the role has 2"]),
    Case("recovery_negative_backoff", BASE_HEAD + """roles:
  prefill:
    nodes: 1
  decode:
    recovery:
      backoff_s: -1  #<
""", "roles.decode.recovery.backoff_s", ["-1"]),
    Case("recovery_unknown_key", BASE_HEAD + """roles:
  prefill:
    nodes: 1
  decode:
    recovery:
      restarts: 2  #<
""", "roles.decode.recovery.restarts", ["max_restarts"]),
    Case("spares_not_a_count", BASE_HEAD + """roles:
  prefill:
    nodes: 1
    spares: two  #<
  decode:
    nodes: 1
""", "roles.prefill.spares", ["two"]),
    Case("benchmark_empty_sweep", BASE_HEAD + PD + "benchmark:\n  concurrency: []  #<\n",
         "benchmark.concurrency", ["give at least one point"]),
    Case("benchmark_zero_concurrency", BASE_HEAD + PD + "benchmark:\n  concurrency: [4, 0]  #<\n",
         "benchmark.concurrency[1]", ["must be above 0", "not 0"]),
    Case("benchmark_unknown_client", BASE_HEAD + PD + "benchmark:\n  client: vllmx  #<\n",
         "benchmark.client", ["expected one of auto, sglang, vllm, trtllm"]),
    Case("benchmark_without_one_address", BASE_HEAD + """roles:
  worker:
    instances: 2
router:
  enabled: false
benchmark: {}  #<
""", "benchmark", ["the benchmark needs one address to measure: enable the router"]),
    Case("unknown_nested_key", BASE_HEAD + """roles:
  prefill:
    nodes: 1
  decode:
    nodez: 2  #<
""", "roles.decode.nodez", ["unknown key 'nodez'", "did you mean 'nodes'?",
                            "; 33 keys are valid here: see `hpcserve schema deployment`"]),
    Case("unknown_top_level_key", BASE_HEAD + "nmae: x  #<\n" + PD, "nmae",
         ["unknown key 'nmae'", "did you mean 'name'?"]),
    Case("unknown_key_in_inline_site", """name: broken
site:
  base: local
  slurm:
    partiton: gpu  #<
model:
  profile: deepseek-v3
  path: /models/dsv3
""" + PD, "site.slurm.partiton", ["unknown key 'partiton'", "did you mean 'partition'?"]),
    Case("wrong_type", BASE_HEAD + """roles:
  prefill:
    nodes: 1
  decode:
    nodes: two  #<
""", "roles.decode.nodes", ["expected an integer, got the string 'two'"]),
    Case("decode_nodes_zero", BASE_HEAD + """roles:
  prefill:
    nodes: 1
  decode:
    nodes: 0  #<
""", "roles.decode.nodes", ["must be at least 1, got 0"]),
    Case("tp_not_matching_gpus", BASE_HEAD + """roles:
  prefill:
    nodes: 1
  decode:
    nodes: 2
    tp: 12  #<
""", "roles.decode.tp", ["tp 12 must equal the instance's 16 GPUs (nodes 2 x 8 GPUs per node)"]),
    Case("attn_dp_not_dividing_tp", BASE_HEAD + """roles:
  prefill:
    nodes: 1
  decode:
    nodes: 2
    attn_dp: 3  #<
""", "roles.decode.attn_dp", ["attn_dp 3 must divide tp 16"]),
    Case("more_nodes_than_site_max", BASE_HEAD + """roles:  #<
  prefill:
    nodes: 2
  decode:
    nodes: 4
""", "roles", ["needs 6 nodes (2 prefill + 4 decode)", "allows 4", "max_nodes"]),
    Case("newline_in_string", BASE_HEAD.replace("  path: /models/dsv3\n", """  path: /models/dsv3
  served_name: "kimi\\nk2"  #<
""") + PD, "model.served_name", ["control character '\\n' is not allowed"]),
    Case("tab_in_string", BASE_HEAD + PD + 'env:\n  FOO: "a\\tb"  #<\n', "env.FOO",
         ["control character '\\t' is not allowed"]),
    Case("escape_char_in_string", BASE_HEAD.replace("  path: /models/dsv3\n",
                                                    '  path: "/models/\\e[31mred"  #<\n') + PD,
         "model.path", ["control character '\\x1b' is not allowed"]),
    Case("removed_sglang_flag", BASE_HEAD + """roles:
  prefill:
    nodes: 1
    args:
      enable-deepep-moe: true  #<
  decode:
    nodes: 2
""", "roles.prefill.args.enable-deepep-moe",
         ["SGLang 0.5.23 has no --enable-deepep-moe", "moe_a2a_backend: deepep"]),
    Case("owned_flag_in_args", BASE_HEAD + """roles:
  prefill:
    nodes: 1
    args:
      tp-size: 8  #<
  decode:
    nodes: 2
""", "roles.prefill.args.tp-size", ["--tp-size is set by hpcserve", "use tp instead"]),
    Case("invalid_choice_schema", BASE_HEAD + """roles:
  prefill:
    nodes: 1
    deepep_mode: fast  #<
  decode:
    nodes: 2
""", "roles.prefill.deepep_mode", ["expected one of auto, normal, low_latency",
                                   "got the string 'fast'"]),
    Case("invalid_choice_engine", BASE_HEAD + """roles:
  prefill:
    nodes: 1
    moe_a2a_backend: deeppe  #<
  decode:
    nodes: 2
""", "roles.prefill.moe_a2a_backend",
         ["'deeppe' is not a valid --moe-a2a-backend in SGLang 0.5.23", "choices:", "deepep"]),
    Case("invalid_choice_in_args", BASE_HEAD + """roles:
  prefill:
    nodes: 1
    args:
      ep-dispatch-algorithm: fastest  #<
  decode:
    nodes: 2
""", "roles.prefill.args.ep-dispatch-algorithm",
         ["'fastest' is not a valid --ep-dispatch-algorithm", "dynamic"]),
    Case("missing_required_key", """name: broken
site: local
model:  #<
  profile: deepseek-v3
""" + PD, "model", ["missing required key 'path'"]),
    Case("duplicate_key", BASE_HEAD + PD + "name: again  #<\n", "name",
         ["duplicate key 'name'"]),
    Case("bad_yaml_indentation", BASE_HEAD + """roles:
  prefill: {nodes: 1}
   decode: {nodes: 2}  #<
""", None, ["not valid YAML"]),
    Case("bad_yaml_mapping", "name: broken: x  #<\n" + BASE_HEAD[len("name: broken\n"):] + PD,
         None, ["not valid YAML", "mapping values are not allowed"]),
    Case("unknown_site", BASE_HEAD.replace("site: local\n", "site: nosuch-site  #<\n") + PD,
         "site", ["no site named 'nosuch-site'", "known:", "local", "dgx-h200-pyxis"]),
    Case("unknown_profile", BASE_HEAD.replace("  profile: deepseek-v3\n",
                                              "  profile: nosuch-model  #<\n") + PD,
         "model.profile", ["no model profile named 'nosuch-model'", "kimi-k2-instruct"]),
    Case("unknown_role", BASE_HEAD + """roles:
  prefill:
    nodes: 1
  decode:
    nodes: 2
  prefil:  #<
    nodes: 1
""", "roles.prefil", ["unknown role"]),
    Case("prefill_without_decode", BASE_HEAD + """roles:  #<
  prefill:
    nodes: 1
""", "roles", ["needs both prefill and decode", "decode is missing"]),
    Case("bad_env_name", BASE_HEAD + PD + "env:\n  BAD-NAME: 1  #<\n", "env.BAD-NAME",
         ["does not match"]),
    Case("bad_mount", """name: broken
site:
  base: local
  container:
    runtime: pyxis
    image: img
    mounts:
      - /a,/b:/c  #<
""" + BASE_HEAD[len("name: broken\nsite: local\n"):] + PD, "site.container.mounts[0]",
         ["expected a mount SRC:DST", "got '/a,/b:/c'"]),
    Case("bad_set_syntax", BASE_HEAD + PD, None, ["expected KEY.PATH=VALUE",
                                                  "'roles.decode.nodes'"],
         sets=["roles.decode.tp=16", "roles.decode.nodes"], where="--set roles.decode.nodes"),
    Case("bad_set_value", BASE_HEAD + PD, "roles.decode.nodes", ["must be at least 1, got 0"],
         sets=["roles.decode.nodes=0"], where="--set roles.decode.nodes=0"),
    Case("bad_set_on_named_site", BASE_HEAD + PD, "site.slurm.max_nodes",
         ["expected an integer or null, got the string 'zero'"],
         sets=["site.slurm.partition=gpu", "site.slurm.max_nodes=zero"],
         where="--set site.slurm.max_nodes=zero"),
    Case("owned_extra_directive", """name: broken
site:
  base: local
  slurm:
    extra_directives:
      nodes: 99  #<
model:
  profile: deepseek-v3
  path: /models/dsv3
""" + PD, "site.slurm.extra_directives.nodes", ["--nodes is set by hpcserve"]),
    Case("owned_router_flag", BASE_HEAD + PD + """router:
  args:
    port: 9000  #<
""", "router.args.port", ["--port is set by hpcserve"]),
    Case("mini_lb_router", BASE_HEAD + PD + """router:
  args:
    mini-lb: true  #<
""", "router.args.mini-lb", ["--mini-lb", "cannot be started by hpcserve"]),
    Case("pd_without_router", BASE_HEAD + PD + """router:
  enabled: false  #<
""", "router.enabled", ["needs the router"]),
    Case("interface_with_space", """name: broken
site:
  base: local
  network:
    interface: "eth 0"  #<
model:
  profile: deepseek-v3
  path: /models/dsv3
""" + PD, "site.network.interface", ["an interface name"]),
    # Found by trying as a user would (hostile or careless input): refused in one line, at once.
    Case("absurd_instance_count", BASE_HEAD + """roles:
  worker:
    instances: 100000000000  #<
""", "roles.worker.instances", ["must be at most 100000"]),
    Case("absurd_node_count", BASE_HEAD + """roles:
  worker:
    nodes: 99999999999  #<
""", "roles.worker.nodes", ["must be at most 100000"]),
    Case("nan_number", BASE_HEAD + """roles:
  worker:
    nodes: 1
    mem_fraction_static: .nan  #<
""", "roles.worker.mem_fraction_static", ["expected a finite number, got nan"]),
    Case("empty_list_needs_values", BASE_HEAD + """roles:
  worker:
    nodes: 1
    cuda_graph_bs: []  #<
""", "roles.worker.cuda_graph_bs", ["needs at least 1 item(s), got 0"]),
    Case("non_positive_list_item", BASE_HEAD + """roles:
  worker:
    nodes: 1
    cuda_graph_bs: [8, 0]  #<
""", "roles.worker.cuda_graph_bs[1]", ["must be at least 1, got 0"]),
    Case("empty_list_arg", BASE_HEAD + """roles:
  worker:
    nodes: 1
    args:
      cuda-graph-bs-prefill: []  #<
""", "roles.worker.args.cuda-graph-bs-prefill", ["an empty list gives --cuda-graph-bs-prefill no value"]),
    Case("slurm_filename_pattern_in_jobs_dir", BASE_HEAD + PD + "jobs_dir: /scratch/%x/jobs  #<\n",
         "jobs_dir", ["without % or \\", "filename patterns in --output",
                      "got '/scratch/%x/jobs'"]),
    Case("option_like_interface", """name: broken
site:
  base: local
  network:
    interface: --help  #<
model:
  profile: deepseek-v3
  path: /models/dsv3
""" + PD, "site.network.interface", ["not starting with -"]),
    # The line named is the anchor whose copies exhaust the budget: that is where the bomb is.
    Case("alias_bomb", "name: broken\na: &a [x, x, x, x, x, x, x, x, x, x]  #<\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
        + "j: [*i, *i]\n", None, ["expands to more than 100,000 values (YAML aliases?)"]),
    Case("nested_too_deep", "name: broken\nx: " + "[" * 40 + "]" * 40 + "  #<\n", None,
         ["nested deeper than 32 levels"]),
    Case("null_role_names_its_line", BASE_HEAD + "roles:\n  prefill:  #<\n  decode:\n"
         "    nodes: 2\n", "roles.prefill", ["expected a mapping, got null"]),
    Case("huge_value_is_not_echoed_whole", BASE_HEAD + "roles:\n  prefill:\n    nodes: '"
         + "9" * 5000 + "'  #<\n  decode:\n    nodes: 2\n", "roles.prefill.nodes",
         ["expected an integer", "... (5,002 characters)"]),
    # Issue 24: errors in the user's terms, echoing what they wrote, one line whatever it holds.
    Case("release_outside_the_flag_matrix", BASE_HEAD + 'engine: {version: "0.99.1"}  #<\n' + PD,
         "engine.version", ["SGLang '0.99.1' is not in hpcserve's flag matrix (the newest it "
                            "knows is 0.5.23)", "set engine.check_flags_as: newest"]),
    Case("release_between_known_ones", BASE_HEAD + "engine:\n  version: 0.5.21.post1  #<\n"
         + PD, "engine.version", ["SGLang '0.5.21.post1' is not in hpcserve's flag matrix (the "
                                  "nearest it knows are 0.5.21 and 0.5.22)"]),
    # A release of the flag table whose own parser no test can load: refused, naming the ones
    # that are checked (hpcserve/engines/sglang.py CHECKED).
    Case("release_only_in_the_table", BASE_HEAD + "engine:\n  version: 0.5.9  #<\n" + PD,
         "engine.version", ["SGLang '0.5.9' is no longer accepted: hpcserve's tests cannot check "
                            "its flags with its own parser; the releases it accepts are 0.5.20, "
                            "0.5.21, 0.5.22, 0.5.23"]),
    Case("check_flags_as_unknown", BASE_HEAD + "engine:\n  version: 0.5.10\n"
         "  check_flags_as: 0.5.11  #<\n" + PD, "engine.check_flags_as",
         ["SGLang '0.5.11' is not in hpcserve's flag matrix", "name a release it knows"]),
    Case("derived_tp_from_dp", BASE_HEAD + """engine: {name: vllm}
roles:
  worker:
    nodes: 2
    dp: 5  #<
""", "roles.worker.dp", ["dp 5 does not divide the instance's 16 GPUs (nodes 2 x 8 GPUs per "
                         "node): tp is derived as GPUs / (pp x dp)"]),
    Case("derived_tp_in_another_rule", BASE_HEAD + """engine: {name: vllm}
roles:
  worker:
    dp: 2
    dcp: 3  #<
""", "roles.worker.dcp", ["tp 4 (derived: 8 GPUs / (pp 1 x dp 2)) must be divisible by dcp 3"]),
    Case("bad_time_is_echoed", BASE_HEAD + PD + "time_limit: 30m  #<\n", "time_limit",
         ["expected a time such as 04:00:00 or 1-00:00:00, got '30m'"]),
    Case("long_bad_time_is_echoed_bounded", BASE_HEAD + PD + "time_limit: '" + "1" * 300
         + "'  #<\n", "time_limit", ["got '" + "1" * 59 + "... (302 characters)"]),
    Case("bad_version_is_echoed", BASE_HEAD + "engine: {version: latest}  #<\n" + PD,
         "engine.version", ["got 'latest'"]),
    Case("newline_in_a_key", BASE_HEAD + PD + '"ro\\nuter": {}  #<\n', "ro\\nuter",
         ["control character '\\n' is not allowed in a config key, got 'ro\\nuter'"]),
    Case("escape_in_a_nested_key", BASE_HEAD + PD + 'env:\n  "A\\e[2J": x  #<\n', "env.A\\x1b[2J",
         ["control character '\\x1b' is not allowed in a config key"]),
    Case("nul_character_in_the_file", BASE_HEAD + PD + "jobs_dir: /a\0b  #<\n", None,
         ["not valid YAML: character '\\x00' at column 13: control characters are not allowed"]),
    Case("control_character_after_unicode", BASE_HEAD.replace(
        "  path: /models/dsv3\n", "  path: /models/dsv3\n  served_name: ünï\x07  #<\n") + PD,
         None, ["character '\\x07' at column 19"]),
    Case("null_required_key_at_its_line", BASE_HEAD.replace("  path: /models/dsv3\n",
                                                            "  path: null  #<\n") + PD,
         "model.path", ["a required key, got null"]),
    Case("null_name_at_its_line", BASE_HEAD[len("name: broken\n"):] + "name:  #<\n" + PD, "name",
         ["a required key, got null"]),
    Case("null_site_at_its_line", BASE_HEAD.replace("site: local\n", "") + "site: null  #<\n" + PD,
         "site", ["a required key, got null"]),
    Case("bad_set_path_names_the_set", BASE_HEAD + PD, "roles.nope", ["unknown role"],
         sets=["roles.nope.nodes=2"], where="--set roles.nope.nodes=2"),
    Case("empty_set_path_part_names_the_set", BASE_HEAD + PD, None, ["bad key path 'roles..x'"],
         sets=["roles..x=1"], where="--set roles..x=1"),
    # Issue 24: an instance that cannot stay inside one NVLink domain; --segment's release.
    Case("instance_larger_than_an_nvlink_domain", """name: broken
site:
  base: gb200-nvl72
  fabric:
    nvlink_domain_nodes: 18
model:
  profile: kimi-k2-instruct
  path: /models/k2
roles:
  prefill:
    nodes: 4
  decode:
    nodes: 24  #<
""", "roles.decode.nodes", ["an instance of 24 nodes does not fit one NVLink domain of 18 "
                            "nodes (site.fabric.nvlink_domain_nodes)"]),
    Case("segment_on_a_slurm_without_it", """name: broken
site:
  base: gb200-nvl72
  fabric:
    nvlink_domain_nodes: 18
    slurm_version: "23.11"  #<
model:
  profile: kimi-k2-instruct
  path: /models/k2
""" + PD, "site.fabric.slurm_version", ["--segment, which Slurm 24.05 added; this site runs "
                                        "23.11"]),
    # The field's doc is cut short after "missing required key" (the whole is in the schema).
    Case("missing_fabric_topology_stays_short", """name: broken
site:
  base: dgx-h200-pyxis
  fabric: {nvlink_domain_nodes: 18}  #<
model:
  profile: kimi-k2-instruct
  path: /models/k2
""" + PD, "site.fabric", ["missing required key 'topology' (the site's Slurm TopologyPlugin)"]),
    # YAML reads an unquoted 24.10 as the number 24.1: say to quote it.
    Case("unquoted_release_number", """name: broken
site:
  base: gb200-nvl72
  fabric:
    nvlink_domain_nodes: 18
    slurm_version: 24.10  #<
model:
  profile: kimi-k2-instruct
  path: /models/k2
""" + PD, "site.fabric.slurm_version", ["got the number 24.1 (YAML reads it unquoted as a "
                                        "number: quote it)"]),
    Case("huge_profile_name_is_not_echoed_whole", "name: broken\nsite: local\nmodel:\n"
         "  profile: '" + "x" * 5000 + "'  #<\n  path: /m\n" + PD, "model.profile",
         ["no model profile named 'xxxx", "... (5,002 characters)"]),
]


def _cli() -> list[str]:
    exe = Path(sys.executable).parent / "hpcserve"
    if not exe.exists():
        exe = ROOT / ".venv" / "bin" / "hpcserve"
    return [str(exe)]


def _run(case: Case, tmp: Path) -> dict:
    f = tmp / f"{case.name}.yaml"
    f.write_text(case.text, encoding="utf-8")
    out = tmp / f"out-{case.name}"
    cmd = _cli() + ["render", str(f), "--out", str(out)]
    for s in case.sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp,
                       stdin=subprocess.DEVNULL)
    return {"file": str(f), "out": out, "rc": p.returncode, "stdout": p.stdout,
            "stderr": p.stderr}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("broken")
    with ThreadPoolExecutor(max_workers=4) as ex:
        return dict(zip([c.name for c in CASES], ex.map(lambda c: _run(c, tmp), CASES)))


def test_case_names_are_unique():
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_broken_config_is_refused_in_one_line(case, results):
    r = results[case.name]
    err = r["stderr"]
    assert "Traceback" not in err and "Traceback" not in r["stdout"], err
    assert r["rc"] == 2, f"exit {r['rc']}; stderr: {err}"
    assert err.endswith("\n") and err.count("\n") == 1, f"not exactly one line: {err!r}"
    assert err.startswith("hpcserve: error: "), err
    if case.where:
        where = case.where
    else:
        marked = [i for i, ln in enumerate(case.text.splitlines(), 1) if ln.endswith("#<")]
        assert len(marked) == 1, "a case marks exactly one line"
        where = f"{r['file']}:{marked[0]}"
    head = f"hpcserve: error: {where}: " + (f"{case.field}: " if case.field else "")
    assert err.startswith(head), f"expected to start with {head!r}, got {err!r}"
    for m in case.message:
        assert m in err, f"{m!r} not in {err!r}"
    assert not r["out"].exists(), "nothing may be written when the config is refused"
    assert r["stdout"] == ""


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_a_file_that_is_not_a_regular_file_is_refused_at_once(kind, tmp_path):
    """A FIFO would block the loader forever and a device never end: refused before reading."""
    path = {"directory": tmp_path, "device": Path("/dev/zero")}.get(kind, tmp_path / "d.yaml")
    if kind == "fifo":
        os.mkfifo(path)
    p = subprocess.run(_cli() + ["render", str(path), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert (p.returncode, p.stderr) == (2, f"hpcserve: error: {path}: not a regular file\n")
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_refused_and_left_alone(tmp_path):
    existing = tmp_path / "notes.txt"
    existing.write_text("mine\n")
    p = subprocess.run(_cli() + ["render", str(ROOT / "examples" / "kimi-k2-instruct-4p12d.yaml"),
                                 "--out", str(existing)], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert (p.returncode, p.stderr) == (
        2, f"hpcserve: error: {existing} exists (owner root): a job directory is made new, "
           "never one that was there; choose another --out\n")
    assert existing.read_text() == "mine\n"
