"""A small typed-schema engine over dataclasses: validation with file:line errors, and JSON Schema.

Why not pydantic or msgspec: pydantic's import alone costs more than hpcserve's whole render
budget, and msgspec's error paths drop mapping keys (`$.roles[...]`), so an error could not name the
role or the line. This module walks the dataclasses' type hints instead (about 200 lines).
Field metadata: doc, ge, le, pattern, examples.
"""

from __future__ import annotations

import inspect
import math
import re
import types
import typing
from dataclasses import MISSING, Field, fields, is_dataclass
from functools import cache
from typing import Any, Literal, Union

from ..errors import ConfigError, echo, shorten
from .yamlsrc import Positions, format_path

_NoneType = type(None)
Scalar = Union[str, int, float, bool]


def doc(text: str, **meta: Any) -> dict:
    return {"doc": text, **meta}


def fields_of(cls: type) -> dict[str, Field]:
    return {f.name: f for f in fields(cls)}


@cache
def field_types(cls: type) -> dict[str, Any]:
    """Each field's type, its annotation evaluated (`from __future__ import annotations` leaves
    it a string), as `typing.get_type_hints` gives it; once per class."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def class_doc(cls: type) -> str | None:
    """The docstring the class was declared with: None for one declared without, whose
    `__doc__` dataclasses fills with its signature."""
    text = cls.__doc__
    if text and text == cls.__name__ + str(inspect.signature(cls)).replace(" -> None", ""):
        return None
    return text


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def type_name(tp: Any) -> str:
    if tp is _NoneType:
        return "null"
    if _is_union(tp):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if is_dataclass(tp):
        return "a mapping"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false",
            dict: "a mapping", list: "a list"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _got(tp: Any, value: Any) -> str:
    """"got ..." after "expected <tp>": a number where a string belongs is YAML reading an
    unquoted 24.10 as the number 24.1, so say to quote it."""
    got = f"got {_kind(value)}"
    if tp in (str, str | None) and isinstance(value, (int, float)) and not isinstance(value, bool):
        got += " (YAML reads it unquoted as a number: quote it)"
    return got


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return f"the integer {echo(value)}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {echo(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


# Up to this many valid keys are listed after an unknown one; more are counted and pointed to.
LIST_KEYS = 8


def unknown_key(key: str, valid: list[str], schema: str) -> str:
    """An unknown key's message: the close matches and the valid keys, in one short line."""
    import difflib   # here: only an error needs it (1 ms of every command's start)
    near = difflib.get_close_matches(str(key), valid, n=2)
    hint = f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""
    if len(valid) <= LIST_KEYS:
        return f"unknown key {echo(key)}{hint}; valid keys here: {', '.join(valid)}"
    return (f"unknown key {echo(key)}{hint}; {len(valid)} keys are valid here: see "
            f"`hpcserve schema {schema}`")


class Validator:
    def __init__(self, positions: Positions, schema: str = "deployment"):
        """schema: the `hpcserve schema` name of the document validated (for its key lists)."""
        self.pos = positions
        self.schema = schema

    def error(self, path: tuple, message: str) -> ConfigError:
        o = self.pos.lookup(path)
        return ConfigError(message, file=o.file if o else None, line=o.line if o else None,
                           field=format_path(path))

    def convert(self, value: Any, tp: Any, path: tuple, meta: dict | None = None) -> Any:
        meta = meta or {}
        if tp is Any:
            return value
        if _is_union(tp):
            args = typing.get_args(tp)
            if value is None and _NoneType in args:
                return None
            last: ConfigError | None = None
            for a in args:
                if a is _NoneType:
                    continue
                if not self._shape_matches(value, a):
                    continue
                try:
                    return self.convert(value, a, path, meta)
                except ConfigError as e:
                    last = e
            if last is not None:
                raise last
            raise self.error(path, f"expected {type_name(tp)}, {_got(tp, value)}")
        origin = typing.get_origin(tp)
        if origin is Literal:
            choices = typing.get_args(tp)
            if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
                raise self.error(path, f"expected one of {', '.join(map(str, choices))}; "
                                       f"got {_kind(value)}")
            return value
        if origin is list:
            if not isinstance(value, list):
                raise self.error(path, f"expected {type_name(tp)}, got {_kind(value)}")
            (item,) = typing.get_args(tp)
            if len(value) < meta.get("min_items", 0):
                raise self.error(path, f"needs at least {meta['min_items']} item(s), got "
                                       f"{len(value)}")
            # A list field's value constraints (pattern, ge, le) hold for each of its items.
            return [self.convert(v, item, path + (i,), _constraints(meta))
                    for i, v in enumerate(value)]
        if origin is dict:
            if not isinstance(value, dict):
                raise self.error(path, f"expected a mapping, got {_kind(value)}")
            _, vt = typing.get_args(tp)
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise self.error(path, f"keys must be strings, got {_kind(k)}")
                self._check_key_pattern(k, meta, path + (k,))
                out[k] = self.convert(v, vt, path + (k,))
            return out
        if is_dataclass(tp):
            return self.build(tp, value, path)
        return self._scalar(value, tp, path, meta)

    @staticmethod
    def _shape_matches(value: Any, tp: Any) -> bool:
        origin = typing.get_origin(tp)
        if origin is list:
            return isinstance(value, list)
        if origin is dict or is_dataclass(tp):
            return isinstance(value, dict)
        if origin is Literal:
            return not isinstance(value, (dict, list))
        if tp is bool:
            return isinstance(value, bool)
        if tp is int:
            return isinstance(value, int) and not isinstance(value, bool)
        if tp is float:
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if tp is str:
            return isinstance(value, str)
        if tp in (dict, list):
            return isinstance(value, tp)
        return True

    def _check_key_pattern(self, key: str, meta: dict, path: tuple) -> None:
        pat = meta.get("key_pattern")
        if pat and not re.fullmatch(pat, key):
            raise self.error(path, f"key {echo(key)} does not match {pat}")

    def _scalar(self, value: Any, tp: Any, path: tuple, meta: dict) -> Any:
        ok = self._shape_matches(value, tp)
        if not ok:
            raise self.error(path, f"expected {type_name(tp)}, {_got(tp, value)}")
        if tp is float:
            value = float(value)
            if not math.isfinite(value):
                raise self.error(path, f"expected a finite number, got {value}")
        if "ge" in meta and value < meta["ge"]:
            raise self.error(path, f"must be at least {meta['ge']}, got {echo(value)}")
        if "le" in meta and value > meta["le"]:
            raise self.error(path, f"must be at most {meta['le']}, got {echo(value)}")
        if "pattern" in meta and isinstance(value, str) and not re.fullmatch(meta["pattern"], value):
            if "pattern_help" in meta:
                raise self.error(path, f"expected {meta['pattern_help']}, got {echo(value)}")
            raise self.error(path, f"{echo(value)} does not match the pattern {meta['pattern']}")
        return value

    def build(self, cls: type, value: Any, path: tuple) -> Any:
        if not isinstance(value, dict):
            raise self.error(path, f"expected a mapping, got {_kind(value)}")
        fmap = fields_of(cls)
        th = field_types(cls)
        unknown = [k for k in value if k not in fmap]
        if unknown:
            raise self.error(path + (unknown[0],), unknown_key(unknown[0], list(fmap),
                                                                self.schema))
        kwargs = {}
        for name, f in fmap.items():
            required = f.default is MISSING and f.default_factory is MISSING
            if required and name in value and value[name] is None:
                # At the key's own line: `path: null` is written there, not at its parent's.
                raise self.error(path + (name,), "a required key, got null" + _about(f))
            if name in value:
                kwargs[name] = self.convert(value[name], th[name], path + (name,), dict(f.metadata))
            elif required:
                raise self.error(path, f"missing required key {name!r}" + _about(f))
        obj = cls(**kwargs)
        check = getattr(obj, "validate", None)
        if check is not None:
            try:
                check()
            except FieldProblem as p:
                raise self.error(path + tuple(p.subpath), p.message) from None
        return obj


