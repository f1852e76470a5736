"""Records: classes declared as `@dataclass(frozen=True)` ones are, built without dataclasses.

`dataclasses` examines every class it decorates and writes its methods as source text that it
compiles in every process: for hpcserve's ~60 configuration, plan and engine classes that was
over half of what hpcserve adds to `import yaml, jinja2, click` before a render does anything
(docs/performance.md). A record reads the same declaration (annotated fields, defaults,
`field(...)` with its default_factory, compare, hash, repr, init and metadata) once,
and its `__init__`, equality, hash, repr and immutability are written once, below, for every
record.

What a record keeps of frozen=True: assigning to a field after `__init__` or deleting one raises
`FrozenInstanceError`, as does setting an attribute that is not a field; equality compares the
same fields in the same order; equal records hash alike; the repr reads the same. `fields`,
`replace`, `asdict` and `make_record` stand in for the functions of `dataclasses` that take its
classes; `is_record` tells a record class. `@record(frozen=False)` stands for a plain
`@dataclass`: fields assignable, equality as above, no hash.
"""

from __future__ import annotations

import inspect
import sys
from types import MappingProxyType
from typing import Any

__all__ = ["MISSING", "Field", "FrozenInstanceError", "field", "record", "fields", "field_types",
           "replace", "asdict", "is_record", "make_record"]


class _Missing:
    def __repr__(self):
        return "MISSING"


MISSING: Any = _Missing()     # no default given


class FrozenInstanceError(AttributeError):
    """Raised on assigning to or deleting a field of a frozen record (as dataclasses' own)."""


class Field:
    """One field of a record: what `field(...)` says of it, its name and annotation."""

    __slots__ = ("name", "type", "default", "default_factory", "init", "repr", "hash", "compare",
                 "metadata", "owner")

    def __init__(self, default, default_factory, init, repr, hash, compare, metadata):
        self.name, self.type, self.owner = None, None, None   # owner: the declaring class
        self.default, self.default_factory = default, default_factory
        self.init, self.repr, self.hash, self.compare = init, repr, hash, compare
        self.metadata = MappingProxyType(dict(metadata or {}))

    def __repr__(self):
        return f"Field(name={self.name!r}, type={self.type!r}, default={self.default!r})"


