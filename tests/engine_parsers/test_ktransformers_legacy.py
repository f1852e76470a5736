"""The legacy KTransformers server's command lines, checked against the release's OWN parser
(ktransformers/server/args.py of the sdist scripts/setup-ktransformers-parser.sh fetches), not
against hpcserve's table of it: every rank of every example and golden job directory at that
release parses, with the values hpcserve meant; the rules file it points at is one the release
ships; hpcserve's extracted table and the stand-in (hpcserve/sim/ktransformers_legacy.py) agree
with that parser. Examples at a release the package index does not have cannot be checked here:
a test keeps that list to releases the index really lacks."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from hpcserve.author import config, plan
from hpcserve.engines import facts
from hpcserve.engines.ktransformers import LEGACY_ADAPTER
from hpcserve.author.words import show

pytestmark = pytest.mark.engine_parser

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = "ktransformers/optimize/optimize_rules/"
VALS = {"NODE_IP": "10.0.0.7", "JOB_DIR": "/j", "SLURMD_NODENAME": "n1"}


def _legacy(p: Path) -> bool:
    return config.load(p).deployment.engine.name == "ktransformers_legacy"


EXAMPLES = [p for p in sorted((ROOT / "examples").glob("*.yaml")) if _legacy(p)]
GOLDENS = [d for d in sorted((ROOT / "tests" / "golden").iterdir())
           if (d / "deployment.yaml").is_file() and yaml.safe_load(
               (d / "deployment.yaml").read_text())["engine"]["name"] == "ktransformers_legacy"]


def _version_of(path: Path) -> str:
    doc = yaml.safe_load((path / "deployment.yaml" if path.is_dir() else path).read_text())
    return str(doc["engine"]["version"])


# The release whose parser scripts/setup-ktransformers-parser.sh fetches (the one PyPI has);
# the examples at another release have no parser to run (test_releases_not_checked_here_...)
RELEASE = facts.KTRANSFORMERS_LEGACY["release"]


def PARSED(paths: list[Path]) -> list[Path]:  # noqa: N802 - reads as the set it is
    return [p for p in paths if _version_of(p) == RELEASE]


def _example_argvs(example: Path) -> list[tuple[object, list[str]]]:
    p = plan.build(config.load(example))
    return [(inst, [show(w, VALS) for w in inst.argv])
            for inst in p.instances for _rank in range(inst.nodes)]


def _golden_argvs(golden: Path) -> list[list[str]]:
    """The server's arguments in each launch script, as bash expands them (NODE_IP set)."""
    out = []
    for script in sorted((golden / "launch").glob("*.sh")):
        text = script.read_text()
        m = re.search(r"^exec \\\n((?:.*\\\n)*.*\n)", text, re.M)
        if not m or "ktransformers.server.main" not in m.group(1):
            continue
        expand = f'NODE_IP={VALS["NODE_IP"]}; set -- {m.group(1).strip()}; printf "%s\\0" "$@"'
        words = subprocess.run(["bash", "-c", expand], capture_output=True, text=True,
                               check=True).stdout.split("\0")[:-1]
        assert words[:3] == ["python3", "-m", "ktransformers.server.main"], words[:3]
        out.append(words[3:])
    assert out, f"{golden}: no launch script runs ktransformers.server.main"
    return out


def _on_index(index: dict, version: str) -> bool:
    return any(f.startswith(f"ktransformers-{version}.tar.gz") or
               f.startswith(f"ktransformers-{version}-") for f in index["files"])


def test_the_fetched_parser_is_the_release_examples_pin(kt_legacy_parser):
    """Not vacuous: at least one example and one golden directory are at the fetched release."""
    v = kt_legacy_parser.version
    assert v == RELEASE, (v, RELEASE)
    assert v == kt_legacy_parser.index["version"]
    assert any(_version_of(e) == v for e in EXAMPLES), [_version_of(e) for e in EXAMPLES]
    assert any(_version_of(g) == v for g in GOLDENS), [_version_of(g) for g in GOLDENS]


def test_releases_not_checked_here_are_not_on_the_index(kt_legacy_parser):
    """An example at another release is allowed only where the index has no file of it, so
    there is no parser of it to fetch (0.4.1: releases 0.2.2 to 0.4.1 were never uploaded)."""
    for path in EXAMPLES + GOLDENS:
        v = _version_of(path)
        if v != kt_legacy_parser.version:
            assert not _on_index(kt_legacy_parser.index, v), (
                f"{path.name}: KTransformers {v} is on the package index: fetch its parser too "
                "(scripts/setup-ktransformers-parser.sh)")


@pytest.mark.parametrize("example", PARSED(EXAMPLES), ids=lambda p: p.stem)
def test_every_rank_parses_with_the_releases_own_parser(kt_legacy_parser, example):
    cases = _example_argvs(example)
    results = kt_legacy_parser([argv for _, argv in cases])
    for (inst, argv), res in zip(cases, results):
        assert res["ok"], (inst.name, res["error"], argv)
        v = res["values"]
        assert (v["host"], v["port"]) == (VALS["NODE_IP"], inst.port), v
        assert v["model_path"] == v["model_dir"] == argv[argv.index("--model_path") + 1]
        for opt in ("--gguf_path", "--optimize_config_path", "--model_name"):
            if opt in argv:
                assert v[opt[2:]] == argv[argv.index(opt) + 1], (opt, v[opt[2:]])
        for opt in ("--cache_lens", "--cpu_infer", "--max_new_tokens", "--max_batch_size"):
            if opt in argv:
                assert v[opt[2:]] == int(argv[argv.index(opt) + 1]), (opt, v[opt[2:]])


