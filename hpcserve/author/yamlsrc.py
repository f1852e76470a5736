"""YAML loading that remembers where every value came from.

PyYAML's composer already knows each node's line; we keep that in a side table keyed by the
value's path (a tuple of keys and list indexes), so validation errors can say file:line.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, echo, escape, shorten

try:  # the C composer is several times faster on large files
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - libyaml missing
    from yaml import SafeLoader as _Loader

# C0 controls and DEL: a newline in a value would end an #SBATCH directive and run the rest as
# shell, and no legitimate config string needs the others.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")

Path_ = tuple  # a value's path: keys (str) and list indexes (int)


@dataclass(frozen=True)
class Origin:
    file: str
    line: int | None = None


@dataclass
class Positions:
    """Where each value of a loaded document came from."""

    table: dict[tuple, Origin] = field(default_factory=dict)

    def lookup(self, path: tuple) -> Origin | None:
        """The origin of `path`, or of its nearest ancestor that has one."""
        for n in range(len(path), -1, -1):
            o = self.table.get(tuple(path[:n]))
            if o is not None:
                return o
        return None

    def update_under(self, prefix: tuple, other: "Positions") -> None:
        for p, o in other.table.items():
            self.table[prefix + p] = o


def format_path(path: tuple) -> str:
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + shorten(escape(str(p)))
    return out or "<document>"


def check_string(value: str, path: tuple, origin: Origin | None, what: str = "string") -> None:
    m = CONTROL_CHARS.search(value)
    if m:
        raise ConfigError(
            f"control character {m.group()!r} is not allowed in a config {what}, got "
            f"{echo(value)} (it could end an #SBATCH line or a shell word)",
            file=origin.file if origin else None, line=origin.line if origin else None,
            field=format_path(path))


_SCALARS = yaml.constructor.SafeConstructor()
# A config is small: more values than this (YAML aliases expanding into each other, the "billion
# laughs") or deeper nesting is refused before it costs time or memory.
MAX_VALUES = 100_000
MAX_DEPTH = 32
MAX_BYTES = 1 << 20


def _construct(node: yaml.Node, path: tuple, pos: Positions, fname: str,
               line: int | None = None, budget: list | None = None) -> Any:
    budget = [MAX_VALUES] if budget is None else budget
    budget[0] -= 1
    # A mapping value is reported at its key's line: that is where a person looks for it.
    origin = Origin(fname, line or node.start_mark.line + 1)
    if budget[0] < 0:
        raise ConfigError(f"the document expands to more than {MAX_VALUES:,} values (YAML "
                          "aliases?); a deployment is far smaller", file=fname,
                          line=origin.line, field=format_path(path))
    if len(path) > MAX_DEPTH:
        raise ConfigError(f"nested deeper than {MAX_DEPTH} levels", file=fname,
                          line=origin.line, field=format_path(path[:3]) + "...")
    pos.table[path] = origin
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for knode, vnode in node.value:
            if not isinstance(knode, yaml.ScalarNode):
                raise ConfigError("mapping keys must be plain scalars", file=fname,
                                  line=knode.start_mark.line + 1, field=format_path(path))
            key = knode.value
            if knode.tag == "tag:yaml.org,2002:merge" or key == "<<":
                raise ConfigError("YAML merge keys (<<) are not supported; write the values out",
                                  file=fname, line=knode.start_mark.line + 1,
                                  field=format_path(path))
            if key in out:
                raise ConfigError(f"duplicate key {echo(key)}", file=fname,
                                  line=knode.start_mark.line + 1, field=format_path(path + (key,)))
            check_string(key, path + (key,), Origin(fname, knode.start_mark.line + 1), "key")
            out[key] = _construct(vnode, path + (key,), pos, fname, knode.start_mark.line + 1,
                                  budget)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(v, path + (i,), pos, fname, None, budget)
                for i, v in enumerate(node.value)]
    try:
        value = _SCALARS.construct_object(node, deep=True)
    except yaml.YAMLError as e:
        raise ConfigError(f"bad value: {getattr(e, 'problem', e)}", file=fname,
                          line=origin.line, field=format_path(path)) from None
    if isinstance(value, str):
        check_string(value, path, origin)
    return value


def _reader_error(e: yaml.reader.ReaderError, text: str, fname: str) -> ConfigError:
    """A character YAML refuses, at its line and column (PyYAML gives an offset: in bytes of
    the UTF-8 text from libyaml, in characters from the pure-Python reader)."""
    before = text.encode("utf-8")[:e.position].decode("utf-8", "replace") \
        if _Loader is not yaml.SafeLoader else text[:e.position]
    line = before.count("\n") + 1
    column = len(before) - (before.rfind("\n") + 1) + 1
    char = chr(e.character) if isinstance(e.character, int) else e.character
    return ConfigError(f"not valid YAML: character {char!r} at column {column}: {e.reason}",
                       file=fname, line=line)


def load_text(text: str, fname: str) -> tuple[Any, Positions]:
    pos = Positions()
    try:
        node = yaml.compose(text, Loader=_Loader)
    except RecursionError:
        raise ConfigError(f"nested deeper than {MAX_DEPTH} levels", file=fname) from None
    except UnicodeEncodeError as e:  # a lone surrogate: only from a command line's bytes
        raise ConfigError(f"not UTF-8 text ({e.reason})", file=fname) from None
    except yaml.reader.ReaderError as e:
        raise _reader_error(e, text, fname) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"not valid YAML: {problem}", file=fname,
                          line=mark.line + 1 if mark else None) from None
    if node is None:
        return {}, pos
    return _construct(node, (), pos, fname), pos


def load_file(path: str | Path) -> tuple[Any, Positions]:
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block, a device never end
            raise ConfigError("not a regular file", file=str(path))
        if st.st_size > MAX_BYTES:
            raise ConfigError(f"larger than {MAX_BYTES >> 20} MiB: not a config file",
                              file=str(path))
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text ({e.reason})", file=str(path)) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", file=str(path)) from None
    return load_text(text, str(path))
