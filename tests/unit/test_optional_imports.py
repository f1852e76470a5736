"""matplotlib is an extra (`hpcserve[report]`) and submitit is imported only by `hpcserve bench`:
without them every other command works, and `report` says in one line which extra it needs."""

from __future__ import annotations

import subprocess
import sys

from unitkit import ROOT


def _hpcserve_without(modules: list[str], *args: str, cwd) -> subprocess.CompletedProcess:
    """The CLI in a Python where importing `modules` fails (a None entry in sys.modules makes
    `import` raise ImportError, as if the package were not installed)."""
    code = ("import sys\n"
            f"for m in {modules!r}: sys.modules[m] = None\n"
            "from hpcserve.cli import main\nmain()")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_report_without_matplotlib_names_the_extra(tmp_path):
    r = _hpcserve_without(["matplotlib"], "report", "5", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "pip install 'hpcserve[report]'" in r.stderr, r.stderr


def test_the_other_commands_need_neither_matplotlib_nor_submitit(tmp_path):
    gone = ["matplotlib", "submitit"]
    r = _hpcserve_without(gone, "render", str(ROOT / "examples" / "demo.yaml"), "--out",
                          str(tmp_path / "job"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "job" / "job.sbatch").is_file()
    r = _hpcserve_without(gone, "plan", str(ROOT / "examples" / "demo.yaml"), cwd=tmp_path)
    assert r.returncode == 0 and "prefill-0" in r.stdout, r.stderr
    r = _hpcserve_without(gone, "--help", cwd=tmp_path)
    assert r.returncode == 0 and "bench" in r.stdout, r.stderr