@pytest.mark.parametrize("golden", PARSED(GOLDENS), ids=lambda p: p.name)
def test_golden_launch_scripts_parse_with_the_releases_own_parser(kt_legacy_parser, golden):
    argvs = _golden_argvs(golden)
    for argv, res in zip(argvs, kt_legacy_parser(argvs)):
        assert res["ok"], (golden.name, res["error"], argv)
        assert res["values"]["host"] == VALS["NODE_IP"]


@pytest.mark.parametrize("path", PARSED(EXAMPLES + GOLDENS),
                         ids=lambda p: ("golden-" if p.is_dir() else "") + p.stem)
def test_the_rules_file_is_one_the_release_ships(kt_legacy_parser, path):
    """--optimize_config_path names a file of the release's ktransformers/optimize/
    optimize_rules/ (wherever the image installs the package)."""
    shipped = set(kt_legacy_parser.describe()["optimize_rules"])
    argvs = _golden_argvs(path) if path.is_dir() else [a for _, a in _example_argvs(path)]
    for argv in argvs:
        if "--optimize_config_path" not in argv:
            continue   # the server then takes its own default rules for the architecture
        rules = argv[argv.index("--optimize_config_path") + 1]
        assert RULES_DIR in rules, (rules, f"not under a {RULES_DIR} folder")
        name = rules.rsplit(RULES_DIR, 1)[1]
        assert name in shipped, (f"KTransformers {kt_legacy_parser.version} ships no "
                                 f"{RULES_DIR}{name}; it ships {sorted(shipped)}")


def test_hpcserves_table_of_the_release_is_its_parser(kt_legacy_parser):
    """tools/extract_ktransformers_flags.py read this release's parser right: its options, those
    that take no value, their types (the same tool made the table of releases the index lacks)."""
    t = LEGACY_ADAPTER.matrix.versions()[kt_legacy_parser.version]
    real = kt_legacy_parser.describe()["options"]
    assert {o for a in real for o in a["options"]} == set(t["flags"])
    assert {o for a in real if a["bare"] for o in a["options"]} == set(t["bare"])
    assert {a["options"][0]: a["type"] for a in real} == t["types"]
    assert not any(a["required"] for a in real) and not t["required"]


def _sim():
    spec = importlib.util.spec_from_file_location(
        "ktsim", ROOT / "hpcserve" / "sim" / "ktransformers_legacy.py")
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    return sim


def _sim_accepts(sim, version: str, argv: list[str]) -> bool:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            sim.build_parser(version).parse_args(argv)
        except SystemExit:
            return False
    return True


def test_the_stand_in_accepts_exactly_what_the_real_parser_accepts(kt_legacy_parser):
    """Every option either release's table knows, with a good value, a bad one and none; the
    examples' command lines (the 0.4.1 ones too: balance_serve's options must be refused);
    abbreviations, unknown options and stray words. The stand-in, set to the fetched release,
    accepts an argv if and only if the real parser does."""
    sim = _sim()
    version = kt_legacy_parser.version
    known = set(sim.options("0.4.1")) | set(sim.options(version)) | {"--bogus"}
    argvs: list[list[str]] = []
    for opt in sorted(known):
        argvs += [[opt, "1"], [opt], [opt, "x"], [opt, "1.5"], ["--no-" + opt[2:]]]
    argvs += [a for e in EXAMPLES for _, a in _example_argvs(e)]
    argvs += [["--cache_l", "5"], ["--cache", "5"], ["--model_p", "/m"], ["--model", "/m"],
              ["stray"], ["--port", "1", "stray"], ["--web", ""], ["--force_think", "False"],
              ["--port=10002"], ["--ban_strings", "ab"], []]
    real = kt_legacy_parser(argvs)
    disagree = [(argv, r["ok"]) for argv, r in zip(argvs, real)
                if r["ok"] != _sim_accepts(sim, version, argv)]
    assert not disagree, disagree
    assert any(r["ok"] for r in real) and not all(r["ok"] for r in real)


def test_the_stand_in_refuses_a_release_it_has_no_table_for(tmp_path):
    proc = subprocess.run(
        ["python3", str(ROOT / "hpcserve" / "sim" / "ktransformers_legacy.py"),
         "--model_path", str(tmp_path), "--gguf_path", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
        env={"HPCSERVE_SIM_VERSION": "0.2.4", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 2 and "no option table for KTransformers 0.2.4" in proc.stderr, \
        proc.stderr


def test_the_stand_ins_model_list_is_the_releases(kt_legacy_parser):
    """GET /v1/models of 0.2.1.post1 returns the module-level list `models` of its
    ktransformers/server/api/openai/endpoints/chat.py, not the {"data": ...} of later releases:
    the stand-in answers that list, read here from the release's file."""
    import ast

    src = kt_legacy_parser.src / "ktransformers/server/api/openai/endpoints/chat.py"
    tree = ast.parse(src.read_text())
    (models,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and [getattr(t, "id", None) for t in n.targets] == ["models"]]
    (route,) = [f for f in tree.body if isinstance(f, ast.AsyncFunctionDef)
                and f.name == "list_models"]
    assert ast.unparse(route.body[-1]) == "return models"
    assert _sim().STATIC_MODELS[kt_legacy_parser.version] == models
