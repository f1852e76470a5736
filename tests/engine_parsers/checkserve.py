"""The `--serve` mode of the check scripts (sglang_check.py, vllm_check.py): one process, one
import of the engine, many requests. Importing an engine is the cost of a check (vLLM: ~15 s
of a core; SGLang: ~5 s), parsing an argv ~1 ms, so a test session starts each engine's parser
once instead of once per test.

Each request is one JSON line on stdin, ``{"args": [...], "stdin": "..."}``: the command-line
arguments and the standard input the script would have been given as a one-shot run. Each
answer is one JSON line on the process's original stdout: what the one-shot run prints, or
``{"__error__": traceback}`` where it would have failed. Anything else the engine prints (on
import, while parsing) goes to stderr, so the answers' channel carries nothing but answers.
The process exits when stdin closes (the test session ends, or dies)."""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, Callable, NoReturn


def serve(answer: Callable[[list[str], str | None], Any]) -> NoReturn:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a print to fd 1, from Python or C, lands in stderr
    sys.stdout = sys.stderr
    for line in sys.stdin:
        req = json.loads(line)
        try:
            res = answer(req["args"], req.get("stdin"))
        except BaseException:  # noqa: BLE001 - SystemExit too: the caller gets the reason
            res = {"__error__": traceback.format_exc()}
        out.write(json.dumps(res, sort_keys=True) + "\n")
        out.flush()
    # Done: skip the interpreter's teardown (vLLM's takes ~8 s); nothing is left to write.
    sys.stderr.flush()
    os._exit(0)
