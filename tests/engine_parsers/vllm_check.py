"""Run vLLM's REAL `vllm serve` argument parser over command lines (the vLLM parser venv only).

    echo '{"argvs": [["serve", "/m", "--tensor-parallel-size", "8"]]}' | \\
        .venv-engines-vllm/bin/python vllm_check.py

The parser is built the way `vllm serve` builds it (vllm/entrypoints/cli/main.py): a
FlexibleArgumentParser whose `serve` subcommand is ServeSubcommand.subparser_init's, so the
positional model, `--headless`, the DP flags and vLLM's own argument rewriting all apply.
`--list-flags` prints the serve subcommand's long options instead; `--serve` answers one request
per line of stdin from one import of vLLM (checkserve.py).
Each argv starts with "serve". Prints {"vllm_version", "results": [{ok, error, values}]}; values
are the parsed namespace entries of KEYS (kv_transfer_config and eplb_config as plain dicts).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

KEYS = ["model_tag", "served_model_name", "host", "port", "tensor_parallel_size",
        "pipeline_parallel_size", "data_parallel_size", "data_parallel_size_local",
        "data_parallel_address", "data_parallel_rpc_port", "data_parallel_start_rank",
        "headless", "nnodes", "node_rank", "master_addr", "master_port",
        "distributed_executor_backend", "enable_expert_parallel", "enable_eplb", "eplb_config",
        "decode_context_parallel_size", "kv_transfer_config", "kv_cache_dtype", "max_model_len",
        "enable_auto_tool_choice", "tool_call_parser", "reasoning_parser", "trust_remote_code",
        "safetensors_load_strategy",
        "all2all_backend"]


def parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older releases
        from vllm.utils import FlexibleArgumentParser
    top = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser", required=True))
    return top


def plain(v):
    if hasattr(v, "model_dump"):
        return {k: plain(x) for k, x in v.model_dump().items()}
    if hasattr(v, "__dataclass_fields__"):
        return {k: plain(getattr(v, k)) for k in v.__dataclass_fields__}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)


def parse(p, argv: list[str]) -> dict:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = p.parse_args(argv)
    except SystemExit:
        msg = err.getvalue().strip().splitlines()
        return {"ok": False, "error": msg[-1] if msg else "exit"}
    return {"ok": True, "values": {k: plain(getattr(ns, k)) for k in KEYS if hasattr(ns, k)}}


def serve_flags(p) -> list[str]:
    """Every long option of the `serve` subcommand (argparse's --help aside)."""
    sub = next(a for a in p._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    serve = sub.choices["serve"]
    return sorted(o for o in serve._option_string_actions if o.startswith("--") and o != "--help")


def answer(args: list[str], stdin: str | None) -> dict:
    import vllm
    p = parser()  # a fresh one per request (~0.1 s), as each one-shot run had
    if args == ["--list-flags"]:
        return {"vllm_version": vllm.__version__, "flags": serve_flags(p)}
    return {"vllm_version": vllm.__version__,
            "results": [parse(p, a) for a in json.loads(stdin)["argvs"]]}


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        from checkserve import serve
        return serve(answer)
    args = sys.argv[1:]
    json.dump(answer(args, None if args == ["--list-flags"] else sys.stdin.read()), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
