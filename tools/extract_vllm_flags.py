#!/usr/bin/env python3
"""Extract vLLM's ``vllm serve`` flag matrix from released wheels, with vLLM's own parser.

Unlike ``tools/extract_sglang_flags.py`` (static AST reading), this runs the real argument parser
of each release, because vLLM derives most of its flags at import time from its config dataclasses
(``EngineArgs.add_cli_args`` -> ``get_kwargs`` over ``ModelConfig``, ``ParallelConfig``, ...; see
``vllm/engine/arg_utils.py`` in https://github.com/vllm-project/vllm), which no static reading
reproduces faithfully.

For every version in ``VERSIONS``:

1. ``pip download --no-deps --only-binary=:all: vllm==<version>`` into a wheel cache
   (``~/.cache/hpcserve/vllm-wheels``); the wheel's name and sha256 go into the output.
2. A throwaway venv (``<workdir>/venv-<version>``) gets, all with ``--no-deps`` and exact pins,
   a CPU build of torch (``torch==2.13.0``, the ``+cpu`` local wheel; a CUDA torch, triton or
   ``nvidia-*`` wheels are never installed), the vLLM wheel, and the few light dependencies that
   importing the parser needs (``PINS`` below: found by importing until nothing was missing, then
   pinned to versions inside each release's own ``Requires-Dist`` ranges).
3. That venv's python runs this very file with ``--dump-parser`` (stdlib only at top level, so it
   runs in any venv). With ``VLLM_TARGET_DEVICE=cpu`` it builds the parser exactly the way the
   ``vllm`` console script does for ``vllm serve`` (``vllm/entrypoints/cli/main.py``): a
   top-level ``FlexibleArgumentParser``, ``add_subparsers(dest="subparser")``, and
   ``ServeSubcommand.subparser_init`` from ``vllm/entrypoints/cli/serve.py``, which calls
   ``make_arg_parser`` (``vllm.entrypoints.openai.cli_args`` in older releases,
   ``vllm.entrypoints.common.cli_args`` in newer ones) on the ``serve`` subparser. That adds the
   serve-only flags (``--headless``, ``--api-server-count``, ``--config``, ...) and the
   ``FrontendArgs``/``AsyncEngineArgs`` flags. A failing import of the ``serve`` module is an
   error (a dependency to pin), never a silent fallback.

   vLLM looks at ``sys.argv`` while building the parser, so the tool sets it: ``vllm serve
   --help`` while ``vllm.engine.arg_utils`` is imported (vLLM reads its config docstrings into
   help texts only then, ``NEEDS_HELP``; the help texts reveal deprecations), then
   ``vllm serve MODEL`` for the parser that is dumped (0.33.0 registers ``--model`` only outside
   ``--help``), and ``vllm serve --help`` once more for what help shows (``hidden``). Releases
   before about 0.28 find no platform without a GPU or a CPU build of vLLM; the tool then selects
   vLLM's ``CpuPlatform`` (as newer vLLM's CLI does for ``vllm bench``) and says so in ``parser``.

Per version the JSON has:

* ``flags``: every ``--long`` option string the serve parser accepts (its
  ``_option_string_actions``), aliases and ``--no-*`` forms included, also the ones vLLM keeps
  registered but ``vllm serve --help`` does not show (listed again in ``hidden``: 0.33.0's
  ``--no-enable-x``/``--no-disable-x`` spellings, ``--model``); argparse's ``--help`` is not.
* ``short``: single-dash options (``-tp``, ``-O``, ...) -> the long flag of the same action.
* ``deprecated``: long flags whose action vLLM marks deprecated (``deprecated=True`` on
  ``add_argument``, kept in ``FlexibleArgumentParser._deprecated`` on Python < 3.13; a
  ``Deprecated*Action`` class) or whose help text announces the flag deprecated.
* ``choices``: ``--flag`` -> its argparse ``choices`` as CLI strings (``None`` appears where vLLM
  appends it for optional fields: ``optional_type`` turns the string "None" into None).
* ``allow_abbrev``, ``parser`` (how it was built, on which platform), ``wheel``, ``wheel_sha256``.

Per-version wall times go to stderr (they are not in the JSON, to keep it deterministic).

Usage::

    python3 tools/extract_vllm_flags.py          # writes hpcserve/engines/data/vllm_flags.json
    python3 tools/extract_vllm_flags.py --versions 0.33.0 --stdout
    python3 tools/extract_vllm_flags.py --check-argv 0.33.0 -- serve m --num-redundant-experts 8

A reused venv (``--fresh`` rebuilds it) takes about 30 s a release; a fresh one 2-4 minutes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# In the order they are worth extracting; the output is sorted by version.
VERSIONS = [
    "0.33.0", "0.32.0", "0.12.0", "0.10.1.1", "0.10.0", "0.10.2", "0.11.0", "0.13.0",
    "0.15.1", "0.18.1", "0.20.2", "0.22.1", "0.25.1", "0.28.0", "0.30.0", "0.31.0",
]

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "hpcserve" / "engines" / "data" / "vllm_flags.json"
DEFAULT_CACHE = Path(
    os.environ.get("HPCSERVE_VLLM_WHEEL_CACHE", Path.home() / ".cache" / "hpcserve" / "vllm-wheels")
)
DEFAULT_WORKDIR = Path(os.environ.get("HPCSERVE_VLLM_WORKDIR", "/tmp/vflags"))
TORCH = "torch==2.13.0"  # resolves to the +cpu local wheel where one is on pip's find-links

# Packages that must never end up in a venv: GPU runtimes, and torch companions that drag them in.
FORBIDDEN = re.compile(r"^(nvidia-.*|triton|torchvision|torchaudio|torchcodec|pytorch-triton.*)$")

# Light dependencies the parser import needs, pinned. BASE_PINS serve the newest releases;
# PINS[version] overrides or adds entries where an older release needs something else. Found
# per release by importing until nothing was missing, each pin inside the release's own
# Requires-Dist range.
BASE_PINS = {
    "aiohappyeyeballs": "2.7.1", "aiohttp": "3.14.5", "aiosignal": "1.4.0",
    "annotated-doc": "0.0.7", "annotated-types": "0.8.0", "anyio": "4.16.0",
    "apache-tvm-ffi": "0.1.11", "attrs": "26.1.0", "cachetools": "8.0.1", "cbor2": "6.3.0",
    "certifi": "2026.10.18", "click": "8.4.2", "cloudpickle": "3.1.2", "fastapi": "0.136.3",
    "filelock": "4.2.11", "frozenlist": "1.8.0", "h11": "0.16.0", "httpcore2": "2.16.2",
    "httpx2": "2.16.2", "huggingface-hub": "2.4.0", "idna": "3.20", "llguidance": "1.7.6",
    "mpmath": "1.4.1", "msgspec": "0.22.0", "multidict": "7.2.1", "networkx": "3.6.1",
    "numpy": "2.4.6", "openai": "3.54.0", "openai-harmony": "0.0.8", "orjson": "3.13.0",
    "packaging": "26.3", "partial-json-parser": "0.2.1.1.post7", "pillow": "13.0.0",
    "prometheus-client": "0.26.0", "propcache": "0.5.4", "psutil": "7.2.2",
    "py-cpuinfo": "9.0.0", "pybase64": "1.5.1", "pydantic": "2.14.3", "pydantic-core": "2.50.4",
    "pyyaml": "6.0.3", "pyzmq": "27.3.0", "regex": "2026.11.15", "requests": "2.34.2",
    "safetensors": "0.8.0", "sniffio": "1.3.1", "starlette": "1.10.0", "sympy": "1.14.0",
    "tokenizers": "0.23.3", "tqdm": "4.70.1", "transformers": "5.20.2", "truststore": "0.10.5",
    "typing-extensions": "4.16.0", "typing-inspection": "0.4.5", "urllib3": "2.8.0",
    "uvicorn": "0.48.0", "uvloop": "0.23.0", "watchfiles": "1.2.0", "xgrammar": "0.2.8",
    "yarl": "1.25.1",
}
PINS: dict[str, dict[str, str]] = {
    # transformers 4.x up to 0.18 (0.12-0.18 cap it below 5; 0.10/0.11 set no cap but were built
    # against 4.x)
    "0.10.0": {"blake3": "1.0.11", "diskcache": "5.6.3", "distro": "1.9.0", "httpx": "0.28.1",
        "huggingface-hub": "0.36.2", "jinja2": "3.1.6", "llguidance": "0.7.30",
        "markupsafe": "3.0.4", "openai": "1.90.0", "prometheus-fastapi-instrumentator": "8.1.0",
        "python-multipart": "0.0.34", "setproctitle": "1.3.8", "tokenizers": "0.22.2",
        "transformers": "4.57.6", "xgrammar": "0.1.21"},
    "0.10.1.1": {"blake3": "1.0.11", "diskcache": "5.6.3", "huggingface-hub": "0.36.2",
        "jinja2": "3.1.6", "llguidance": "0.7.30", "markupsafe": "3.0.4",
        "prometheus-fastapi-instrumentator": "8.1.0", "python-multipart": "0.0.34",
        "setproctitle": "1.3.8", "tokenizers": "0.22.2", "transformers": "4.57.6",
        "xgrammar": "0.1.21"},
    "0.10.2": {"blake3": "1.0.11", "diskcache": "5.6.3", "huggingface-hub": "0.36.2",
        "jinja2": "3.1.6", "llguidance": "0.7.30", "markupsafe": "3.0.4",
        "prometheus-fastapi-instrumentator": "8.1.0", "python-multipart": "0.0.34",
        "setproctitle": "1.3.8", "tokenizers": "0.22.2", "transformers": "4.57.6",
        "xgrammar": "0.1.23"},
    "0.11.0": {"blake3": "1.0.11", "diskcache": "5.6.3", "huggingface-hub": "0.36.2",
        "jinja2": "3.1.6", "llguidance": "0.7.30", "markupsafe": "3.0.4",
        "prometheus-fastapi-instrumentator": "8.1.0", "python-multipart": "0.0.34",
        "setproctitle": "1.3.8", "tokenizers": "0.22.2", "transformers": "4.57.6",
        "xgrammar": "0.1.25"},
    "0.12.0": {"blake3": "1.0.11", "diskcache": "5.6.3", "gguf": "0.19.0",
        "huggingface-hub": "0.36.2", "interegular": "0.3.3", "jinja2": "3.1.6",
        "jmespath": "1.1.0", "llguidance": "1.3.0", "lm-format-enforcer": "0.11.3",
        "markupsafe": "3.0.4", "model-hosting-container-standards": "0.1.16",
        "prometheus-fastapi-instrumentator": "8.1.0", "python-multipart": "0.0.34",
        "tokenizers": "0.22.2", "transformers": "4.57.6", "xgrammar": "0.1.27"},
    "0.13.0": {"blake3": "1.0.11", "diskcache": "5.6.3", "gguf": "0.19.0",
        "huggingface-hub": "0.36.2", "ijson": "3.6.0", "interegular": "0.3.3",
        "jinja2": "3.1.6", "jmespath": "1.1.0", "llguidance": "1.3.0",
        "lm-format-enforcer": "0.11.3", "markupsafe": "3.0.4",
        "model-hosting-container-standards": "0.1.16", "python-multipart": "0.0.34",
        "tokenizers": "0.22.2", "transformers": "4.57.6", "xgrammar": "0.1.27"},
    "0.15.1": {"diskcache": "5.6.3", "gguf": "0.19.0", "huggingface-hub": "0.36.2",
        "ijson": "3.6.0", "interegular": "0.3.3", "jinja2": "3.1.6", "jmespath": "1.1.0",
        "jsonschema": "4.26.0", "jsonschema-specifications": "2025.9.1", "llguidance": "1.3.0",
        "lm-format-enforcer": "0.11.3", "markupsafe": "3.0.4", "mistral-common": "1.13.1",
        "model-hosting-container-standards": "0.1.16", "pycountry": "26.2.16",
        "pydantic-extra-types": "2.11.1", "referencing": "0.37.0", "rpds-py": "2026.9.1",
        "tiktoken": "0.14.0", "tokenizers": "0.22.2", "transformers": "4.57.6",
        "xgrammar": "0.1.29"},
    "0.18.1": {"diskcache": "5.6.3", "distro": "1.9.0", "gguf": "0.19.0", "httpx": "0.28.1",
        "huggingface-hub": "0.36.2", "jinja2": "3.1.6", "jmespath": "1.1.0",
        "llguidance": "1.3.0", "markupsafe": "3.0.4",
        "model-hosting-container-standards": "0.1.16", "openai": "2.24.0",
        "tokenizers": "0.22.2", "transformers": "4.57.6"},
    # 0.20-0.25 pin apache-tvm-ffi==0.1.9, which xgrammar >= 0.2.6 no longer loads with
    "0.20.2": {"apache-tvm-ffi": "0.1.9", "gguf": "0.19.0", "jmespath": "1.1.0",
        "llguidance": "1.3.0", "model-hosting-container-standards": "0.1.16",
        "xgrammar": "0.2.4"},
    "0.22.1": {"apache-tvm-ffi": "0.1.9", "gguf": "0.19.0", "ijson": "3.6.0",
        "jmespath": "1.1.0", "jsonschema": "4.26.0", "jsonschema-specifications": "2025.9.1",
        "mistral-common": "1.13.1", "model-hosting-container-standards": "0.1.16",
        "pycountry": "26.2.16", "pydantic-extra-types": "2.11.1", "referencing": "0.37.0",
        "rpds-py": "2026.9.1", "tiktoken": "0.14.0", "xgrammar": "0.2.4"},
    "0.25.1": {"apache-tvm-ffi": "0.1.9", "jmespath": "1.1.0",
        "model-hosting-container-standards": "0.1.16", "xgrammar": "0.2.4"},
    "0.28.0": {"jmespath": "1.1.0", "model-hosting-container-standards": "0.1.16"},
    "0.30.0": {"jmespath": "1.1.0", "model-hosting-container-standards": "0.1.16"},
    "0.31.0": {"httpcore": "1.0.9", "httpx": "0.28.1", "huggingface-hub": "1.33.0",
        "transformers": "5.17.0", "xgrammar": "0.2.7"},
    "0.32.0": {"transformers": "5.19.0"},
}

# ---------------------------------------------------------------------------------------------
# Inside the venv: build the parser and describe it (stdlib + vLLM only)
# ---------------------------------------------------------------------------------------------

# "Deprecated" opening the text, a paragraph or a sentence; "(deprecated" / "[DEPRECATED]".
_DEPRECATED_LEAD = re.compile(
    r"(?:^|\n\s*\n|[.!]\s+)\W*(?:note:\s*)?deprecated\b|[(\[]deprecated\b", re.I)


def announces_deprecated(help_text: str, names) -> bool:
    """Whether a help text announces ITS flag deprecated (same rule as the SGLang tool).

    Yes: "Deprecated. Use ...", "...\n\nDeprecated: ...", "[DEPRECATED] ...", "--x is deprecated
    ...", "This flag is deprecated". No: "Whether to allow deprecated quantization methods",
    "Enable deprecated Prometheus metrics ...".
    """
    if _DEPRECATED_LEAD.search(help_text):
        return True
    low = help_text.lower()
    if re.search(r"\bthis (?:flag|option|argument) is deprecated", low):
        return True
    return any(f"{n.lower()} is deprecated" in low for n in names)


def _flexible_parser_class():
    try:  # vllm >= 0.11: utils became a package with argparse_utils
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    return FlexibleArgumentParser


def _serve_parser(subparsers):
    """The ``serve`` subparser as ``vllm serve`` builds it, and a word on how it was built.

    Only a release without ``vllm/entrypoints/cli/serve.py`` falls back to calling
    ``make_arg_parser`` itself; any other import failure is an error (a missing dependency to pin),
    so that what is dumped is always what ``vllm serve`` parses with.
    """
    try:
        from vllm.entrypoints.cli import serve
    except ModuleNotFoundError as exc:
        if exc.name != "vllm.entrypoints.cli.serve":
            raise
    else:
        cmd = next(c for c in serve.cmd_init() if c.name == "serve")
        how = "vllm.entrypoints.cli.serve.ServeSubcommand.subparser_init"
        return cmd.subparser_init(subparsers), how
    for mod in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            make_arg_parser = __import__(mod, fromlist=["make_arg_parser"]).make_arg_parser
        except (ImportError, AttributeError):
            continue
        return make_arg_parser(subparsers.add_parser("serve")), f"{mod}.make_arg_parser"
    raise SystemExit("no vllm.entrypoints.cli.serve and no make_arg_parser")


def _ensure_platform() -> str:
    """The platform vLLM resolved; the CPU one where it found none.

    Older releases choose the CPU platform only for a CPU build of vLLM (a version with "cpu" in
    it), so with the regular wheel and no GPU the config defaults that make_arg_parser reads
    (DeviceConfig) fail with "Failed to infer device type". vLLM's own CLI does the same for
    `vllm bench` in newer releases (vllm/entrypoints/cli/main.py). The option strings come from
    the config dataclasses; a GPU platform would change defaults, which are not dumped.
    """
    from vllm import platforms
    from vllm.platforms.interface import UnspecifiedPlatform

    if isinstance(platforms.current_platform, UnspecifiedPlatform):
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()
        return "CpuPlatform (set by this tool: none detected)"
    return type(platforms.current_platform).__name__


# argv as `vllm serve MODEL` and `vllm serve --help` see it: some releases register flags only
# outside --help (0.33.0: --model, which serve moves to the positional model_tag).
RUN_ARGV = ["vllm", "serve", "MODEL"]
HELP_ARGV = ["vllm", "serve", "--help"]


def build_cli(argv=RUN_ARGV):
    """(top-level parser, serve subparser, how), as vllm/entrypoints/cli/main.py builds them
    when started with ``argv``; "how" also names the vLLM platform in use."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    saved = sys.argv
    try:
        # vLLM reads its config docstrings into help texts only when '--help' is on the command
        # line as vllm.engine.arg_utils is imported (NEEDS_HELP): import it so, to see
        # deprecation notes, then build the parser with the argv asked for.
        sys.argv = HELP_ARGV
        import vllm.engine.arg_utils  # noqa: F401
        platform = _ensure_platform()
        sys.argv = list(argv)
        fap = _flexible_parser_class()
        top = fap(description="vLLM CLI")
        subparsers = top.add_subparsers(required=False, dest="subparser")
        serve_parser, how = _serve_parser(subparsers)
    finally:
        sys.argv = saved
    return top, serve_parser, f"{how}; platform {platform}"


