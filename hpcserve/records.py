"""Frozen records: dataclasses as immutable as `@dataclass(frozen=True)`, for less start-up time.

`dataclasses` writes each class's methods as source text and compiles them in every process
(Python 3.10-3.12 compile every method on its own). A frozen class gets six: `__init__`,
`__repr__`, `__eq__`, `__hash__`, `__setattr__`, `__delattr__`; for hpcserve's ~60
configuration, plan and engine classes that was some 40 ms of every command, more than half of
what hpcserve adds to `import yaml, jinja2, click` (docs/performance.md). Here only `__init__` is
generated per class; the other five are written once, below, and serve every class.

What stays as with frozen=True: assigning to a field after `__init__` or deleting one raises
`dataclasses.FrozenInstanceError`, so does setting an attribute that is not a field; equality
compares the same fields in the same order, equal records hash alike (over the fields that
compare, as frozen=True hashes them), and the repr reads the same.
"""

from __future__ import annotations

import dataclasses


def _setattr(self, name, value):
    # __init__ sets each field once; after that a field is in __dict__ and stays as it is.
    if name in self.__dict__ or name not in type(self).__dataclass_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _delattr(self, name):
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


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


def seal(cls: type) -> type:
    """A dataclass made immutable, comparable and hashable as frozen=True would make it."""
    fields = dataclasses.fields(cls)
    cls.__record_compared__ = tuple(f.name for f in fields if f.compare)
    cls.__record_hashed__ = tuple(f.name for f in fields
                                  if (f.compare if f.hash is None else f.hash))
    cls.__record_shown__ = tuple(f.name for f in fields if f.repr)
    cls.__setattr__, cls.__delattr__ = _setattr, _delattr
    cls.__eq__, cls.__hash__, cls.__repr__ = _eq, _hash, _repr
    return cls


def record(cls: type | None = None, /, **kw):
    """`@record` where one would write `@dataclass(frozen=True)` (other keyword arguments as
    dataclass's)."""
    def wrap(c: type) -> type:
        return seal(dataclasses.dataclass(c, repr=False, eq=False, **kw))
    return wrap if cls is None else wrap(cls)