def field(*, default=MISSING, default_factory=MISSING, init=True, repr=True, hash=None,
          compare=True, metadata=None) -> Any:
    """A field's default, default factory, place in __init__, repr, hash and equality, and
    metadata, as `dataclasses.field` takes them."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, init, repr, hash, compare, metadata)


def _setattr(self, name, value):
    # __init__ fills __dict__ directly; nothing is set through here after it.
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self, name):
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _init(self, *args, **kwargs):
    cls = type(self)
    spec = cls.__record_init__
    if len(args) > len(spec):
        raise TypeError(f"{cls.__qualname__}() takes {len(spec)} positional arguments but "
                        f"{len(args)} were given")
    d, used = self.__dict__, 0
    for i, (name, default, factory) in enumerate(spec):
        if name in kwargs:
            if i < len(args):
                raise TypeError(f"{cls.__qualname__}() got multiple values for argument {name!r}")
            d[name], used = kwargs[name], used + 1
        elif i < len(args):
            d[name] = args[i]
        elif default is not MISSING:
            d[name] = default
        elif factory is not MISSING:
            d[name] = factory()
        else:
            raise TypeError(f"{cls.__qualname__}() missing required argument {name!r}")
    if used < len(kwargs):
        extra = sorted(set(kwargs) - {s[0] for s in spec})
        raise TypeError(f"{cls.__qualname__}() got an unexpected keyword argument {extra[0]!r}")
    for name, default, factory in cls.__record_derived__:    # init=False fields
        d[name] = default if default is not MISSING else factory()
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


def _values(self, names):
    return tuple(getattr(self, n) for n in names)


def _hash(self):
    return hash(_values(self, type(self).__record_hashed__))


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = type(self).__record_compared__
    return _values(self, names) == _values(other, names)


def _repr(self):
    shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in type(self).__record_shown__)
    return f"{type(self).__qualname__}({shown})"


def _is_classvar(annotation: Any) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def _own_fields(cls: type) -> dict[str, Field]:
    """The fields `cls` itself declares, as dataclasses reads them, its defaults set as class
    attributes (a field without one is not a class attribute)."""
    own = {}
    for name, annotation in inspect.get_annotations(cls).items():
        if _is_classvar(annotation):
            continue
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else field(default=value)
        if f.default is not MISSING and type(f.default).__hash__ is None:
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not "
                             f"allowed: use default_factory")
        f.name, f.type, f.owner = name, annotation, cls
        if f.default is MISSING:
            if name in cls.__dict__:
                delattr(cls, name)
        else:
            setattr(cls, name, f.default)
        own[name] = f
    return own


def record(cls: type | None = None, /, *, frozen: bool = True):
    """`@record` where one would write `@dataclass(frozen=True)`; `@record(frozen=False)` for
    `@dataclass` (fields assignable, unhashable)."""
    if cls is None:
        return lambda c: _build(c, frozen)
    return _build(cls, frozen)


def _build(cls: type, frozen: bool) -> type:
    all_fields: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        all_fields.update(base.__dict__.get("__record_fields__", {}))
    all_fields.update(_own_fields(cls))
    fs = tuple(all_fields.values())
    cls.__record_fields__ = all_fields
    cls.__record_init__ = tuple((f.name, f.default, f.default_factory) for f in fs if f.init)
    cls.__record_derived__ = tuple((f.name, f.default, f.default_factory)
                                   for f in fs if not f.init)
    cls.__record_compared__ = tuple(f.name for f in fs if f.compare)
    cls.__record_hashed__ = tuple(f.name for f in fs if (f.compare if f.hash is None else f.hash))
    cls.__record_shown__ = tuple(f.name for f in fs if f.repr)
    cls.__init__, cls.__eq__, cls.__repr__ = _init, _eq, _repr
    if frozen:
        cls.__setattr__, cls.__delattr__, cls.__hash__ = _setattr, _delattr, _hash
    else:
        cls.__hash__ = None    # as dataclasses leaves a mutable class that compares
    return cls


def make_record(name: str, spec: list[tuple[str, Any, Any]], *, bases: tuple = (),
                module: str = __name__) -> type:
    """A record class made at run time, as `dataclasses.make_dataclass` makes one: `spec` holds
    (name, type, default or field(...)) triples."""
    ns: dict[str, Any] = {"__annotations__": {n: t for n, t, _ in spec}, "__module__": module}
    ns.update((n, d) for n, _, d in spec if d is not MISSING)
    return record(type(name, bases, ns))


def field_types(cls: type) -> dict[str, Any]:
    """Each field's type, its annotation evaluated where it was written, as
    `typing.get_type_hints` gives them: the annotations of one declaring class are evaluated
    together, in one compiled expression, where get_type_hints compiles each on its own (224
    of them for a deployment: half of loading one)."""
    cached = cls.__dict__.get("__record_types__")
    if cached is not None:
        return cached
    out, pending = {}, {}
    for f in fields(cls):
        if isinstance(f.type, str):
            pending.setdefault(f.owner, []).append(f)
        else:
            out[f.name] = type(None) if f.type is None else f.type
    for owner, fs in pending.items():
        scope = sys.modules[owner.__module__].__dict__
        values = eval("(" + "".join(f"{f.type},\n" for f in fs) + ")", scope, dict(vars(owner)))
        out.update((f.name, type(None) if v is None else v) for f, v in zip(fs, values))
    cls.__record_types__ = out = {f.name: out[f.name] for f in fields(cls)}
    return out


def is_record(tp: Any) -> bool:
    return isinstance(tp, type) and "__record_fields__" in tp.__dict__


def fields(rec: Any) -> tuple[Field, ...]:
    """The fields of a record class or instance, in declaration order (bases first)."""
    return tuple(rec.__record_fields__.values())


def replace(obj: Any, **changes: Any) -> Any:
    for f in fields(obj):
        if f.init and f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return type(obj)(**changes)


def asdict(obj: Any) -> Any:
    """A record as plain dicts, lists and tuples, recursively (as `dataclasses.asdict`)."""
    if is_record(type(obj)):
        return {f.name: asdict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return type(obj)(asdict(v) for v in obj)
    if isinstance(obj, dict):
        return {asdict(k): asdict(v) for k, v in obj.items()}
    return obj