def _is_deprecated(parser, action) -> bool:
    if getattr(action, "deprecated", False) or action in getattr(parser, "_deprecated", ()):
        return True
    if "Deprecated" in type(action).__name__:
        return True
    return announces_deprecated(action.help or "", action.option_strings)


def describe(parser, help_parser) -> dict:
    """Option strings, short forms, deprecations and choices of the serve parser; ``hidden``: the
    long ones that ``vllm serve --help`` (``help_parser``) does not show."""
    accepted: dict[int, list[str]] = {}
    for opt, action in parser._option_string_actions.items():
        accepted.setdefault(id(action), []).append(opt)
    flags, deprecated, short, choices = set(), set(), {}, {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue  # argparse's own --help; the positional model_tag
        names = accepted.get(id(action), [])
        longs = [n for n in names if n.startswith("--")]
        flags.update(longs)
        visible_longs = [n for n in action.option_strings if n.startswith("--")] or longs
        for n in names:
            if not n.startswith("--"):
                short[n] = visible_longs[0] if visible_longs else None
        if _is_deprecated(parser, action):
            deprecated.update(longs)
        if action.choices is not None and visible_longs:
            choices[visible_longs[0]] = sorted({str(c) for c in action.choices})
    shown = {n for a in help_parser._actions for n in a.option_strings}
    hidden = flags - shown
    return {
        "flags": sorted(flags),
        "hidden": sorted(hidden),
        "short": dict(sorted(short.items())),
        "deprecated": sorted(deprecated),
        "choices": dict(sorted(choices.items())),
        "allow_abbrev": parser.allow_abbrev,
    }


def dump_parser() -> dict:
    import importlib.metadata

    top, serve_parser, how = build_cli(RUN_ARGV)
    out = describe(serve_parser, build_cli(HELP_ARGV)[1])
    out["parser"] = how
    out["vllm_version"] = importlib.metadata.version("vllm")
    out["torch_version"] = importlib.metadata.version("torch")
    return out


class ArgvRejected(Exception):
    pass


def check_argv(argv: list[str]) -> dict:
    """Parse ``argv`` (``serve MODEL ...``) as the ``vllm`` command would; report a rejection.

    FlexibleArgumentParser.parse_args first rewrites argv (underscores, dotted JSON keys, -O<n>,
    --config), then argparse rejects what no action takes ("unrecognized arguments: ...").
    """
    top, serve_parser, _ = build_cli()

    def error(message):  # instead of printing usage and exiting 2
        raise ArgvRejected(message)

    top.error = serve_parser.error = error
    try:
        top.parse_args(argv)
    except ArgvRejected as exc:
        return {"accepted": False, "error": str(exc)}
    return {"accepted": True, "error": None}


# ---------------------------------------------------------------------------------------------
# Outside: wheels, venvs, output
# ---------------------------------------------------------------------------------------------


def version_key(v: str):
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.]|post", v) if x != "")


