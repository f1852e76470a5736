"""The Runner contract: one behavioural suite that LocalRunner and SSHRunner (to a real sshd on
127.0.0.1, as the same user, so both see the same files) must both pass.

Both drivers meet every case of the contract.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from pathlib import Path
from typing import Any, Iterator

import pytest

from hpcserve.errors import HpcserveError
from hpcserve.slurm.runner import CommandError, LocalRunner, Result, SlurmUnreachable


@pytest.fixture(params=["local", "ssh"])
def runner(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "local":
        r: Any = LocalRunner()
    else:
        r = request.getfixturevalue("sshd").runner()
    yield r
    r.close()


# ------------------------------------------------------------------------------- run

def test_run_returns_a_result(runner: Any) -> None:
    res = runner.run(["sh", "-c", "echo out; echo err >&2"])
    assert isinstance(res, Result)
    assert res == Result(("sh", "-c", "echo out; echo err >&2"), 0, "out\n", "err\n")


def test_nonzero_exit(runner: Any) -> None:
    argv = ["sh", "-c", "echo boom >&2; exit 3"]
    assert runner.run(argv, check=False).rc == 3
    with pytest.raises(CommandError) as ei:
        runner.run(argv)
    assert ei.value.result.rc == 3 and ei.value.exit_code == 2
    msg = str(ei.value)
    assert msg.startswith("`sh -c 'echo boom >&2; exit 3'`")
    assert msg.endswith(" failed with exit code 3: boom")


def test_argv_is_never_parsed_by_a_shell(runner: Any, tmp_path: Path) -> None:
    m = tmp_path / "pwned"
    args = ["a b", "'q'", '"dq"', f"$(touch {m})", f"`touch {m}`", f"x; touch {m}", "*", "~",
            "", "new\nline", "é"]
    res = runner.run(["printf", "[%s]", *args])
    assert res.out == "".join(f"[{a}]" for a in args)
    assert not m.exists()


def test_missing_executable(runner: Any) -> None:
    with pytest.raises(HpcserveError, match=r"^`no-such-cmd-xyz` not found") as ei:
        runner.run(["no-such-cmd-xyz", "--help"])
    assert "\n" not in str(ei.value)


def test_stdin_is_empty(runner: Any) -> None:
    assert runner.run(["cat"], timeout=10).out == ""


def test_timeout(runner: Any) -> None:
    with pytest.raises(HpcserveError, match=r"`sleep 3`.* did not finish within 0 s"):
        runner.run(["sleep", "3"], timeout=0.3)


def test_undecodable_output_is_replaced(runner: Any, request: pytest.FixtureRequest) -> None:
    res = runner.run(["printf", "a\\377b"])
    assert res.out == "a\ufffdb"


def test_close_is_idempotent_and_runner_stays_usable(runner: Any) -> None:
    runner.close()
    runner.close()
    assert runner.run(["echo", "ok"]).out == "ok\n"


def _squeue_stub(tmp_path: Path, refusals: int) -> str:
    """An `squeue` (by its name) that says the controller timed out `refusals` times, then
    answers."""
    d = tmp_path / "slurm-bin"
    d.mkdir()
    p = d / "squeue"
    p.write_text(f"""#!/bin/sh
echo x >> {d}/tries
if [ $(wc -l < {d}/tries) -le {refusals} ]; then
  echo 'slurm_load_jobs error: Socket timed out on send/recv operation' >&2; exit 1
