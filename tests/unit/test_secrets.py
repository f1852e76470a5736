"""Secrets are referenced by environment-variable name and never written into the job directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from hpcserve import config, plan
from hpcserve.errors import ConfigError
from hpcserve.render import render_files, write_job

DEP = {
    "name": "sec", "site": "local", "model": {"profile": "kimi-k2-instruct", "path": "/models/k2"},
    "engine": {"simulate": True},
    "env": {"HF_TOKEN": {"from_env": "MY_HF_TOKEN"}},
    "roles": {"prefill": {"nodes": 1, "args": {"api-key": {"from_env": "SGL_KEY"}}},
              "decode": {"nodes": 1}},
    "router": {"args": {"api-key": {"from_env": "SGL_KEY"}}},
}
SECRET = "sk-this-must-never-be-in-a-file"


def _render(tmp_path: Path, dep: dict) -> Path:
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump(dep))
    out = tmp_path / "job"
    write_job(render_files(plan.build(config.load(f)), str(out)), out)
    return out


def test_secrets_are_named_in_files_and_expanded_only_in_the_task(tmp_path, monkeypatch):
    monkeypatch.setenv("SGL_KEY", SECRET)
    job = _render(tmp_path, DEP)
    for p in job.rglob("*"):
        if p.is_file():
            assert SECRET not in p.read_text(errors="replace"), p
    launch = (job / "launch" / "prefill-0.sh").read_text()
    assert '--api-key "${SGL_KEY}"' in launch and 'HF_TOKEN="${MY_HF_TOKEN}"' in launch
    assert '--api-key "${SGL_KEY}"' in (job / "launch" / "router.sh").read_text()
    # in the task the shell expands the name: the engine gets the value
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # (the launch script's background port-owner check is a python3 call too: not the engine)
    (bindir / "python3").write_text('#!/bin/sh\ncase "$3" in *hpcserve_runtime/ownport.py) exit 0;; esac\n'
                                    'printf "%s\\n" "$@" > "$ARGV_OUT"\n')
    (bindir / "python3").chmod(0o755)
    (job / "run" / "prefill-0.nodes").write_text("0 n1 10.0.0.1 eth0 -\n")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURMD_NODENAME": "n1",
           "ARGV_OUT": str(tmp_path / "argv"), "SGL_KEY": SECRET, "MY_HF_TOKEN": "hf-x"}
    subprocess.run(["bash", str(job / "launch" / "prefill-0.sh")], env=env, check=True)
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[argv.index("--api-key") + 1] == SECRET


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