def _run(cmd, **kw):
    print("+", " ".join(map(str, cmd)), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def _cached_wheel(dist: str, version: str, cache: Path) -> Path | None:
    stem = dist.replace("-", "_")
    found = sorted(p for p in cache.glob(f"{stem}-{version}-*.whl") if "x86_64" in p.name)
    return found[0] if found else None


def wheel_for(version: str, cache: Path, dist: str = "vllm") -> Path:
    """The x86_64 wheel of ``dist==version``, downloaded into ``cache`` once."""
    cache.mkdir(parents=True, exist_ok=True)
    found = _cached_wheel(dist, version, cache)
    if found is None:
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
              f"{dist}=={version}", "-d", str(cache)], stdout=subprocess.DEVNULL)
        found = _cached_wheel(dist, version, cache)
    if found is None:
        raise SystemExit(f"no x86_64 wheel for {dist}=={version} in {cache}")
    return found


def pins_for(version: str) -> list[str]:
    pins = {**BASE_PINS, **PINS.get(version, {})}
    return [f"{name}=={ver}" for name, ver in sorted(pins.items())]


def make_venv(version: str, wheel: Path, workdir: Path, fresh: bool) -> Path:
    """A venv with CPU torch, the vLLM wheel and the pinned light deps; all --no-deps."""
    venv = workdir / f"venv-{version}"
    py = venv / "bin" / "python"
    if fresh and venv.exists():
        shutil.rmtree(venv)
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(venv)])
        _run([py, "-m", "pip", "install", "-q", "--no-deps", TORCH])
    pip = [py, "-m", "pip", "install", "-q", "--no-deps"]
    _run(pip + ["--force-reinstall", str(wheel)])  # also swaps the release in a reused venv
    _run(pip + pins_for(version))
    _check_no_gpu_wheels(py)
    return py


