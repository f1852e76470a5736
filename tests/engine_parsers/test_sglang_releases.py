"""Every SGLang release hpcserve accepts, checked with that release's OWN parser.

The engines venv holds the newest release (test_generated_argv.py checks it); each older accepted
release is its wheel unpacked beside it (scripts/setup-sglang-releases.sh) and loaded by the same
python, first on PYTHONPATH. Per release, in one subprocess each:

* the parser that loads is that release's, and its option strings, deprecations and choices are
  the flag table's entry for it (hpcserve/engines/data/sglang_flags.json): what hpcserve spells
  for that release is what the release accepts, and a placeholder for a missing import
  (conftest.py SGLANG_RELEASES) left the parser as the release built it;
* every command line hpcserve renders for the SGLang and KTransformers examples (the golden
  deployments) at that release, every instance and node rank, parses strictly and as the server
  parses it, with the values the plan meant and no deprecation warning.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import SGLANG_RELEASES
from test_generated_argv import EXAMPLES, _argvs

from hpcserve.author import config, plan
from hpcserve.engines import sglang
from hpcserve.engines.flags import FlagMatrix, vkey

ROOT = Path(__file__).resolve().parents[2]
TABLE = FlagMatrix("SGLang", "sglang_flags.json")  # every release of the table, accepted or not


def _script_list(script: str, name: str) -> list[str]:
    text = (ROOT / "scripts" / script).read_text()
    m = re.search(rf"^{name}=\(?([^)\n]*)\)?$", text, re.M)
    assert m, f"no {name}= line in scripts/{script}"
    return m.group(1).split()


def test_every_accepted_release_has_its_own_parser():
    """hpcserve accepts a release only if a test loads its parser: the venv's, or one fetched by
    setup-sglang-releases.sh and listed, with its placeholders, in conftest.py."""
    (venv_release,) = _script_list("setup-engines.sh", "SGLANG_VERSION")
    fetched = _script_list("setup-sglang-releases.sh", "RELEASES")
    assert fetched == list(SGLANG_RELEASES)
    assert sorted(sglang.CHECKED) == sorted([venv_release, *fetched])
    assert sglang.SGLang.matrix.known_versions() == sorted(sglang.CHECKED, key=vkey)


_RUNS: dict[str, tuple[list, list]] = {}


def _run(parser, version: str) -> tuple[list, list]:
    """(cases, results): every argv hpcserve renders at `version` for the SGLang examples, each
    rank, parsed by the release's parser in ONE subprocess, which also lists its flags."""
    if version not in _RUNS:
        cases = []
        for example in EXAMPLES:
            p = plan.build(config.load(example, sets=[f"engine.version={version}"]))
            assert p.version == version
            cases += [(example.stem, p, *case) for case in _argvs(p)]
        results = parser([argv for *_, argv, _ in cases], list_flags=True)
        _RUNS[version] = (cases, results)
    return _RUNS[version]


@pytest.mark.engine_parser
@pytest.mark.parametrize("version", list(SGLANG_RELEASES))
def test_the_release_parser_is_its_flag_table(sglang_release_parsers, version):
    parser = sglang_release_parsers[version]
    _run(parser, version)
    real = parser.list_flags()
    assert real["sglang_version"] == version  # not the venv's own release
    assert set(real["stubs"]) <= set(SGLANG_RELEASES[version]), real["stubs"]
    entry = TABLE.versions()[version]
    assert set(entry["flags"]) == set(real["flags"]), (
        f"only in the table: {sorted(set(entry['flags']) - set(real['flags']))}; "
        f"only in {version}'s parser: {sorted(set(real['flags']) - set(entry['flags']))}")
    assert entry["deprecated"] == real["deprecated"]
    assert entry["choices"] == real["choices"]
    assert entry.get("short_flags", []) == real["short_flags"]


def _check_values(inst, rank, vals, v) -> None:
    assert v["tp_size"] == inst.size("tp")
    assert v["host"] == vals["NODE_IP"]
    assert v["port"] == inst.port
    if inst.nodes > 1:
        assert (v["nnodes"], v["node_rank"]) == (inst.nodes, rank)
        assert v["dist_init_addr"] == f"{vals['LEADER_IP']}:{inst.port_of('dist_init')}"
    if inst.role in ("prefill", "decode"):
        assert v["disaggregation_mode"] == inst.role
    if inst.size("attn_dp"):
        if "attn_dp_size" in v:  # 0.5.22 on
            assert v["attn_dp_size"] == inst.size("attn_dp")
        else:  # before: DP attention is the DP size with --enable-dp-attention
            assert (v["dp_size"], v["enable_dp_attention"]) == (inst.size("attn_dp"), True)


@pytest.mark.engine_parser
@pytest.mark.parametrize("version", list(SGLANG_RELEASES))
def test_every_generated_argv_parses_with_its_own_release(sglang_release_parsers, version):
    cases, results = _run(sglang_release_parsers[version], version)
    # the SGLang examples have several instances, multi-node ones and PD: a floor on what runs
    assert len(cases) >= 2 * len(EXAMPLES), len(cases)
    for (stem, p, name, rank, argv, vals), res in zip(cases, results):
        assert res["ok"] and res["server_ok"], (stem, name, rank, res, argv)
        assert not res["warnings"], (stem, name, res["warnings"])  # no deprecated spelling
        inst = next(i for i in p.instances if i.name == name)
        _check_values(inst, rank, vals, res["values"])


def test_a_placeholder_never_hides_a_real_module():
    """sglang_check.py --stub answers only for a listed name no other finder has: were it to
    shadow a real package, the release's parser could be built from placeholders unnoticed."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("sglang_check_mod",
                                                  ROOT / "tests/engine_parsers/sglang_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    finder = check.install_stubs(["tabnanny", "hpcserve_no_such_package"])
    try:
        assert importlib.util.find_spec("tabnanny").loader is not finder  # the standard library's
        assert importlib.util.find_spec("hpcserve_no_such_package.sub").loader is finder
        assert finder.used == {"hpcserve_no_such_package"}
        mod = check._StubModule("hpcserve_no_such_package")

        class Sub(mod.Base, total=False):  # subclassing with keywords, as TypedDicts do
            pass
        assert list(mod.Registry) == [] and mod.Generic[int] is mod.Generic
    finally:
        sys.meta_path.remove(finder)
