"""Shell words that mix literal text with variables known only inside the task.

Node ranks, node addresses and IB devices are found on the node at run time, so an argv such as
`--dist-init-addr 10.0.0.5:5757` is planned as the word (Var("LEADER_IP"), ":5757"). Rendering
quotes literal parts with shlex.quote and variables as "${NAME}", so no config value is ever
interpreted by the shell.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Var:
    name: str
    unset_ok: bool = False  # empty where the variable is not set (under `set -u` too)
    # its value is a secret ({from_env: NAME}): as a program's argument it never goes on the
    # command line, which every user of the node sees (render.py: secret_argv)
    secret: bool = False


Part = Union[str, Var]
Word = Union[str, tuple]  # a literal, or a tuple of parts


def quote(word: Word) -> str:
    if isinstance(word, str):
        return shlex.quote(word)
    out = []
    for p in word:
        out.append(f'"${{{p.name}{":-" if p.unset_ok else ""}}}"' if isinstance(p, Var) else shlex.quote(p) if p else "")
    return "".join(out) or "''"


def quote_all(words: list[Word]) -> str:
    return " ".join(quote(w) for w in words)


def show(word: Word, values: dict[str, str] | None = None) -> str:
    """A word for humans (`hpcserve plan`): variables as $NAME or their known value."""
    if isinstance(word, str):
        return word
    vals = values or {}
    return "".join(vals.get(p.name, f"${p.name}") if isinstance(p, Var) else p for p in word)


def argv_lines(cmd: list[Word], argv: tuple[Word, ...]) -> list[str]:
    """One line per option with its values, so a person reads the command as in the docs."""
    lines = [" ".join(quote(w) for w in cmd)]
    cur: list[str] = []
    for w in argv:
        if isinstance(w, str) and w.startswith("--") and cur:
            lines.append(" ".join(cur))
            cur = []
        cur.append(quote(w))
    if cur:
        lines.append(" ".join(cur))
    return lines
