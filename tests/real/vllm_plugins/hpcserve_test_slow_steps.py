"""A vLLM general plugin for the real-engine tests: while the engine core holds requests, each
of its steps takes HPCSERVE_TEST_STEP_S seconds more (a sleep after vLLM 0.32.0's own
`EngineCore.step`, vllm/v1/engine/core.py), so that one long answer streams for minutes on a
tiny model, as a 1T-parameter model's long reasoning trace does on real GPUs. The engine moves
its counters once per step as always (vllm/v1/metrics/loggers.py): it is slow, never still.

It is loaded only where a deployment puts this folder on PYTHONPATH and names it in
VLLM_PLUGINS; without HPCSERVE_TEST_STEP_S it changes nothing. It says once per process that
it is in force, so a test can see it was."""

from __future__ import annotations

import os
import sys
import time


def register() -> None:
    delay = float(os.environ.get("HPCSERVE_TEST_STEP_S", "0") or 0)
    if delay <= 0:
        return
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore, "_hpcserve_slow_steps", False):
        return  # vLLM loads general plugins once per process, but may import twice
    step = EngineCore.step

    def slow_step(self):
        out = step(self)
        if self.scheduler.has_requests():
            time.sleep(delay)
        return out

    EngineCore.step = slow_step
    EngineCore._hpcserve_slow_steps = True
    print(f"hpcserve_test_slow_steps: each engine step takes {delay:g} s more",
          file=sys.stderr, flush=True)
