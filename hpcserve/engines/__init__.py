"""The engine adapters hpcserve knows, by `engine.name`; the rest of hpcserve asks here."""

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
