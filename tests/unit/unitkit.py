"""Helpers for the pure-layer tests: configs as dicts, rendering, sbatch's own #SBATCH parser,
stub commands that record their argv, and a walk over the config dataclasses.

Imported by tests/unit/conftest.py (which puts this directory on sys.path) and the test modules.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import types
import typing
from pathlib import Path
from typing import Any, Iterator, Union

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
HPCSERVE = ROOT / ".venv" / "bin" / "hpcserve"
NoneType = type(None)


# ------------------------------------------------------------------------------------- configs

def write_yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def set_path(doc: dict, path: tuple, value: Any) -> None:
    cur = doc
    for p in path[:-1]:
        cur = cur.setdefault(p, {})
    cur[path[-1]] = value


def del_path(doc: dict, path: tuple) -> None:
    cur = doc
    for p in path[:-1]:
        cur = cur.get(p)
        if cur is None:
            return
    cur.pop(path[-1], None)


def small_site(runtime: str = "none", **over: Any) -> dict:
    """An inline site: 8 x 192 GiB GPUs per node (B200-class: a 4-GPU Kimi-K2-Thinking
    instance fits), one HCA, a fixed interface."""
    site = {
        "name": "testsite",
        "slurm": {"partition": "gpu", "max_nodes": 16},
        "node": {"gpus": 8, "gpu_memory_gb": 192},
        "container": {"runtime": runtime},
        "network": {"interface": "eth0", "ib_devices": ["mlx5_0"]},
        "paths": {"jobs_dir": "/jobs", "python": "python3"},
    }
    if runtime != "none":
        site["container"].update(image="registry.example/sglang:1", mounts=["/data:/data"])
    for k, v in over.items():
        site[k] = v
    return site


def small_pd(runtime: str = "none") -> dict:
    """PD on DeepSeek-V3 (671 GB FP8): one 1-node prefill, one 2-node decode, router in front."""
    return {
        "name": "t",
        "site": small_site(runtime),
        "model": {"profile": "deepseek-v3", "path": "/models/dsv3", "served_name": "dsv3"},
        "engine": {"name": "sglang", "version": "0.5.23"},
        "roles": {"prefill": {"nodes": 1}, "decode": {"nodes": 2}},
    }


def load_plan(file: Path | str, sets: tuple[str, ...] | list[str] = ()):
    from hpcserve.author import config, plan
    return plan.build(config.load(file, sets))


def plan_of(tmp: Path, doc: dict, name: str = "deploy.yaml", sets: tuple = ()):
    return load_plan(write_yaml(tmp / name, doc), sets)


def render(file: Path | str, job_dir: str, sets: tuple = ()) -> dict[str, tuple[str, int]]:
    from hpcserve.author.render import render_files
    return render_files(load_plan(file, sets), job_dir)


def scripts_of(files: dict) -> list[str]:
    return sorted(k for k in files if k == "job.sbatch" or k.endswith(".sh"))


# ------------------------------------------------------------------- sbatch's #SBATCH parsing

_C_SPACE = b" \t\n\v\f\r"


class SbatchParseError(Exception):
    pass


def _sep_word(line: bytes, i: int) -> bool:
    """`hetjob`/`packjob` at i, followed by the end or a space (sbatch's component separator)."""
    for word in (b"hetjob", b"packjob"):
        n = len(word)
        if line[i:i + n].lower() == word and (i + n == len(line) or line[i + n] in _C_SPACE):
            return True
    return False


def _get_argument(line: bytes, i: int, lineno: int) -> tuple[bytes | None, int]:
    """A port of sbatch's get_argument() (src/sbatch/opt.c): one word of an #SBATCH line.

    Quotes ' and " group like a shell's, but a backslash escapes the next character everywhere,
    even inside single quotes, and an unquoted # starts a comment."""
    n = len(line)
    while i < n and line[i] in _C_SPACE:
        i += 1
    if _sep_word(line, i):
        return None, n
    if i < n and line[i:i + 1] == b":":
        raise SbatchParseError(f"line {lineno}: Unexpected `:`")
    if i >= n:
        return None, i
    arg: bytearray | None = None
    quoted, qchar, escape = False, 0, False
    while i < n and (quoted or line[i] not in _C_SPACE) and line[i] != 0x0A:
        c = line[i]
        if escape:
            escape = False
        elif c == 0x5C:  # backslash
            i += 1
            if i < n and line[i] == 0x20:
                arg = arg if arg is not None else bytearray()
                arg.append(0x20)
                i += 1
            else:
                escape = True
            continue
        elif quoted:
            if c == qchar:
                quoted = False
                i += 1
                continue
        elif c in (0x22, 0x27):
            quoted, qchar = True, c
            i += 1
            continue
        elif c == 0x23:  # unquoted '#': the rest is a comment
            break
        arg = arg if arg is not None else bytearray()
        arg.append(c)
        i += 1
    if quoted:
        raise SbatchParseError(f"line {lineno}: Unmatched `{chr(qchar)}`")
    return (bytes(arg) if arg is not None else None), i


def sbatch_components(text: str) -> list[list[str]]:
    """The option words of each het-job component, read the way sbatch reads a batch script:
    `#SBATCH` (or `#SLURM`) lines until the first line that is neither blank nor a comment,
    `#SBATCH hetjob` starting the next component."""
    comps: list[list[str]] = [[]]
    for lineno, raw in enumerate(text.encode("utf-8").split(b"\n"), 1):
        if raw.startswith(b"#SBATCH"):
            i = 7
        elif raw.startswith(b"#SLURM"):
            i = 6
        else:
            body = raw.lstrip(_C_SPACE)
            if body and not body.startswith(b"#"):
                break  # the first command: sbatch reads no further
            continue
        while i < len(raw) and raw[i] in _C_SPACE:
            i += 1
        if _sep_word(raw, i):
            comps.append([])
            continue
        while True:
            arg, i = _get_argument(raw, i, lineno)
            if arg is None:
                break
            comps[-1].append(arg.decode("utf-8"))
    return comps


def sbatch_options(words: list[str]) -> list[tuple[str, str | None]]:
    """--name=value / --name words -> (name, value); anything else sbatch would refuse."""
    out = []
    for w in words:
        if not w.startswith("--"):
            raise SbatchParseError(f"not a long option: {w!r}")
        name, eq, value = w[2:].partition("=")
        out.append((name, value if eq else None))
    return out


# -------------------------------------------------------------------------------- stub commands

STUB_NAMES = ("srun", "python3", "scancel", "squeue", "apptainer", "enroot", "sbatch",
              "unsquashfs")

# Appends one record to $HPCSERVE_STUB_LOG: a marker, its path, working directory, argc, the argv
# words and `env -0`, all NUL-separated (bash, not python: the tests run hundreds of these).
# `enroot import --output F` creates F (as enroot would); a program named in HPCSERVE_STUB_FAIL
# exits 1 instead of 0. A lock keeps records whole when stubs run at once (a launch script's
# background port check beside its engine).
_MARK = "HPCSERVE-STUB-RECORD"
_STUB = f"""#!/bin/bash
{{ flock 9; {{ printf '%s\\0' {_MARK} "$0" "$PWD" "$#" "$@"; env -0; }} >&9; }} 9>> "$HPCSERVE_STUB_LOG"
me=${{0##*/}}
case ",${{HPCSERVE_STUB_FAIL:-}}," in *",$me,"*) exit 1 ;; esac
if [ "$me" = enroot ] && [ "${{1:-}}" = import ]; then
  while [ $# -gt 1 ]; do
    if [ "$1" = --output ]; then : > "$2"; break; fi
    shift
  done
fi
exit 0
"""


def make_stub(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_STUB, encoding="utf-8")
    path.chmod(0o755)
    return path


def install_stubs(bindir: Path) -> Path:
    for name in STUB_NAMES:
        make_stub(bindir / name)
    return bindir


def read_stub_log(log: Path, own_port: bool = False) -> list[dict]:
    """The stubs' calls in order: {prog, path, cwd, argv, env}; the launch scripts' background
    port-owner checks (hpcserve_runtime/ownport.py) only when asked for."""
    if not log.exists():
        return []
    toks = [t.decode("utf-8", "surrogateescape") for t in log.read_bytes().split(b"\0")]
    calls: list[dict] = []
    i = 0
    while i < len(toks):
        if toks[i] != _MARK:
            i += 1
            continue
        path, cwd, argc = toks[i + 1], toks[i + 2], int(toks[i + 3])
        argv = toks[i + 4:i + 4 + argc]
        i += 4 + argc
        env = {}
        while i < len(toks) and toks[i] != _MARK:
            if "=" in toks[i]:
                k, v = toks[i].split("=", 1)
                if k != "_":  # bash's last-command variable
                    env[k] = v
            i += 1
        # a Python program that takes a secret runs under hpcserve_runtime/secret_argv.py
        # (render.secret_argv), which hands it the rest of argv: that is the program's
        secret_argv = bool(argv) and argv[0].endswith("/hpcserve_runtime/secret_argv.py")
        calls.append({"prog": os.path.basename(path), "path": path, "cwd": cwd,
                      "argv": argv[1:] if secret_argv else argv, "secret_argv": secret_argv,
                      "env": env})
    return [c for c in calls if own_port or not is_own_port(c)]


def is_own_port(call: dict) -> bool:
    return any(a.endswith("/hpcserve_runtime/ownport.py") for a in call["argv"][:3])


def stub_env(bindir: Path, log: Path, home: Path, **extra: str) -> dict[str, str]:
    """A small, known environment: the stubs first on PATH, nothing that could hold a test value."""
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "HPCSERVE_STUB_LOG": str(log)}
    env.update(extra)
    return env


