"""The runtime reads plan.json through one typed view (runtime/spec.py): its classes declare
exactly the keys plan_json.py's schema has, every rendered plan.json reads into it whole, and no
other runtime module spells a plan.json key as a dict key."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from hpcserve.author import plan_json
from hpcserve.runtime import spec
from unitkit import EXAMPLES, ROOT, render

RUNTIME = ROOT / "hpcserve" / "runtime"


def _objects(schema: dict) -> list[dict]:
    """The object schemas a value's schema admits (an anyOf's, null aside)."""
    if "anyOf" in schema:
        return [o for s in schema["anyOf"] for o in _objects(s)]
    return [schema] if schema.get("type") == "object" else []


def _admits_null(schema: dict) -> bool:
    return any(s.get("type") == "null" or "null" in (s.get("type") or [])
               for s in schema.get("anyOf", [schema]))


def _mismatches(schema: dict, ann: str, where: str, absent_ok: bool = False) -> list[str]:
    """Where the annotation `ann` does not read what `schema` admits (`absent_ok`: the key is
    missing from some of the object's alternatives, which the view reads as None)."""
    ann = ann.strip()
    nullable = ann.endswith("| None")
    ann = ann[:-len("| None")].strip() if nullable else ann
    admits = _admits_null(schema) or absent_ok
    out = [f"{where}: None {'' if nullable else 'not '}declared, the schema "
           f"{'admits' if admits else 'refuses'} it"] if nullable != admits else []
    objs = _objects(schema)
    if ann.startswith("list["):
        return out + _mismatches(schema.get("items", {}), ann[5:-1], where + "[]")
    if ann.startswith("dict[str, "):
        inner = schema.get("additionalProperties") or next(
            (o.get("additionalProperties") for o in objs if "additionalProperties" in o), {})
        return out + _mismatches(inner, ann[10:-1], where + "{}")
    if ann in spec._VIEWS:
        if not objs:
            return out + [f"{where}: {ann} for a value that is no object"]
        return out + _class_mismatches(spec._VIEWS[ann], objs, where)
    if any("properties" in o for o in objs):
        return out + [f"{where}: an object with keys read as {ann}, not as a view"]
    return out


def _class_mismatches(cls, alternatives: list[dict], where: str) -> list[str]:
    """A view class against the object schemas it reads (one, or an anyOf's alternatives: a key
    in only some of them must be declared nullable)."""
    props: dict = {}
    for o in alternatives:
        for k, v in o.get("properties", {}).items():
            props.setdefault(k, v)
    keys = {key: ann for _, key, ann in _declared(cls)}
    out = [f"{where}: {cls.__name__} lacks {k!r}" for k in props if k not in keys]
    out += [f"{where}: {cls.__name__} declares {k!r}, which the schema has not"
            for k in keys if k not in props]
    for k, ann in keys.items():
        if k in props:
            some = not all(k in o.get("properties", {}) for o in alternatives)
            out += _mismatches(props[k], ann, f"{where}.{k}", absent_ok=some)
    return out


def _declared(cls) -> list[tuple[str, str, str]]:
    """(attribute, key, annotation) of each field a view class declares."""
    return [(attr, key, cls.__annotations__[attr]) for attr, key, _, _ in cls._compile()]


def test_the_view_declares_exactly_the_schemas_keys_and_shapes():
    assert not _class_mismatches(spec.Spec, [plan_json.SCHEMA], "plan.json")


def test_the_comparison_sees_a_missing_an_extra_and_a_wrongly_nullable_key():
    class Probe(spec.View):
        path: str
        extra: int | None
    schema = {"type": "object", "properties": {"path": {"type": ["string", "null"]},
                                               "gone": {"type": "integer"}}}
    got = _class_mismatches(Probe, [schema], "x")
    assert "x: Probe lacks 'gone'" in got
    assert "x: Probe declares 'extra', which the schema has not" in got
    assert "x.path: None not declared, the schema admits it" in got
    del spec._VIEWS["Probe"]


def _read_all(view, where: str, seen: list) -> None:
    """Every declared attribute of `view` and of the views in it, read."""
    for attr, key, _ in _declared(type(view)):
        value = getattr(view, attr)  # AttributeError: the key is missing
        seen.append(f"{where}.{key}")
        for v in (value if isinstance(value, list) else
                  value.values() if isinstance(value, dict) else [value]):
            if isinstance(v, spec.View):
                _read_all(v, f"{where}.{key}", seen)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_rendered_plan_json_reads_whole_into_the_view(example):
    raw = json.loads(render(example, "/jobs/x")["plan.json"][0])
    seen: list = []
    plan = spec.Spec(raw)
    _read_all(plan, "plan", seen)
    assert plan.as_json() is raw and len(seen) > 100
    assert [i.name for i in plan.instances] == [i["name"] for i in raw["instances"]]
    assert plan.readiness.engine_timeout == raw["readiness"]["engine_timeout"]
    assert (plan.container.import_ and plan.container.import_.uri) == \
        (raw["container"]["import"] and raw["container"]["import"]["uri"])


def test_an_absent_key_reads_none_where_null_is_admitted_and_fails_naming_it_elsewhere():
    plan = spec.Spec({"name": "x", "instances": [{"name": "decode-0"}]})
    assert plan.router is None and plan.attach is None and plan.instances[0].metrics is None
    with pytest.raises(AttributeError, match="readiness"):
        _ = plan.readiness
    with pytest.raises(TypeError, match="expected a JSON object"):
        spec.Spec({"readiness": 5})


def _dict_reads_of_plan(tree: ast.AST) -> list[str]:
    """`...plan...["key"]` and `...plan....get("key")`: a string key read from an expression
    that goes through a name `plan` (job.plan, self.plan, plan.readiness ...)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) \
                and isinstance(n.slice.value, str):
            base = n.value
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr == "get" and n.args and isinstance(n.args[0], ast.Constant):
            base = n.func.value
        else:
            continue
        if "plan" in re.split(r"[^A-Za-z0-9_]+", ast.unparse(base)):
            out.append(f"line {n.lineno}: {ast.unparse(n)}")
    return out


def _without_the_version_check(tree: ast.Module) -> ast.Module:
    """contract.load_spec reads the raw JSON's spec and spec_version: the check that decides
    whether the view can read it at all."""
    tree.body = [n for n in tree.body if getattr(n, "name", None) != "load_spec"]
    return tree


def test_no_runtime_module_but_the_view_reads_plan_json_as_a_dict():
    found = {p.name: hits for p in sorted(RUNTIME.glob("*.py")) if p.name != "spec.py"
             if (hits := _dict_reads_of_plan(_without_the_version_check(
                 ast.parse(p.read_text()))))}
    assert not found, found


def test_the_dict_read_finder_sees_each_spelling():
    src = ('a = job.plan["readiness"]\nb = self.job.plan.get("attach")\nc = plan["x"]\n'
           'd = state["phase"]\ne = job.plan.readiness.engine_timeout\n'
           'f = job.plan.readiness["path"]\ng = plans["x"]\n')
    assert [h.split(": ", 1)[1] for h in _dict_reads_of_plan(ast.parse(src))] == [
        "job.plan['readiness']", "self.job.plan.get('attach')", "plan['x']",
        "job.plan.readiness['path']"]


def test_the_view_module_stays_runnable_on_the_nodes_python():
    """No typing or dataclasses import (the runtime is stdlib-only and starts on 3.7): the
    annotations stay strings that View reads itself."""
    tree = ast.parse((RUNTIME / "spec.py").read_text())
    imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imports |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imports & {"typing", "dataclasses"}, imports
    assert any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body)
    assert not hasattr(spec.View, "__getitem__") and not hasattr(spec.View, "get")