fi
echo '5|RUNNING|dep'
""")
    p.chmod(0o755)
    return str(p)


def test_slurm_is_asked_again_while_its_controller_does_not_answer(runner: Any,
                                                                  tmp_path: Path) -> None:
    slept: list[float] = []
    runner.sleep = slept.append
    squeue = _squeue_stub(tmp_path, 2)
    assert runner.run([squeue, "-h"]).out == "5|RUNNING|dep\n"
    assert len(slept) == 2


def test_a_controller_that_never_answers_is_one_line(runner: Any, tmp_path: Path) -> None:
    runner.sleep = lambda _s: None
    squeue = _squeue_stub(tmp_path, 99)
    with pytest.raises(SlurmUnreachable) as ei:
        runner.run([squeue, "-h", "-o", "%i|%T|%j"], check=False)
    where = "" if isinstance(runner, LocalRunner) else f" on {runner.target}"
    assert re.fullmatch(re.escape(f"Slurm controller unreachable: {squeue} -h -o ...{where}: "
                                  "slurm_load_jobs error: Socket timed out on send/recv "
                                  "operation (5 tries in ") + r"\d+ s\)", str(ei.value)), ei.value
    assert ei.value.exit_code == 2


# ------------------------------------------------------------------------------- files

def test_read_text(runner: Any, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes("héllo\n".encode() + b"\xff")
    (tmp_path / "d").mkdir()
    assert runner.read_text(str(tmp_path / "f.txt")) == "héllo\n\ufffd"
    assert runner.read_text(str(tmp_path / "missing")) is None
    assert runner.read_text(str(tmp_path / "d")) is None


def test_list_dir(runner: Any, tmp_path: Path) -> None:
    for n in ("b", ".hidden", "a"):
        (tmp_path / n).write_text("")
    (tmp_path / "sub").mkdir()
    assert runner.list_dir(str(tmp_path)) == [".hidden", "a", "b", "sub"]
    assert runner.list_dir(str(tmp_path / "missing")) == []
    assert runner.list_dir(str(tmp_path / "a")) == []


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    spec = {"job.sbatch": (b"#!/bin/bash\n", 0o755), "plan.json": (b"{}\n", 0o644),
            "secret": (b"k\n", 0o600), "sub/run.sh": (b"#!/bin/sh\n", 0o750),
            "sub/deep/blob": (bytes(range(256)), 0o444)}
    for rel, (data, mode) in spec.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(mode)
    (root / "sub").chmod(0o751)
    return spec


def test_put_tree_copies_contents_and_modes(runner: Any, tmp_path: Path) -> None:
    spec = _tree(tmp_path / "src")
    dst = tmp_path / "a" / "b" / "job"
    runner.put_tree(str(tmp_path / "src"), str(dst))
    for rel, (data, mode) in spec.items():
        assert (dst / rel).read_bytes() == data
        assert stat.S_IMODE((dst / rel).stat().st_mode) == mode, rel
    assert stat.S_IMODE((dst / "sub").stat().st_mode) == 0o751
    assert os.listdir(dst.parent) == ["job"]


def test_put_tree_refuses_a_non_empty_destination(runner: Any, tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    _tree(tmp_path / "src")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep").write_text("mine")
    with pytest.raises(HpcserveError, match="exists: a job directory is made new"):
        runner.put_tree(str(tmp_path / "src"), str(tmp_path / "dst"))
    assert os.listdir(tmp_path / "dst") == ["keep"]


def test_put_tree_refuses_an_empty_directory_or_a_link_that_was_there(
        runner: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # another user who made the path first could change the job's scripts once they are in it
    _tree(tmp_path / "src")
    (tmp_path / "dst").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "dst")
    for name in ("dst", "link"):
        with pytest.raises(HpcserveError, match="exists: a job directory is made new"):
            runner.put_tree(str(tmp_path / "src"), str(tmp_path / name))
    assert os.listdir(tmp_path / "dst") == [] and (tmp_path / "link").is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["dst", "link", "src"]  # no upload left behind


# ------------------------------------------------------------------------------- paths

def test_expand_path(runner: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # the local home is $HOME; an SSH session's is the passwd entry's (the same unless HOME is set)
    ssh = request.node.callspec.params["runner"] == "ssh"
    home = os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir if ssh else os.path.expanduser("~"))
    assert runner.expand_path("~") == home
    assert runner.expand_path("~/hpcserve/jobs") == f"{home}/hpcserve/jobs"
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    real = os.path.realpath(tmp_path / "real")
    assert runner.expand_path(str(tmp_path / "link")) == real
    assert runner.expand_path(str(tmp_path / "link" / "x" / ".." / "new")) == f"{real}/new"
    assert runner.expand_path(str(tmp_path / "link") + "/") == real


def test_write_atomically_makes_the_directory_and_leaves_no_temporary_file(runner: Any,
                                                                          tmp_path: Path) -> None:
    # `hpcserve scale --remove` writes its drain requests so, here and over SSH alike
    from hpcserve.operate.scale import write_atomically
    target = tmp_path / "run" / "control" / "drain-decode-1.json"
    text = '{"timeout_s": 30, "why": "it\'s $HOME; `x`"}\n'
    write_atomically(runner, str(target), text)
    assert target.read_text() == text
    write_atomically(runner, str(target), "{}\n")  # a second request replaces the first whole
    assert target.read_text() == "{}\n"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]
