"""`hpcserve --help` is where a new user starts: every command under the heading of what it is
for, whole one-line summaries, every option explained, an example on every command's page, all
within 100 columns; the SSH options are the group's, given once, or through HPCSERVE_* variables."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from hpcserve.operate import ops
from hpcserve.cli import SECTIONS, main

SSH_OPTIONS = {"--remote", "--jump", "--identity", "--known-hosts"}


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    """Every command below `group`, as (path, command), dev-cluster's subcommands included."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))


COMMANDS = list(_commands(main))
IDS = [" ".join(p) for p, _ in COMMANDS]


@functools.cache
def _help(*args: str) -> str:
    """The help page as a wide terminal shows it (the help must still keep to 100 columns).
    A process of its own: click's CliRunner forces its own terminal width."""
    r = subprocess.run([sys.executable, "-c", "from hpcserve.cli import main; main()", *args,
                        "--help"], env={**os.environ, "COLUMNS": "250"}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_every_command_is_listed_under_a_heading():
    text = _help()
    lines = text.splitlines()
    for title, names in SECTIONS:
        heading = title[0].upper() + title[1:] + ":"
        at = lines.index(heading)
        block = []
        for ln in lines[at + 1:]:
            if not ln.startswith("  "):
                break
            block.append(ln.split()[0])
        assert block == list(names), f"{heading} lists {block}"
    top = {p[0] for p, _ in COMMANDS}
    assert top == {n for _, names in SECTIONS for n in names}, "a command under no heading"
    assert "Other:" not in lines


def test_each_summary_is_whole_on_one_line():
    lines = _help().splitlines()
    for (name,), cmd in [(p, c) for p, c in COMMANDS if len(p) == 1]:
        short = cmd.get_short_help_str(limit=200)
        assert not short.endswith("..."), f"{name}: summary cut: {short!r}"
        (row,) = [ln for ln in lines if ln.split()[:1] == [name] and ln.startswith("  ")]
        assert row.split(None, 1)[1] == short, f"{name}: the summary is not whole on its line"


@pytest.mark.parametrize("path", [()] + [p for p, _ in COMMANDS],
                         ids=["hpcserve"] + IDS)
def test_every_help_line_fits_100_columns(path):
    lines = _help(*path).splitlines()
    long = [ln for ln in lines if len(ln) > 100]
    assert not long, long
    cut = [ln for ln in lines if ln.endswith("...") and not ln.startswith("Usage:")]
    assert not cut, f"cut mid-sentence: {cut}"


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=IDS)
def test_every_option_has_help(path, cmd):
    bare = [p.opts[0] for p in cmd.params if isinstance(p, click.Option) and not (p.help or "")
            .strip()]
    assert not bare, f"hpcserve {' '.join(path)}: options without help: {bare}"


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=IDS)
def test_every_command_shows_an_example(path):
    text = _help(*path)
    lines = text.splitlines()
    at = next(k for k, ln in enumerate(lines) if ln.strip() == "Example:")
    example = lines[at + 1].strip()
    assert example.startswith(("hpcserve ", "eval ")), example
    assert " ".join(path) in text.split("Example:")[1].split("Options:")[0], \
        "the example runs the command it explains"


def test_the_ssh_options_are_the_groups_alone():
    assert SSH_OPTIONS <= {o for p in main.params for o in getattr(p, "opts", ())}
    for path, cmd in COMMANDS:
        mine = {o for p in cmd.params for o in getattr(p, "opts", ())}
        assert not mine & SSH_OPTIONS, f"hpcserve {' '.join(path)} repeats {mine & SSH_OPTIONS}"
    text = _help()
    for opt in SSH_OPTIONS:
        assert text.count(opt + " ") >= 1
    assert sum(_help(*p).count("--known-hosts FILE") for p, _ in COMMANDS) == 0


class _Reached(Exception):
    pass


@pytest.fixture
def runner_args(monkeypatch):
    """What the commands hand the runner factory (ops.runner_for); it stops the command there."""
    seen = []

    def factory(remote, **ssh):
        seen.append({"remote": remote, **ssh})
        from hpcserve.errors import HpcserveError
        raise HpcserveError("stopped at the runner factory")

    monkeypatch.setattr(ops, "runner_for", factory)
    return seen


@pytest.mark.parametrize("argv", [["cancel", "7"], ["status", "7"], ["logs", "7"],
                                  ["bench", "7"], ["report", "7"]])
def test_the_environment_variables_reach_the_runner(runner_args, tmp_path, argv):
    env = {"HPCSERVE_REMOTE": "me@login.example.org:2222", "HPCSERVE_JUMP": "me@gate",
           "HPCSERVE_IDENTITY": f"{tmp_path}/k1:{tmp_path}/k2",
           "HPCSERVE_KNOWN_HOSTS": f"{tmp_path}/kh", "HPCSERVE_STATE_DIR": str(tmp_path)}
    r = CliRunner().invoke(main, argv, env=env)
    assert r.exit_code == 2 and "stopped at the runner factory" in r.output, r.output
    assert runner_args[0] == {"remote": "me@login.example.org:2222", "jump": "me@gate",
                              "key_filenames": [f"{tmp_path}/k1", f"{tmp_path}/k2"],
                              "known_hosts": f"{tmp_path}/kh"}


def test_the_group_options_reach_the_runner_and_beat_the_environment(runner_args, tmp_path):
    r = CliRunner().invoke(main, ["--remote", "u@h", "--jump", "u@j", "-i", "a", "-i", "b",
                                  "--known-hosts", "kh", "cancel", "7"],
                           env={"HPCSERVE_REMOTE": "other@elsewhere",
                                "HPCSERVE_STATE_DIR": str(tmp_path)})
    assert r.exit_code == 2, r.output
    assert runner_args[0] == {"remote": "u@h", "jump": "u@j", "key_filenames": ["a", "b"],
                              "known_hosts": "kh"}


def test_an_ssh_option_after_the_command_is_refused_saying_where_it_goes():
    r = CliRunner().invoke(main, ["status", "--remote", "u@h"])
    assert r.exit_code == 2
    assert ("--remote is an option of hpcserve itself: put it before the command "
            "(hpcserve --remote ... status ...)") in r.output
    assert "Did you mean" not in r.output
    r = CliRunner().invoke(main, ["status", "--bogus"])  # other unknown options: click's words
    assert r.exit_code == 2 and "No such option '--bogus'" in r.output


def test_without_a_remote_the_runner_is_local(runner_args, tmp_path, monkeypatch):
    monkeypatch.delenv("HPCSERVE_REMOTE", raising=False)
    r = CliRunner().invoke(main, ["cancel", "7"], env={"HPCSERVE_STATE_DIR": str(tmp_path)})
    assert r.exit_code == 2, r.output
    assert runner_args[0]["remote"] is None
