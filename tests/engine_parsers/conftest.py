"""Fixtures for validating generated command lines with the engines' REAL argument parsers.

`sglang_parser` (session): makes sure the engines venv exists (scripts/setup-engines.sh: a no-op
when its stamp is current, a few minutes and network to PyPI on a fresh machine) and returns a
callable ``parse(argvs) -> list[dict]`` that runs all argvs through SGLang's own parser in one
subprocess (tests/engine_parsers/sglang_check.py under the engines venv's python), started once
per test session and asked again for each check (`CheckProcess`). A setup failure
FAILS the tests: they must not be skipped silently where the venv cannot be built.

Each result: ``ok`` / ``error`` (strict: ``ArgumentParser(allow_abbrev=False)`` + ``parse_args``),
``server_ok`` / ``server_error`` (the parser ``prepare_server_args`` builds: abbreviations allowed),
``values`` (parsed namespace values of a few keys, on a strict success) and ``warnings`` (what
SGLang logged while parsing, e.g. deprecation notices). See sglang_check.py.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK_SCRIPT = Path(__file__).resolve().parent / "sglang_check.py"
SETUP_SCRIPT = REPO / "scripts" / "setup-engines.sh"


def engines_venv() -> Path:
    return Path(os.environ.get("HPCSERVE_ENGINES_VENV", REPO / ".venv-engines"))


class CheckProcess:
    """A check script started once with ``--serve`` (checkserve.py) and asked many times: the
    engine is imported once per test session, not once per check. ``ask(args, stdin)`` answers
    what ``python SCRIPT *args < stdin`` would print; where the script fails, it raises with its
    traceback and the process's stderr. The process ends when ``close()`` closes its stdin."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], timeout: float = 600):
        self.name, self.argv, self.env, self.timeout = name, argv, env, timeout
        self.proc: subprocess.Popen | None = None
        self.stderr = None

    def _start(self) -> subprocess.Popen:
        self.stderr = tempfile.TemporaryFile(mode="w+")  # read only when it fails
        return subprocess.Popen([*self.argv, "--serve"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                env=self.env)

    def _failed(self, why: str) -> RuntimeError:
        self.stderr.seek(0)
        return RuntimeError(f"{self.name}: {why}\n{self.stderr.read()[-4000:]}")

    def ask(self, args: list[str], stdin: str | None = None) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        self.proc.stdin.write(json.dumps({"args": args, "stdin": stdin}) + "\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], self.timeout)[0]:
            self.proc.kill()
            raise self._failed(f"no answer within {self.timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise self._failed(f"exited {self.proc.wait()}")
        out = json.loads(line)
        if "__error__" in out:
            raise self._failed(out["__error__"])
        return out

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class SglangParser:
    """``parse(argvs)`` -> one result dict per argv; ``list_flags()`` -> the parser's option
    strings.

    ``release_dir``: an older release's unpacked wheel, put first on PYTHONPATH so its `sglang`
    package is the one imported; ``stubs``: the modules sglang_check.py may stand in for."""

    def __init__(self, python: Path, release_dir: Path | None = None,
                 stubs: tuple[str, ...] = ()):
        self.python = python
        self.release_dir = release_dir
        self.stubs = stubs
        self._flags: dict[str, Any] | None = None
        env = dict(os.environ)
        if self.release_dir is not None:
            env["PYTHONPATH"] = str(self.release_dir)
        stubs = [w for m in self.stubs for w in ("--stub", m)]
        self.process = CheckProcess(f"sglang_check.py ({release_dir or python})",
                                    [str(python), str(CHECK_SCRIPT), *stubs], env)

    def _run(self, args: list[str], stdin: str | None = None) -> dict[str, Any]:
        return self.process.ask(args, stdin)

    def __call__(self, argvs: list[list[str]], keys: list[str] | None = None,
                 list_flags: bool = False) -> list[dict[str, Any]]:
        """``list_flags``: also answer list_flags() from the same subprocess."""
        req: dict[str, Any] = {"argvs": [[str(a) for a in argv] for argv in argvs]}
        if keys is not None:
            req["keys"] = keys
        if list_flags:
            req["list_flags"] = True
        out = self._run([], json.dumps(req))
        if list_flags:
            self._flags = out["list_flags"]
        assert len(out["results"]) == len(argvs)
        return out["results"]

    def list_flags(self) -> dict[str, Any]:
        """``{"sglang_version", "flags", "short_flags", "deprecated", "choices"}`` (cached)."""
        if self._flags is None:
            self._flags = self._run(["--list-flags"])
        return self._flags

    @property
    def version(self) -> str:
        return self.list_flags()["sglang_version"]


@pytest.fixture(scope="session")
def sglang_parser() -> Iterator[SglangParser]:
    venv = engines_venv()
    # Always run it: with a current stamp it returns in ~0.1 s, and it rebuilds a venv that is
    # missing, half-built or older than the script.
    proc = subprocess.run(
        ["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=1800,
        env={**os.environ, "HPCSERVE_ENGINES_VENV": str(venv)},
    )
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/setup-engines.sh failed ({proc.returncode}); the engine-parser tests need it.\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}",
            pytrace=False,
        )
    python = venv / "bin" / "python"
    assert python.exists(), f"{python} missing after setup-engines.sh"
    parser = SglangParser(python)
    yield parser
    parser.process.close()


# Every SGLang release hpcserve accepts besides the engines venv's (hpcserve/engines/sglang.py
# CHECKED), each with the modules its parser's imports need that the venv lacks. A placeholder
# stands in only where no real module is found (sglang_check.py --stub); that it leaves the parser
# as the release built it is tested: the loaded parser's flags, deprecations and choices equal the
# table extracted from the wheel's source (test_sglang_releases.py).
SGLANG_RELEASES: dict[str, tuple[str, ...]] = {
    # 0.5.20 imports them at module level for multimodal input, the OpenAI-protocol models and
    # grammar backends (sglang/srt/utils/common.py: torchvision.io.decode_jpeg; sglang/srt/
    # entrypoints/openai/protocol.py: openai.types; partial_json_parser and xgrammar under
    # sglang/srt/function_call and constrained/), none of which add_cli_args calls. 0.5.21 moved
    # them behind lazy imports (it loads with none).
    "0.5.20": ("torchvision", "openai", "partial_json_parser", "xgrammar"),
    "0.5.21": (),
    "0.5.22": (),
}
RELEASES_SETUP = REPO / "scripts" / "setup-sglang-releases.sh"


def sglang_releases_dir() -> Path:
    return Path(os.environ.get("HPCSERVE_SGLANG_RELEASES_DIR", REPO / ".sglang-releases"))


@pytest.fixture(scope="session")
def sglang_release_parsers(sglang_parser) -> Iterator[dict[str, SglangParser]]:
    """{release: its own parser} for every release in SGLANG_RELEASES: the engines venv's python
    with the release's unpacked wheel first on PYTHONPATH. A failed setup FAILS the tests."""
    root = sglang_releases_dir()
    proc = subprocess.run(["bash", str(RELEASES_SETUP)], capture_output=True, text=True,
                          timeout=1800,
                          env={**os.environ, "HPCSERVE_SGLANG_RELEASES_DIR": str(root)})
    if proc.returncode != 0:
        pytest.fail(f"scripts/setup-sglang-releases.sh failed ({proc.returncode}); the older "
                    f"SGLang releases' parser tests need it.\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-6000:]}", pytrace=False)
    out = {}
    for version, stubs in SGLANG_RELEASES.items():
        folder = root / version
        if not (folder / "sglang" / "srt" / "server_args.py").is_file():
            pytest.fail(f"{folder} holds no sglang/srt/server_args.py after "
                        "scripts/setup-sglang-releases.sh: is the release in its RELEASES?",
                        pytrace=False)
        out[version] = SglangParser(sglang_parser.python, folder, stubs)
    yield out
    for parser in out.values():
        parser.process.close()


VLLM_CHECK = Path(__file__).resolve().parent / "vllm_check.py"
VLLM_SETUP = REPO / "scripts" / "setup-vllm-parser.sh"


class VllmParser:
    """``parse(argvs)`` -> one ``{ok, error, values}`` per argv, through `vllm serve`'s parser."""

    def __init__(self, python: Path):
        self.python = python
        self.version = None
        self.process = CheckProcess("vllm_check.py", [str(python), str(VLLM_CHECK)],
                                    {**os.environ, "VLLM_TARGET_DEVICE": "cpu"})

    def _run(self, args: list[str], stdin: str | None = None) -> dict[str, Any]:
        return self.process.ask(args, stdin)

    def list_flags(self) -> list[str]:
        return self._run(["--list-flags"])["flags"]

    def __call__(self, argvs: list[list[str]]) -> list[dict[str, Any]]:
        out = self._run([], json.dumps({"argvs": argvs}))
        self.version = out["vllm_version"]
        assert len(out["results"]) == len(argvs)
        return out["results"]


@pytest.fixture(scope="session")
def vllm_parser() -> Iterator[VllmParser]:
    venv = Path(os.environ.get("HPCSERVE_VLLM_PARSER_VENV", REPO / ".venv-engines-vllm"))
    proc = subprocess.run(["bash", str(VLLM_SETUP)], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "HPCSERVE_VLLM_PARSER_VENV": str(venv)})
    if proc.returncode != 0:
        pytest.fail(f"scripts/setup-vllm-parser.sh failed ({proc.returncode}); the vLLM parser "
                    f"tests need it.\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}", pytrace=False)
    parser = VllmParser(venv / "bin" / "python")
    yield parser
    parser.process.close()


KT_CHECK = Path(__file__).resolve().parent / "ktransformers_check.py"
KT_SETUP = REPO / "scripts" / "setup-ktransformers-parser.sh"


def kt_parser_dir() -> Path:
    return Path(os.environ.get("HPCSERVE_KT_PARSER_DIR", REPO / ".cache" / "ktransformers-parser"))


class KtLegacyParser:
    """The legacy KTransformers server's own parser (ktransformers_check.py), from the release
    scripts/setup-ktransformers-parser.sh fetched: ``parse(argvs)`` -> one ``{ok, error,
    values}`` per argv; ``describe()`` -> ``{version, options, optimize_rules}``; ``index`` ->
    the package index's file names of the project when it was fetched."""

    def __init__(self, folder: Path, home: Path):
        self.src = folder / "src"
        self.home = home
        self.index = json.loads((folder / "index.json").read_text())
        self._described: dict[str, Any] | None = None

    def _run(self, args: list[str], stdin: str = "") -> dict[str, Any]:
        # Config() copies the packaged config.yaml to $HOME/.ktransformers and reads the copy:
        # a HOME of the tests' own, so no copy from another release is read.
        proc = subprocess.run([sys.executable, str(KT_CHECK), str(self.src), *args], input=stdin,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HOME": str(self.home)})
        if proc.returncode != 0:
            raise RuntimeError(f"ktransformers_check.py exited {proc.returncode}\n"
                               f"{proc.stderr[-4000:]}")
        return json.loads(proc.stdout)

    @property
    def version(self) -> str:
        return self.describe()["version"]

    def describe(self) -> dict[str, Any]:
        if self._described is None:
            self._described = self._run(["--describe"])
        return self._described

    def __call__(self, argvs: list[list[str]]) -> list[dict[str, Any]]:
        out = self._run([], json.dumps({"argvs": [[str(a) for a in v] for v in argvs]}))
        assert len(out["results"]) == len(argvs)
        return out["results"]


@pytest.fixture(scope="session")
def kt_legacy_parser(tmp_path_factory) -> KtLegacyParser:
    folder = kt_parser_dir()
    # Always run it: a no-op with a current stamp; a failed fetch FAILS the tests (not a skip).
    proc = subprocess.run(["bash", str(KT_SETUP)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HPCSERVE_KT_PARSER_DIR": str(folder)})
    if proc.returncode != 0:
        pytest.fail(f"scripts/setup-ktransformers-parser.sh failed ({proc.returncode}); the "
                    f"legacy KTransformers parser tests need it.\n{proc.stderr[-4000:]}",
                    pytrace=False)
    return KtLegacyParser(folder, tmp_path_factory.mktemp("kt-home"))
