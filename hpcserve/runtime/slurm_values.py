"""Slurm's values in its outputs read: durations ('D-HH:MM:SS'), timestamps, and the field
cleaners ('(null)', 'None', '4-4') every parser of slurm_queue.py and slurm_scontrol.py uses.

Apart because all of those parsers share them and `parse_duration` is read on its own (the
runtime's time left). Standard library only and nothing of hpcserve: it ships in the job
directory with the runtime.

Slurm prints times in the cluster's local time without a zone; the text parsers read them in this
process's time zone (right for a local runner; over SSH set TZ to the cluster's).
"""

from __future__ import annotations

import re
import time
from typing import Any


__all__ = ["parse_duration", "parse_timestamp"]

# --------------------------------------------------------------------------------------------
# Values

_NULLISH = {"", "(null)", "N/A", "NONE", "None", "Unknown", "UNKNOWN", "n/a", "none"}
_UNLIMITED = {"UNLIMITED", "INFINITE", "Infinity", "NOT_SET", "INVALID"}
_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+(?:\.\d+)?))?$")
_TIMESTAMP_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M")


def parse_duration(text: str | None) -> int | None:
    """Slurm's durations in seconds: 'M:SS', 'H:MM:SS', 'D-HH:MM:SS', 'D-HH', 'D-HH:MM', 'MM'.

    None for 'UNLIMITED', 'INFINITE', 'NOT_SET', 'N/A' and anything unreadable.
    """
    if text is None:
        return None
    s = text.strip()
    if not s or s in _NULLISH or s in _UNLIMITED:
        return None
    m = _DURATION.match(s)
    if not m:
        return None
    days, a, b, c = m.groups()
    a_i = int(a)
    if days is not None:  # D-H, D-H:M, D-H:M:S
        h, mi, se = a_i, int(b or 0), float(c or 0)
        return int(int(days) * 86400 + h * 3600 + mi * 60 + se)
    if c is not None:  # H:M:S
        return int(a_i * 3600 + int(b) * 60 + float(c))
    if b is not None:  # M:S
        return a_i * 60 + int(b)
    return a_i * 60  # a bare number is minutes (sbatch --time convention)


def parse_timestamp(text: str | None) -> int | None:
    """'2026-11-22T04:07:35' (cluster local time) -> epoch seconds; None for N/A, Unknown, NONE..."""
    if text is None:
        return None
    s = text.strip()
    if not s or s in _NULLISH:
        return None
    for fmt in _TIMESTAMP_FORMATS:
        try:
            return int(time.mktime(time.strptime(s, fmt)))
        except (ValueError, OverflowError):
            continue
    return None


def _int(text: Any) -> int | None:
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text
    if isinstance(text, float):
        return int(text)
    if isinstance(text, str):
        m = re.match(r"^\s*(\d+)", text)  # '4', '4-4' (scontrol NumNodes range)
        return int(m.group(1)) if m else None
    return None


def _clean(text: Any) -> str:
    """A string field: '(null)' and None become ''."""
    if text is None or isinstance(text, (dict, list, bool)):
        return ""
    s = str(text).strip()
    return "" if s == "(null)" else s


def _reason(text: Any) -> str:
    s = _clean(text)
    return "" if s in ("None", "none") else s