def run_bash(script: Path, env: dict, cwd: Path, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def write_nodes(job_dir: Path, inst: str, rows: list[tuple]) -> None:
    """run/<inst>.nodes as the runtime writes it: rank name address interface ib-devices."""
    (job_dir / "run").mkdir(exist_ok=True)
    (job_dir / "run" / f"{inst}.nodes").write_text(
        "".join(" ".join(str(c) for c in r) + "\n" for r in rows), encoding="utf-8")


# ------------------------------------------------------------------ the config dataclass fields

@dataclasses.dataclass(frozen=True)
class Leaf:
    path: tuple
    tp: Any
    meta: dict

    @property
    def dotted(self) -> str:
        return ".".join(map(str, self.path))


def _members(tp: Any) -> tuple:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return tuple(a for a in typing.get_args(tp) if a is not NoneType)
    return (tp,)


def leaf_fields(cls: type, prefix: tuple = (), roles: tuple = ("prefill", "decode")) -> Iterator[Leaf]:
    """Every non-dataclass field below `cls` (Deployment.site walks Site, roles walks Role per
    role name, optional dataclasses are walked)."""
    from hpcserve import engines
    from hpcserve.author.config import Deployment, Site, role_type
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        path = prefix + (f.name,)
        if cls is Deployment and f.name == "site":
            yield from leaf_fields(Site, path, roles)
            continue
        if cls is Deployment and f.name == "roles":  # the default engine's roles
            for r in roles:
                yield from leaf_fields(role_type(engines.DEFAULT), path + (r,), roles)
            continue
        mem = _members(tp)
        if len(mem) == 1 and dataclasses.is_dataclass(mem[0]):
            yield from leaf_fields(mem[0], path, roles)
            continue
        if typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            for r in roles:
                yield from leaf_fields(typing.get_args(tp)[1], path + (r,), roles)
            continue
        yield Leaf(path, tp, dict(f.metadata))


def takes(tp: Any, kind: type) -> bool:
    """Whether a scalar of `kind` is a valid value of `tp` (bool is not an int here)."""
    for m in _members(tp):
        if m is kind or (kind is int and m is float):
            return True
        if m is Any:
            return True
    return False


def list_item(tp: Any) -> Any | None:
    for m in _members(tp):
        if typing.get_origin(m) is list:
            return typing.get_args(m)[0]
    return None


def dict_value(tp: Any) -> Any | None:
    for m in _members(tp):
        if typing.get_origin(m) is dict:
            return typing.get_args(m)[1]
    return None


def string_carrying(leaf: Leaf) -> str | None:
    """How a leaf holds strings: 'str', 'list' (of str), 'dict' (str values), or None."""
    if takes(leaf.tp, str):
        return "str"
    item = list_item(leaf.tp)
    if item is not None and takes(item, str):
        return "list"
    val = dict_value(leaf.tp)
    if val is not None and takes(val, str):
        return "dict"
    return None

