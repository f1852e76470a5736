"""Generated broken and hostile deployments: every one is refused in exactly one line.

A seeded generator (the same cases on every run, nothing from the clock) breaks a valid
deployment in ways that are each refused by construction: control characters in values, in keys
and raw in the file, required keys given as null, unknown keys of any length and script, wrong
types, releases outside the flag matrix, broken YAML, bad `--set` paths and values, one to three
at a time. Each case runs `hpcserve render FILE --out DIR` through the CLI's own entry point;
the property: exit code 2, no traceback, exactly one line on stderr, starting `hpcserve: error:`,
no control character in it, bounded, nothing on stdout, nothing written. A seeded sample runs
again as a real process, which must print the same line.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpcserve.cli import main
from unitkit import ROOT

SEED = 24
CASES = 400
SAMPLE = 24  # of them, also run as a real process
MAX_LINE = 1000  # the file's path, the field, an echoed value cut at 60 characters, the rule

# C0 controls, DEL, C1 controls but NEL, and the two non-characters: YAML refuses each anywhere in a
# file (YAML 1.1 "printable characters"); a config string refuses C0 and DEL.
RAW_REFUSED = [chr(c) for c in [*range(0, 9), 11, 12, *range(14, 32), 127, *range(0x80, 0x85),
                                *range(0x86, 0xa0), 0xfffe, 0xffff]]
VALUE_REFUSED = [chr(c) for c in [*range(0, 32), 127]]
WORDS = ["x", "nodes", "ü", "✓", "日本", "\u202e", "$(touch PWNED)", "`id`", "'", '"', "\\", "%n",
         " ", "-", ":", "#", "{", "[", "&a", "*a", "!!python/object:os.system"]
MAPPINGS = [(), ("model",), ("engine",), ("router",), ("readiness",), ("roles", "decode"),
            ("roles", "prefill"), ("roles", "decode", "recovery")]
REQUIRED = [("name",), ("model",), ("model", "profile"), ("model", "path"), ("site",)]


def base() -> dict:
    return {"name": "gen", "site": "local",
            "model": {"profile": "deepseek-v3", "path": "/models/dsv3"},
            "engine": {"name": "sglang", "version": "0.5.23"},
            "router": {"port": 8000}, "readiness": {"engine_timeout": 600},
            "roles": {"prefill": {"nodes": 1, "recovery": {"restart": True}},
                      "decode": {"nodes": 2, "recovery": {"restart": True}}}}


@dataclass
class Case:
    n: int
    doc: dict = field(default_factory=base)
    sets: list[str] = field(default_factory=list)
    raw: list[tuple[int, str]] = field(default_factory=list)   # (position / 1000, text)
    tail: str = ""
    kinds: list[str] = field(default_factory=list)

    def text(self) -> str:
        t = yaml.safe_dump(self.doc, allow_unicode=True, sort_keys=False, width=10 ** 6)
        for frac, s in self.raw:
            i = len(t) * frac // 1000
            t = t[:i] + s + t[i:]
        return t + self.tail


def _text(rng: random.Random, longest: int = 40) -> str:
    out = "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
    if rng.random() < 0.15:
        out *= rng.randint(50, longest * 50)
    return out


def _at(doc: dict, path: tuple) -> dict:
    """The mapping at `path`, made one where an earlier mutation left something else."""
    for p in path:
        if not isinstance(doc.get(p), dict):
            doc[p] = {}
        doc = doc[p]
    return doc


def _mutate(rng: random.Random, c: Case) -> None:
    kind = rng.choice(["value_control", "key_control", "raw_control", "null_required",
                       "unknown_key", "wrong_type", "unknown_release", "broken_yaml", "bad_set",
                       "huge_name"])
    c.kinds.append(kind)
    d = c.doc
    if kind == "value_control":
        path = rng.choice([("name",), ("model", "path"), ("model", "served_name"),
                           ("router", "policy"), ("engine", "image")])
        text = _text(rng)
        i = rng.randint(0, len(text))
        _at(d, path[:-1])[path[-1]] = text[:i] + rng.choice(VALUE_REFUSED) + text[i:]
    elif kind == "key_control":
        key = _text(rng, 4)
        i = rng.randint(0, len(key))
        _at(d, rng.choice(MAPPINGS))[key[:i] + rng.choice(VALUE_REFUSED) + key[i:]] = 1
    elif kind == "raw_control":
        c.raw.append((rng.randint(0, 1000), rng.choice(RAW_REFUSED)))
    elif kind == "null_required":
        path = rng.choice(REQUIRED)
        _at(d, path[:-1])[path[-1]] = None
    elif kind == "unknown_key":
        _at(d, rng.choice(MAPPINGS))["zz" + _text(rng, 20).replace("\n", "")] = _text(rng)
    elif kind == "wrong_type":
        path, value = rng.choice([
            (("roles", "decode", "nodes"), _text(rng)), (("roles", "prefill", "nodes"), -5),
            (("time_limit",), "x" + _text(rng)), (("engine", "version"), "v" + _text(rng)),
            (("requeue",), [1, 2]), (("router", "port"), {"a": 1}), (("engine", "simulate"), 3),
            (("roles", "decode", "tp"), 10 ** rng.randint(5, 400))])
        _at(d, path[:-1])[path[-1]] = value
    elif kind == "unknown_release":
        d["engine"]["version"] = f"{rng.randint(7, 99)}.{rng.randint(0, 99)}.{rng.randint(0, 9)}"
    elif kind == "broken_yaml":
        c.tail += rng.choice(["\nbroken: [1, 2\n", "\n  - x\n", "\nk: {a: 1\n", "\n\t- tab\n",
                              '\nk: "unterminated\n', "\nk: &a [*b]\n"])
    elif kind == "bad_set":  # each refused; no NUL, which no command line can carry
        raw = rng.choice(RAW_REFUSED[1:])
        key, value = rng.choice([
            ("roles..x", _text(rng)), (".x", "1"), ("x.", "1"), ("roles.nope.nodes", "2"),
            ("roles.decode.nodez", "2"), ("model.path.x", "1"),
            ("roles.decode.nodes", rng.choice(["0", "two", "[1,", f"1{raw}"])),
            ("name", rng.choice(["-" + _text(rng), "[1,", f"a{raw}b", "{a: 1}"])),
            ("roles.decode" + rng.choice(VALUE_REFUSED[1:]) + ".nodes", "2")])
        c.sets.append(key if rng.random() < 0.1 else f"{key}={value}")
    else:
        d["name"] = "n" * rng.randint(64, 100_000)


def generate() -> list[Case]:
    rng = random.Random(SEED)
    cases = []
    for n in range(CASES):
        c = Case(n)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            _mutate(rng, c)
        cases.append(c)
    return cases


GENERATED = generate()


def _write(c: Case, tmp: Path) -> tuple[Path, list[str]]:
    d = tmp / f"case{c.n}"
    d.mkdir()
    f = d / "deploy.yaml"
    f.write_text(c.text(), encoding="utf-8")
    args = ["render", str(f), "--out", str(d / "out")]
    for s in c.sets:
        args += ["--set", s]
    return d, args


CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _check_one_line(c: Case, rc: int, out: str, err: str, d: Path) -> str:
    """The property, for one case; returns its error line."""
    what = f"case {c.n} ({', '.join(c.kinds)}): exit {rc}, stderr {err[:300]!r}"
    assert rc == 2, what
    assert "Traceback" not in err + out, what
    assert out == "", what
    assert err.startswith("hpcserve: error: ") and err.endswith("\n") and err.count("\n") == 1, what
    assert not CONTROL.search(err[:-1]), what
    assert len(err) < MAX_LINE, what
    assert sorted(p.name for p in d.iterdir()) == ["deploy.yaml"], f"{what}: something written"
    return err


@pytest.fixture(scope="module")
def in_process(tmp_path_factory) -> dict[int, str]:
    tmp = tmp_path_factory.mktemp("generated")
    runner = CliRunner()
    lines = {}
    for c in GENERATED:
        d, args = _write(c, tmp)
        r = runner.invoke(main, args, catch_exceptions=True)
        assert r.exception is None or isinstance(r.exception, SystemExit), \
            f"case {c.n} ({', '.join(c.kinds)}): {r.exc_info}"
        lines[c.n] = _check_one_line(c, r.exit_code, r.stdout, r.stderr, d).replace(str(d),
                                                                                    "<dir>")
    return lines


def test_generation_is_deterministic_and_covers_every_kind():
    again = generate()
    assert [(c.text(), c.sets) for c in again] == [(c.text(), c.sets) for c in GENERATED]
    kinds = {k for c in GENERATED for k in c.kinds}
    assert len(kinds) == 10 and sum(len(c.kinds) > 1 for c in GENERATED) > CASES // 10


def test_every_generated_case_is_refused_in_one_line(in_process):
    assert len(in_process) == CASES
    # the line names the source: the file, or the --set where one of them is at fault
    assert sum(": error: --set " in line for line in in_process.values()) > 10


def test_null_required_keys_are_named_at_their_own_line(in_process):
    seen = 0
    for c in GENERATED:
        if c.kinds == ["null_required"]:
            key = next(k for k in ("path", "profile", "name", "site", "model")
                       if re.search(rf"^\s*{k}: null$", c.text(), re.M))
            line = 1 + next(i for i, ln in enumerate(c.text().splitlines())
                            if re.fullmatch(rf"\s*{key}: null", ln))
            assert f"deploy.yaml:{line}: " in in_process[c.n], in_process[c.n]
            seen += 1
    assert seen >= 5


def _cli() -> str:
    exe = Path(sys.executable).parent / "hpcserve"
    return str(exe if exe.exists() else ROOT / ".venv" / "bin" / "hpcserve")


def test_a_sample_prints_the_same_line_as_a_real_process(in_process, tmp_path):
    """The in-process runs are the real CLI: a seeded sample run as processes agrees."""
    sample = random.Random(SEED).sample(GENERATED, SAMPLE)

    def run(c: Case) -> tuple[Case, Path, subprocess.CompletedProcess]:
        d, args = _write(c, tmp_path)
        p = subprocess.run([_cli(), *args], capture_output=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        return c, d, p

    with ThreadPoolExecutor(max_workers=2) as ex:
        for c, d, p in ex.map(run, sample):
            err = p.stderr.decode("utf-8")
            line = _check_one_line(c, p.returncode, p.stdout.decode("utf-8"), err, d)
            assert line.replace(str(d), "<dir>") == in_process[c.n]
