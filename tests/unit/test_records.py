"""hpcserve's records are as immutable and hashable as `@dataclass(frozen=True)` classes, which
they replace to save start-up time (hpcserve/records.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import field

import pytest

from hpcserve.records import record, seal


@record
class Point:
    x: int
    y: int = 0
    where: str = field(default="", compare=False)   # like config's positions: not compared
    tags: list = field(default_factory=list, hash=False)


def test_fields_are_set_by_init_and_never_after():
    p = Point(1, 2)
    assert (p.x, p.y, p.where, p.tags) == (1, 2, "", [])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.y
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.other = 1                      # not a field: refused as frozen=True refuses it
    assert p.x == 1 and not hasattr(p, "other")


def test_equal_records_hash_alike_over_the_compared_fields_as_frozen_ones_do():
    @dataclasses.dataclass(frozen=True)
    class Frozen:
        x: int
        y: int = 0
        where: str = field(default="", compare=False)
        tags: list = field(default_factory=list, hash=False)

    a, b = Point(1, 2, "a.yaml:3"), Point(1, 2, "b.yaml:9")
    assert a == b and hash(a) == hash(b) == hash(Frozen(1, 2, "x")) == hash((1, 2))
    assert a != Point(1, 3) and {a, b, Point(1, 3)} == {a, Point(1, 3)}


def test_replace_and_make_dataclass_keep_working():
    p = dataclasses.replace(Point(1, 2), y=7)
    assert (p.x, p.y) == (1, 7)
    Made = seal(dataclasses.make_dataclass("Made", [("a", int, 5)], bases=(Point,)))
    m = Made(1, a=3)
    assert (m.x, m.a) == (1, 3) and hash(m) == hash((1, 0, 3)) and m == Made(1, a=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.a = 4


def test_the_configuration_and_plan_are_records():
    from hpcserve import config, plan
    from unitkit import ROOT
    c = config.load(ROOT / "examples" / "demo.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "other"
    p = plan.build(c)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.instances[0].nodes = 99


def test_repr_and_equality_read_as_the_dataclass_ones():
    @dataclasses.dataclass(frozen=True)
    class Point:  # noqa: F811 - the same name, so that the reprs compare whole
        x: int
        y: int = 0
        where: str = field(default="", compare=False)
        tags: list = field(default_factory=list, hash=False)

    ours_text, theirs_text = repr(globals()["Point"](1, 2, "w", [3])), repr(Point(1, 2, "w", [3]))
    assert ours_text == "Point(x=1, y=2, where='w', tags=[3])"
    assert theirs_text.endswith("." + ours_text)   # a class of this function's: its qualname
    ours = globals()["Point"]
    assert ours(1, 2, "a") == ours(1, 2, "b") and ours(1, 2) != ours(2, 2)
    assert ours(1) != Point(1)      # another class: not equal, as dataclasses have it
    assert ours(1).__eq__(Point(1)) is NotImplemented