# A required key's doc, shown after "missing required key": cut here (the whole doc is in
# `hpcserve schema`), so that the error stays one readable line.
ABOUT_CHARS = 80


def _about(f: Field) -> str:
    doc = f.metadata.get("doc")
    if not doc:
        return ""
    short = re.split(r" \(|; |: ", doc, maxsplit=1)[0]
    return f" ({short if len(short) <= ABOUT_CHARS else short[:ABOUT_CHARS - 3] + '...'})"


class FieldProblem(Exception):
    """Raised by a dataclass's validate() to point at one of its own fields."""

    def __init__(self, subpath: str | tuple, message: str):
        self.subpath = (subpath,) if isinstance(subpath, str) else subpath
        self.message = message
        super().__init__(message)


# ---------------------------------------------------------------- JSON Schema

def json_schema(root: type, title: str) -> dict:
    defs: dict[str, dict] = {}
    top = _schema_of(root, defs, {})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **top,
            "$defs": defs}


def schema_ref(tp: Any, defs: dict) -> dict:
    """The schema of `tp` (a $ref for a dataclass), adding what it needs to `defs`."""
    return _schema_of(tp, defs, {})


def _schema_of(tp: Any, defs: dict, meta: dict) -> dict:
    out: dict[str, Any] = {}
    if "doc" in meta:
        out["description"] = meta["doc"]
    if tp is Any:
        return out
    if _is_union(tp):
        out["anyOf"] = [_schema_of(a, defs, _constraints(meta)) for a in typing.get_args(tp)]
        return out
    if tp is _NoneType:
        return {**out, "type": "null"}
    origin = typing.get_origin(tp)
    if origin is Literal:
        return {**out, "enum": list(typing.get_args(tp))}
    if origin is list:
        return {**out, "type": "array",
                **({"minItems": meta["min_items"]} if "min_items" in meta else {}),
                "items": _schema_of(typing.get_args(tp)[0], defs, _constraints(meta))}
    if origin is dict:
        s = {**out, "type": "object",
             "additionalProperties": _schema_of(typing.get_args(tp)[1], defs, {})}
        if "key_pattern" in meta:
            s["propertyNames"] = {"pattern": "^" + meta["key_pattern"] + "$"}
        return s
    if is_dataclass(tp):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}  # placeholder against recursion
            props, required = {}, []
            th = field_types(tp)
            for f in fields(tp):
                props[f.name] = _schema_of(th[f.name], defs, dict(f.metadata))
                if f.default is MISSING and f.default_factory is MISSING:
                    required.append(f.name)
                elif f.default is not MISSING and _jsonable(f.default):
                    props[f.name]["default"] = f.default
            d = {"type": "object", "properties": props, "additionalProperties": False}
            described = class_doc(tp)
            if described:
                d["description"] = " ".join(described.split())
            if required:
                d["required"] = required
            defs[name] = d
        return {**out, "$ref": f"#/$defs/{name}"}
    t = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object",
         list: "array"}[tp]
    out["type"] = t
    for k, js in (("ge", "minimum"), ("le", "maximum"), ("pattern", "pattern")):
        if k in meta:
            out[js] = ("^" + meta[k] + "$") if k == "pattern" else meta[k]
    return out


def _constraints(meta: dict) -> dict:
    """The value constraints of a field's metadata, for the items of a list or union members."""
    return {k: v for k, v in meta.items() if k in ("ge", "le", "pattern", "pattern_help")}


def _jsonable(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))
