"""hpcserve's records behave as the `@dataclass(frozen=True)` classes they replace to save
start-up time (hpcserve/records.py): each check runs the same declaration through both."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from hpcserve import records
from hpcserve.records import FrozenInstanceError, field, make_record, record


@record
class Point:
    x: int
    y: int = 0
    where: str = field(default="", compare=False)   # like config's positions: not compared
    tags: list = field(default_factory=list, hash=False)


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: int
    y: int = 0
    where: str = dataclasses.field(default="", compare=False)
    tags: list = dataclasses.field(default_factory=list, hash=False)


def test_fields_are_set_by_init_and_never_after():
    p = Point(1, 2)
    assert (p.x, p.y, p.where, p.tags) == (1, 2, "", [])
    assert Point(1).tags is not Point(1).tags          # a fresh list from the factory each time
    with pytest.raises(FrozenInstanceError):
        p.x = 5
    with pytest.raises(FrozenInstanceError):
        del p.y
    with pytest.raises(FrozenInstanceError):
        p.other = 1                      # not a field: refused as frozen=True refuses it
    assert p.x == 1 and not hasattr(p, "other")


@pytest.mark.parametrize("args, kwargs", [
    ((), {}),                            # x is required
    ((1, 2, "", [], 5), {}),             # one positional too many
    ((1,), {"x": 2}),                    # x twice
    ((1,), {"z": 2}),                    # no such field
])
def test_wrong_arguments_are_refused_as_dataclasses_refuse_them(args, kwargs):
    with pytest.raises(TypeError) as theirs:
        Frozen(*args, **kwargs)
    with pytest.raises(TypeError) as ours:
        Point(*args, **kwargs)
    # The same argument named, not necessarily in the same sentence.
    named = [w.strip(":") for w in str(theirs.value).split() if w.startswith("'")]
    assert all(w in str(ours.value) for w in named), (ours.value, theirs.value)


def test_equal_records_hash_alike_over_the_compared_fields_as_frozen_ones_do():
    a, b = Point(1, 2, "a.yaml:3"), Point(1, 2, "b.yaml:9")
    assert a == b and hash(a) == hash(b) == hash(Frozen(1, 2, "x")) == hash((1, 2))
    assert a != Point(1, 3) and {a, b, Point(1, 3)} == {a, Point(1, 3)}


def test_fields_replace_and_asdict_read_as_the_dataclass_functions():
    def described(fs, missing):
        return [(f.name, f.type, f.compare, f.hash, f.default is missing,
                 f.default_factory is missing) for f in fs]
    assert described(records.fields(Point), records.MISSING) == \
        described(dataclasses.fields(Frozen), dataclasses.MISSING)
    p = records.replace(Point(1, 2, "w", [3]), y=7)
    assert (p.x, p.y, p.where, p.tags) == (1, 7, "w", [3])
    assert records.asdict(Point(1, 2, "w", [Point(3)])) == \
        {"x": 1, "y": 2, "where": "w", "tags": [{"x": 3, "y": 0, "where": "", "tags": []}]}
    assert records.is_record(Point) and not records.is_record(Frozen)
    assert pickle.loads(pickle.dumps(Point(1, 2))) == Point(1, 2)


def test_a_made_record_inherits_its_bases_fields_first():
    Made = make_record("Made", [("a", int, 5), ("b", list, field(default_factory=list, hash=False))],
                       bases=(Point,))
    m = Made(1, a=3)
    assert [f.name for f in records.fields(Made)] == ["x", "y", "where", "tags", "a", "b"]
    assert (m.x, m.a, m.b) == (1, 3, []) and hash(m) == hash((1, 0, 3)) and m == Made(1, a=3)
    with pytest.raises(FrozenInstanceError):
        m.a = 4


def test_a_subclass_redeclaring_a_field_keeps_its_place_and_takes_the_new_default():
    @record
    class Moved(Point):
        y: int = 9
        z: int = 1

    assert [f.name for f in records.fields(Moved)] == ["x", "y", "where", "tags", "z"]
    assert Moved(1).y == 9 and Point(1).y == 0


def test_a_mutable_default_is_refused_as_dataclasses_refuse_it():
    with pytest.raises(ValueError, match="default_factory"):
        @record
        class Bad:
            items: list = []      # noqa: RUF012 - the point of the test


def test_the_configuration_and_plan_are_records():
    from hpcserve import config, plan
    from unitkit import ROOT
    c = config.load(ROOT / "examples" / "demo.yaml")
    with pytest.raises(FrozenInstanceError):
        c.name = "other"
    p = plan.build(c)
    with pytest.raises(FrozenInstanceError):
        p.instances[0].nodes = 99


def test_repr_and_equality_read_as_the_dataclass_ones():
    @dataclasses.dataclass(frozen=True)
    class Point:  # noqa: F811 - the same name, so that the reprs compare whole
        x: int
        y: int = 0
        where: str = dataclasses.field(default="", compare=False)
        tags: list = dataclasses.field(default_factory=list, hash=False)

    ours_text, theirs_text = repr(globals()["Point"](1, 2, "w", [3])), repr(Point(1, 2, "w", [3]))
    assert ours_text == "Point(x=1, y=2, where='w', tags=[3])"
    assert theirs_text.endswith("." + ours_text)   # a class of this function's: its qualname
    ours = globals()["Point"]
    assert ours(1, 2, "a") == ours(1, 2, "b") and ours(1, 2) != ours(2, 2)
    assert ours(1) != Point(1)      # another class: not equal, as dataclasses have it
    assert ours(1).__eq__(Point(1)) is NotImplemented


def test_a_mutable_record_is_a_plain_dataclass():
    @record(frozen=False)
    class Draft:
        name: str
        items: list = field(default_factory=list)

    d = Draft("a")
    d.name = "b"
    d.items.append(1)
    assert d == Draft("b", [1]) and repr(d).endswith("Draft(name='b', items=[1])")
    with pytest.raises(TypeError, match="unhashable"):
        hash(d)


def test_field_types_are_the_ones_typing_gives_for_every_record_of_a_render():
    import typing

    from hpcserve import config, engines, plan  # noqa: F401 - their records are walked
    seen, todo = set(), [config.Deployment, config.Site, config.Profile, plan.Plan]
    todo += [config.role_type(n) for n in engines.names()]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        ours = records.field_types(cls)
        assert ours == typing.get_type_hints(cls), cls.__qualname__
        for tp in ours.values():      # the records the fields hold, inside unions, lists, dicts
            stack = [tp]
            while stack:
                t = stack.pop()
                if records.is_record(t):
                    todo.append(t)
                stack.extend(typing.get_args(t))
    assert len(seen) > 40, len(seen)
