"""The engine adapters hpcserve knows, by `engine.name`; the rest of hpcserve asks here.

To add an engine: its adapter module here (an EngineAdapter and its RouterAdapter, base.py),
registered below; its flag table in data/ (extracted from the release by tools/); what hpcserve
relies on of its release in facts.py; a strict stand-in in hpcserve/sim/; a recipe in
containers/. Nothing outside this folder and sim/ names an engine (tests/unit/test_seam.py).
"""

from __future__ import annotations

from .base import EngineAdapter
from .ktransformers import ADAPTER as _KT
from .ktransformers import LEGACY_ADAPTER as _KT_LEGACY
from .sglang import ADAPTER as _SGLANG
from .trtllm import ADAPTER as _TRTLLM
from .vllm import ADAPTER as _VLLM

ADAPTERS: dict[str, EngineAdapter] = {a.name: a for a in (_SGLANG, _VLLM, _TRTLLM, _KT, _KT_LEGACY)}
DEFAULT = _SGLANG.name  # engine.name when a deployment names none


def names() -> tuple[str, ...]:
    return tuple(ADAPTERS)


def get(name: str) -> EngineAdapter:
    return ADAPTERS[name]