def _check_no_gpu_wheels(py: Path) -> None:
    out = subprocess.run([py, "-m", "pip", "list", "--format=json"], check=True,
                         capture_output=True, text=True).stdout
    names = {d["name"].lower() for d in json.loads(out)}
    bad = sorted(n for n in names if FORBIDDEN.match(n))
    if bad:  # never run with a GPU stack; --no-deps should have kept it out
        _run([py, "-m", "pip", "uninstall", "-y", *bad])


def run_in_venv(py: Path, *args: str) -> dict:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([py, str(Path(__file__).resolve()), *args], check=True,
                         capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def extract(version: str, args) -> dict:
    wheel = wheel_for(version, args.cache)
    py = make_venv(version, wheel, args.workdir, args.fresh)
    res = run_in_venv(py, "--dump-parser")
    if res["vllm_version"] != version:
        raise SystemExit(f"venv has vllm {res['vllm_version']}, wanted {version}")
    entry = {k: res[k] for k in ("flags", "hidden", "short", "deprecated", "choices",
                                 "allow_abbrev", "parser")}
    entry["wheel"] = wheel.name
    entry["wheel_sha256"] = _sha256(wheel)
    return entry


def dumps(doc: dict) -> str:
    """JSON with one line per key of a version (choices: one line per flag); deterministic."""

    def one(v):
        return json.dumps(v, sort_keys=True, ensure_ascii=False)

    lines = ["{"]
    lines += [f"  {one(k)}: {one(doc[k])}," for k in doc if k != "versions"]
    lines.append('  "versions": {')
    vers = sorted(doc["versions"], key=version_key)
    for i, v in enumerate(vers):
        entry = doc["versions"][v]
        lines.append(f"    {one(v)}: {{")
        keys = sorted(entry)
        for j, k in enumerate(keys):
            comma = "," if j < len(keys) - 1 else ""
            if k == "choices":
                lines.append('      "choices": {')
                ck = sorted(entry[k])
                lines += [f"        {one(c)}: {one(entry[k][c])}{',' if n < len(ck) - 1 else ''}"
                          for n, c in enumerate(ck)]
                lines.append("      }" + comma)
            else:
                lines.append(f"      {one(k)}: {one(entry[k])}{comma}")
        lines.append("    }" + ("," if i < len(vers) - 1 else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


NOTES = (
    "Extracted by running each release's own `vllm serve` argument parser "
    "(vllm/entrypoints/cli/serve.py ServeSubcommand.subparser_init, which applies make_arg_parser "
    "to a FlexibleArgumentParser subparser) in a venv with the vLLM wheel, a CPU torch and light "
    "deps, VLLM_TARGET_DEVICE=cpu, argv as for `vllm serve MODEL`. "
    "flags = every long option string the serve parser accepts (aliases, --no-* forms and the "
    "spellings `vllm serve --help` does not show, listed in `hidden`, included; argparse's --help "
    "excluded); short = single-dash option -> long flag; deprecated = flags vLLM marks deprecated "
    "(deprecated=True, a Deprecated*Action) or whose help text announces them deprecated; "
    "choices as CLI strings. Not listed, being rewritings of these flags: unique prefixes "
    "(argparse allow_abbrev, true in every release), underscores for dashes, dotted JSON keys "
    "(--x.key value) and -O forms, which FlexibleArgumentParser rewrites before argparse sees "
    "them. -O is the short option of --compilation-config up to 0.11 (-O3, -O.key); from 0.12 "
    "-O<n> is rewritten to --optimization-level and -cc is --compilation-config's short option."
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", nargs="+", default=VERSIONS)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                    help="wheel cache (default: %(default)s)")
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                    help="venvs go here (default: %(default)s)")
    ap.add_argument("--fresh", action="store_true", help="rebuild each venv from scratch")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--stdout", action="store_true", help="print the JSON instead of writing --out")
    ap.add_argument("--merge", action="store_true",
                    help="keep the versions already in --out that this run does not extract")
    ap.add_argument("--check-argv", metavar="VERSION",
                    help="parse the argv after '--' with VERSION's real parser (needs its venv)")
    ap.add_argument("--dump-parser", action="store_true", help=argparse.SUPPRESS)  # in a venv
    ap.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.dump_parser:
        print(json.dumps(dump_parser()))
        return 0
    if args.check_argv:
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        if args.in_venv:
            print(json.dumps(check_argv(rest)))
            return 0
        py = args.workdir / f"venv-{args.check_argv}" / "bin" / "python"
        res = run_in_venv(py, "--check-argv", args.check_argv, "--in-venv", "--", *rest)
        print(json.dumps(res))
        return 0 if res["accepted"] else 1

    doc = {"generated_by": "tools/extract_vllm_flags.py", "notes": NOTES, "versions": {}}
    if args.merge and args.out.exists():
        doc["versions"] = json.loads(args.out.read_text())["versions"]
    for v in args.versions:
        t0 = time.monotonic()
        entry = extract(v, args)
        doc["versions"][v] = entry
        print(f"vllm {v}: {len(entry['flags'])} flags, {len(entry['short'])} short, "
              f"{len(entry['deprecated'])} deprecated, {len(entry['choices'])} with choices; "
              f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
    text = dumps(doc)
    if args.stdout:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out} ({len(text)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
