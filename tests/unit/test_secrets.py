"""Secrets are referenced by environment-variable name and never written into the job directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcserve.author import config, plan
from hpcserve.errors import ConfigError
from hpcserve.author.render import render_files, write_job

DEP = {
    "name": "sec", "site": "local", "model": {"profile": "kimi-k2-instruct", "path": "/models/k2"},
    "engine": {"simulate": True},
    "env": {"HF_TOKEN": {"from_env": "MY_HF_TOKEN"}},
    "roles": {"prefill": {"nodes": 1, "args": {"api-key": {"from_env": "SGL_KEY"}}},
              "decode": {"nodes": 1}},
    "router": {"args": {"api-key": {"from_env": "SGL_KEY"}}},
}
SECRET = "-sk-this-must-never-be-in-a-file"  # a leading '-' is no option


def _render(tmp_path: Path, dep: dict) -> Path:
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump(dep))
    out = tmp_path / "job"
    write_job(render_files(plan.build(config.load(f)), str(out)), out)
    return out


def test_secrets_are_named_in_files_and_reach_the_program_but_not_its_command_line(
        tmp_path, monkeypatch):
    """An argument given {from_env: NAME} is named in the job directory, never written, and
    never on the command line either (every user of the node reads it in `ps`): the launch
    scripts run the program under hpcserve_runtime/secret_argv.py, naming flag and variable in
    HPCSERVE_SECRET_ARGS, and the program finds the value in its sys.argv while
    /proc/PID/cmdline, which ps reads, does not hold it."""
    monkeypatch.setenv("SGL_KEY", SECRET)
    job = _render(tmp_path, DEP)
    for p in job.rglob("*"):
        if p.is_file():
            assert SECRET not in p.read_text(errors="replace"), p
    for script in ("prefill-0.sh", "router.sh"):
        text = (job / "launch" / script).read_text()
        assert "--api-key" not in text.replace("HPCSERVE_SECRET_ARGS='--api-key SGL_KEY'", ""), \
            script
        assert "export HPCSERVE_SECRET_ARGS='--api-key SGL_KEY'" in text, script
        assert "/hpcserve_runtime/secret_argv.py" in text, script
    launch = (job / "launch" / "prefill-0.sh").read_text()
    assert 'HF_TOKEN="${MY_HF_TOKEN}"' in launch
    # in the task: the engine (here a stand-in that reports what it got) has the value in
    # sys.argv, its command line has not
    (job / "hpcserve_sim.py").write_text(
        "import json, os, sys\n"
        "cmdline = open('/proc/self/cmdline', 'rb').read().decode().split('\\0')\n"
        "json.dump({'argv': sys.argv, 'cmdline': cmdline, 'left': os.environ.get("
        "'HPCSERVE_SECRET_ARGS')}, open(os.environ['ARGV_OUT'], 'w'))\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # (the launch script's background port-owner check is a python3 call too: not the engine)
    (bindir / "python3").write_text('#!/bin/sh\ncase "$3" in *hpcserve_runtime/ownport.py) '
                                    f'exit 0;; esac\nexec {sys.executable} "$@"\n')
    (bindir / "python3").chmod(0o755)
    (job / "run" / "prefill-0.nodes").write_text("0 n1 10.0.0.1 eth0 -\n")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURMD_NODENAME": "n1",
           "ARGV_OUT": str(tmp_path / "argv"), "SGL_KEY": SECRET, "MY_HF_TOKEN": "hf-x"}
    subprocess.run(["bash", str(job / "launch" / "prefill-0.sh")], env=env, check=True)
    got = json.loads((tmp_path / "argv").read_text())
    assert f"--api-key={SECRET}" in got["argv"]
    assert got["argv"][0].endswith("hpcserve_sim.py") and got["left"] is None
    assert SECRET not in " ".join(got["cmdline"]) and "--api-key" not in " ".join(got["cmdline"])
    assert any(w.endswith("hpcserve_runtime/secret_argv.py") for w in got["cmdline"])
    # a variable the task lacks is named, never a value, and nothing runs
    env.pop("SGL_KEY")
    r = subprocess.run(["bash", str(job / "launch" / "prefill-0.sh")], env=env,
                       capture_output=True, text=True)
    log = (job / "logs").rglob("prefill-0*")
    assert r.returncode != 0
    assert any("SGL_KEY is not set in this task's environment: --api-key takes its value "
               "from it" in p.read_text() for p in log), r


def test_a_secret_that_begins_with_a_dash_reaches_an_argparse_program_as_the_value(tmp_path):
    """The value rides in its flag's word (--api-key=VALUE): as a word of its own, argparse
    takes a value that begins with '-' for an option and the program refuses its arguments (a
    key the user chose may begin so; vLLM's --api-key takes one or more values, hence nargs)."""
    prog = tmp_path / "prog.py"
    prog.write_text("import argparse, json, sys\n"
                    "p = argparse.ArgumentParser()\n"
                    "p.add_argument('model')\n"
                    "p.add_argument('--api-key', nargs='+')\n"
                    "print(json.dumps(vars(p.parse_args())))\n")
    runner = Path(__file__).parents[2] / "hpcserve" / "runtime" / "secret_argv.py"
    r = subprocess.run([sys.executable, str(runner), str(prog), "m"], capture_output=True,
                       text=True, env={**os.environ, "K": SECRET,
                                       "HPCSERVE_SECRET_ARGS": "--api-key K"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"model": "m", "api_key": [SECRET]}


@pytest.mark.parametrize("where", [("env", "HF_TOKEN"), ("router.args", "api-key"),
                                   ("roles.prefill.args", "api-key"),
                                   ("roles.decode.env", "WANDB_API_KEY")])
def test_a_literal_secret_is_refused_with_its_place(tmp_path, where):
    dep = yaml.safe_load(yaml.safe_dump(DEP))
    node = dep
    for part in where[0].split("."):
        node = node.setdefault(part, {})
    node[where[1]] = SECRET
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump(dep))
    with pytest.raises(ConfigError) as e:
        config.load(f)
    assert e.value.field == f"{where[0]}.{where[1]}" and "from_env" in e.value.message
    assert SECRET not in str(e.value)


def test_a_secret_argument_of_a_program_that_is_not_pythons_is_refused():
    """trtllm-serve cannot be run under secret_argv.py: its secret would be on the command
    line, so the render refuses it, naming flag and variable (never a value)."""
    from hpcserve.errors import HpcserveError
    from hpcserve.author.render import secret_argv
    from hpcserve.author.words import Var
    argv = ("--port", "8000", "--api-key", (Var("K", secret=True),))
    cmd, kept, env = secret_argv(["python3", "-m", "m"], argv, "x")
    assert cmd == ["python3", (Var("JOB_DIR"), "/hpcserve_runtime/secret_argv.py"), "-m", "m"]
    assert kept == ("--port", "8000") and env == [("HPCSERVE_SECRET_ARGS", "--api-key K")]
    assert secret_argv(["python3", "-m", "m"], argv[:2], "x") == (
        ["python3", "-m", "m"], argv[:2], [])
    with pytest.raises(HpcserveError, match="trtllm-serve takes its arguments only on its "
                                            "command line, where --api-key {from_env: K}"):
        secret_argv(["trtllm-serve", "disaggregated"], argv, "x")


GENERATED = {k: v for k, v in DEP.items() if k != "router"}  # the router names no key
GENERATED["roles"] = {"prefill": {"nodes": 1}, "decode": {"nodes": 1}}


def test_every_deployment_gets_a_key_of_its_own_that_only_its_owner_reads(tmp_path):
    """Without a key named in the file, the render makes one: new, 0600 in a 0700 directory,
    a different one per job directory; the router and every engine name its variable, and no
    other file of the job directory holds it. plan.json names the file, never the value."""
    job = _render(tmp_path, GENERATED)
    key_file = job / "secret" / "api-key"
    key = key_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", key), "32 random bytes in hex (never a leading -)"
    assert (oct(key_file.stat().st_mode & 0o777), oct((job / "secret").stat().st_mode & 0o777)) \
        == ("0o600", "0o700")
    spec = json.loads((job / "plan.json").read_text())
    assert spec["api_key"] == {"env": "HPCSERVE_API_KEY", "file": str(key_file)}
    assert spec["router"]["api_key_env"] == "HPCSERVE_API_KEY"
    for script in ("prefill-0.sh", "decode-0.sh", "router.sh"):
        assert "export HPCSERVE_SECRET_ARGS='--api-key HPCSERVE_API_KEY'" in \
            (job / "launch" / script).read_text(), script
    for p in job.rglob("*"):
        if p.is_file() and p != key_file:
            assert key.strip() not in p.read_text(errors="replace"), p
    (tmp_path / "b").mkdir()
    again = _render(tmp_path / "b", GENERATED)
    assert (again / "secret" / "api-key").read_text() != key


def test_a_key_named_for_the_router_keys_the_engines_too_and_no_file_is_made(tmp_path):
    """sglang-router hands its own key to the workers: the engines must ask that one."""
    job = _render(tmp_path, {**GENERATED, "router": DEP["router"]})
    assert not (job / "secret").exists()
    spec = json.loads((job / "plan.json").read_text())
    assert spec["api_key"] == {"env": "SGL_KEY", "file": None}
    assert "export HPCSERVE_SECRET_ARGS='--api-key SGL_KEY'" in \
        (job / "launch" / "decode-0.sh").read_text()


@pytest.mark.parametrize("plant", ["readable", "link", "missing"])
def test_job_sbatch_refuses_a_key_file_that_is_not_its_owners_alone(tmp_path, plant):
    """A key file others can read (or a link, or none) is refused before anything starts, in
    one line naming it; nothing of the job is started."""
    job = _render(tmp_path, GENERATED)
    key_file = job / "secret" / "api-key"
    if plant == "readable":
        key_file.chmod(0o644)
    elif plant == "link":
        other = tmp_path / "elsewhere"
        other.write_text("k\n")
        other.chmod(0o600)
        key_file.unlink()
        key_file.symlink_to(other)
    else:
        key_file.unlink()
    r = subprocess.run(["bash", str(job / "job.sbatch")], capture_output=True, text=True,
                       timeout=30, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert r.returncode == 2, r
    assert r.stderr.strip() == (f"hpcserve: the deployment's API key {key_file} is missing, or "
                                "not this user's alone; refusing to serve without it"), r.stderr
    assert not (job / "state.json").exists()


def test_trtllm_and_the_legacy_ktransformers_server_take_no_key(tmp_path):
    """trtllm-serve takes its arguments only on its command line, where a key would be in
    `ps`: no key is made for it (docs/security.md says what that leaves open)."""
    dep = {**GENERATED, "engine": {"name": "trtllm", "simulate": True}}
    job = _render(tmp_path, dep)
    assert json.loads((job / "plan.json").read_text())["api_key"] is None
    assert not (job / "secret").exists()
    assert "HPCSERVE_API_KEY" not in (job / "job.sbatch").read_text()


def test_a_benchmark_run_from_outside_the_job_reads_the_key_from_its_file(tmp_path):
    """`hpcserve bench` starts its step from the caller's environment, which has not the job's
    HPCSERVE_API_KEY: its launch script reads the key from the deployment's file and hands it
    to the client as OPENAI_API_KEY, the bearer token both clients send; one it cannot read
    stops the run before any point, saying which file."""
    from hpcserve.engines.bench_clients import CLIENTS, BenchPoint
    from hpcserve.author.render import bench_launch_script
    key_file = tmp_path / "api-key"
    key_file.write_text("k-bench-42\n")
    key_file.chmod(0o600)
    client = tmp_path / "client"  # the client's python: says what key it was given
    client.write_text('#!/bin/sh\necho "client key: $OPENAI_API_KEY"\n')
    client.chmod(0o755)
    spec = {"dir": "bench", "input_tokens": 8, "output_tokens": 4, "point_timeout_s": 30}
    text = bench_launch_script(CLIENTS["vllm"], str(client), spec,
                               [(BenchPoint(1, None, 2), ["bench", "serve"])],
                               job_dir=str(tmp_path), target="http://x:1", env=[],
                               started_by="test", serving_url="http://x:1",
                               key_file=str(key_file))
    script = tmp_path / "launch.sh"
    script.write_text(text)
    subprocess.run(["bash", str(script)], check=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    log = (tmp_path / "bench" / "bench.log").read_text()
    assert "client key: k-bench-42" in log and "k-bench-42" not in text
    key_file.unlink()
    r = subprocess.run(["bash", str(script)], timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2
    assert f"the deployment's API key {key_file} cannot be read" in \
        (tmp_path / "bench" / "bench.log").read_text()
