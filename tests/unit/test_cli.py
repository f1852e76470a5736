"""`hpcserve schema`, `hpcserve plan` and `hpcserve render` as a user runs them."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from hpcserve.cli import main
from unitkit import EXAMPLES, ROOT, small_pd, write_yaml

SITES = sorted((ROOT / "site_configs").glob("*.yaml"))
PROFILES = sorted((ROOT / "hpcserve" / "models").glob("*.yaml"))


def _cli() -> str:
    exe = Path(sys.executable).parent / "hpcserve"
    return str(exe if exe.exists() else ROOT / ".venv" / "bin" / "hpcserve")


@pytest.fixture(scope="module")
def schemas() -> dict:
    p = subprocess.run([_cli(), "schema"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert set(s) == {"deployment", "site", "profile"}
    for v in s.values():
        jsonschema.Draft202012Validator.check_schema(v)
    return s


def _validator(schema):
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_schema_validates_the_examples(schemas, example):
    doc = yaml.safe_load(example.read_text(encoding="utf-8"))
    errors = list(_validator(schemas["deployment"]).iter_errors(doc))
    assert not errors, [e.message for e in errors]


@pytest.mark.parametrize("path", SITES + PROFILES, ids=[p.stem for p in SITES + PROFILES])
def test_schema_validates_bundled_sites_and_profiles(schemas, path):
    kind = "site" if path in SITES else "profile"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    errors = list(_validator(schemas[kind]).iter_errors(doc))
    assert not errors, [e.message for e in errors]


@pytest.mark.parametrize("path,value", [
    (("roles", "decode", "nodez"), 2),                # unknown key
    (("roles", "decode", "nodes"), 0),                # below minimum
    (("roles", "decode", "tp"), 0),                   # optional int keeps its minimum
    (("roles", "decode", "port"), 80),                # optional port keeps its range
    (("site", "container", "mounts"), ["/a,/b:/c"]),  # list items keep their pattern
    (("site", "container", "env"), ["A,B"]),
    (("site", "slurm", "max_nodes"), 0),
    (("engine", "version"), "latest"),
    (("engine", "check_flags_as"), "latest"),
    (("time_limit",), "forever"),
    (("router", "placement"), "everywhere"),
    (("env",), {"BAD-NAME": 1}),
])
def test_schema_rejects_what_the_loader_rejects(schemas, tmp_path, path, value):
    from hpcserve.author import config
    from hpcserve.errors import ConfigError
    doc = small_pd()
    cur = doc
    for p in path[:-1]:
        cur = cur.setdefault(p, {})
    cur[path[-1]] = value
    if path[0] == "site":
        # The deployment schema takes `site` as a name or any mapping (it may hold `base:`),
        # so an inline site is checked with the site schema.
        assert list(_validator(schemas["site"]).iter_errors(doc["site"])), "schema accepted it"
    else:
        assert list(_validator(schemas["deployment"]).iter_errors(doc)), "schema accepted it"
    with pytest.raises(ConfigError):
        config.load(write_yaml(tmp_path / "d.yaml", doc))


def test_schema_subcommand_prints_one_schema():
    r = CliRunner().invoke(main, ["schema", "site"])
    assert r.exit_code == 0
    s = json.loads(r.output)
    assert s["title"] == "hpcserve site" and "slurm" in s["$defs"]["Site"]["properties"]
    assert "roles" not in json.dumps(s)


def _plan_rows(output: str) -> list[list[str]]:
    """The rows of `hpcserve plan --argv`: one per node, with its whole command line."""
    lines = output.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[:6] == ["comp", "node", "role",
                                                                      "instance", "rank", "ports"])
    rows = []
    for ln in lines[head + 1:]:
        if ln.startswith(("warning:", "note:", "fit ")):
            break
        rows.append(ln.split(None, 6))
    return rows


def test_plan_argv_shows_one_row_per_node_with_ranks():
    ex = ROOT / "examples" / "kimi-k2-instruct-4p12d.yaml"
    r = CliRunner().invoke(main, ["plan", "--argv", str(ex)])
    assert r.exit_code == 0, r.output
    assert "16 nodes" in r.output.splitlines()[0]
    rows = _plan_rows(r.output)
    engines = [row for row in rows if row[2] in ("prefill", "decode")]
    assert [(row[0], row[1], row[2], row[4]) for row in engines] == \
        [("0", str(n), "prefill", str(n)) for n in range(4)] + \
        [("1", str(n), "decode", str(n)) for n in range(12)]
    for row in engines:
        cmd = row[6]
        assert f"--node-rank {row[4]}" in cmd
        leader = "<prefill0>" if row[2] == "prefill" else "<decode0>"
        assert f"--dist-init-addr {leader}:5757" in cmd
        assert f"--host <{row[2]}{row[1]}>" in cmd
    (router,) = [row for row in rows if row[2] == "router"]
    assert router[:2] == ["0", "0"] and router[5] == "8000"
    assert "--prefill http://<prefill0>:30000 8998" in router[6]
    assert "--decode http://<decode0>:30000" in router[6]


def test_plan_shows_shared_nodes_and_idle_nodes(tmp_path):
    doc = small_pd()
    doc["model"] = {"profile": "kimi-k2-thinking", "path": "/m"}
    doc["roles"] = {"prefill": {"instances": 3, "gpus": 4}, "decode": {"nodes": 1}}
    f = str(write_yaml(tmp_path / "d.yaml", doc))
    r = CliRunner().invoke(main, ["plan", "--argv", f])
    assert r.exit_code == 0, r.output
    rows = _plan_rows(r.output)
    prefill = [(row[1], row[3]) for row in rows if row[2] == "prefill"]
    assert prefill == [("0", "0"), ("0", "1"), ("1", "2")]
    assert "note: prefill: 4 GPU(s)" in r.output
    # the summary: one row per instance, the two sharing node 0, four GPUs each
    r = CliRunner().invoke(main, ["plan", f])
    assert r.exit_code == 0, r.output
    rows = [ln.split() for ln in r.output.splitlines() if ln.split()[2:3] == ["prefill"]]
    assert [(row[1], row[3], row[5]) for row in rows] == [("0", "0", "4"), ("0", "1", "4"),
                                                          ("1", "2", "4")]
    assert "note: prefill: 4 GPU(s)" in r.output


def test_plan_json_is_the_plan(tmp_path):
    r = CliRunner().invoke(main, ["plan", "--json", str(ROOT / "examples" / "demo.yaml")])
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert [c["nodes"] for c in d["components"]] == [2, 2]
    assert [i["name"] for i in d["instances"]] == ["prefill-0", "decode-0"]


def test_the_demo_renders_without_a_warning(tmp_path):
    """The demo is what a newcomer runs first: its layout holds its model's context, so it
    renders (as submit does) with nothing on stderr."""
    p = subprocess.run([_cli(), "render", str(ROOT / "examples" / "demo.yaml"), "--out",
                        str(tmp_path / "job")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr


@pytest.mark.parametrize("command", ["plan", "render"])
def test_a_release_checked_against_another_warns_before_anything_else(tmp_path, command):
    """engine.check_flags_as lets a release outside the flag matrix through; the warning that
    says so is the first thing printed (on stderr), before the table or the path."""
    doc = small_pd()
    doc["engine"].update(version="0.99.1", check_flags_as="newest")
    f = write_yaml(tmp_path / "d.yaml", doc)
    out = ["--out", str(tmp_path / "job")] if command == "render" else []
    p = subprocess.run([_cli(), command, str(f), *out], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 0, p.stdout
    first, rest = p.stdout.split("\n", 1)
    assert first == ("hpcserve: warning: SGLang 0.99.1 is not in hpcserve's flag matrix: its "
                     "flags are checked against 0.5.23 (engine.check_flags_as: newest)")
    assert "flag matrix" not in rest  # said once, first
    doc["engine"].pop("check_flags_as")
    p = subprocess.run([_cli(), command, str(write_yaml(tmp_path / "e.yaml", doc)), *out],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert "engine.version: SGLang '0.99.1' is not in hpcserve's flag matrix" in p.stderr


def test_render_writes_the_job_directory_and_prints_it(tmp_path):
    out = tmp_path / "job"
    p = subprocess.run([_cli(), "render", str(ROOT / "examples" / "demo.yaml"), "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(out.resolve())
    for rel in ("job.sbatch", "plan.json", "hpcserve_runtime/job.py", "hpcserve_runtime/__main__.py", "hpcserve_sim.py",
                "launch/prefill-0.sh", "steps/discover-0.sh"):
        assert (out / rel).is_file(), rel
    assert (out / "logs").is_dir() and (out / "run").is_dir()
    # the owner's alone: nobody else may read what it runs, nor write into it
    assert (out / "job.sbatch").stat().st_mode & 0o777 == 0o700
    assert out.stat().st_mode & 0o777 == 0o700 and (out / "logs").stat().st_mode & 0o777 == 0o700
    assert (out / "plan.json").stat().st_mode & 0o777 == 0o600
    assert re.search(rf"HPCSERVE_JOB_DIR={re.escape(str(out.resolve()))}\n",
                     (out / "job.sbatch").read_text())
    # a second render into the same directory is refused, in one line
    p2 = subprocess.run([_cli(), "render", str(ROOT / "examples" / "demo.yaml"), "--out",
                         str(out)], capture_output=True, text=True, timeout=60)
    assert p2.returncode == 2 and p2.stderr.startswith("hpcserve: error: ")
    assert p2.stderr.count("\n") == 1 and "exists (owner " in p2.stderr


def test_render_refuses_a_directory_or_link_someone_made_first_and_names_its_owner(tmp_path):
    """An empty directory made before the render (on a shared file system, by anyone), or a
    link there, is refused: its maker could change the job's scripts before the job runs."""
    nobody = pwd.getpwnam("nobody")
    empty = tmp_path / "empty"
    empty.mkdir()
    os.chown(empty, nobody.pw_uid, nobody.pw_gid)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    for out, owner in ((empty, "nobody"), (tmp_path / "link", "root")):
        p = subprocess.run([_cli(), "render", str(ROOT / "examples" / "demo.yaml"), "--out",
                            str(out)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert f"exists (owner {owner}): a job directory is made new" in p.stderr, p.stderr
    assert os.listdir(empty) == [] and not (tmp_path / "elsewhere").exists()


def test_shell_completion_script_is_generated():
    # click's completion: `eval "$(_HPCSERVE_COMPLETE=bash_source hpcserve)"` in ~/.bashrc
    import os
    import subprocess
    import sys
    from pathlib import Path
    exe = str(Path(sys.executable).parent / "hpcserve")
    out = subprocess.run([exe], env={**os.environ, "_HPCSERVE_COMPLETE": "bash_source"},
                         capture_output=True, text=True)
    assert out.returncode == 0 and "complete " in out.stdout and "_hpcserve_completion" in out.stdout
    words = subprocess.run([exe], env={**os.environ, "_HPCSERVE_COMPLETE": "bash_complete",
                                       "COMP_WORDS": "hpcserve st", "COMP_CWORD": "1"},
                           capture_output=True, text=True).stdout
    assert "plain,status" in words


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    # `hpcserve schema | head -c 20`: the reader goes away after 20 bytes
    p = subprocess.Popen([_cli(), "schema"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(p.stdout.read(20)) == 20
    p.stdout.close()
    assert p.wait(timeout=60) == 0
    assert p.stderr.read() == b""
