"""The legacy KTransformers server's facts (hpcserve/engines/facts.py KTRANSFORMERS_LEGACY),
proved in the modules of its 0.2.1.post1 sdist: the path hpcserve asks has a route, answers a
fixed list (it proves the HTTP process serves, nothing of generation), and the server has no
health route and no metrics endpoint of its own."""

from __future__ import annotations

import ast

import pytest

from hpcserve.engines import facts, get

pytestmark = pytest.mark.engine_parser

F = facts.KTRANSFORMERS_LEGACY
CHAT = "server/api/openai/endpoints/chat.py"


def test_the_release_read_is_the_one_the_facts_name(kt_legacy):
    assert kt_legacy.version == F["release"]
    assert get("ktransformers_legacy").facts is F


def test_the_liveness_path_answers_a_fixed_list_from_the_http_process(kt_legacy):
    (path, fact), = F["health"].items()
    assert path == F["liveness_path"] == get("ktransformers_legacy").liveness()[0]
    fn = kt_legacy.function(CHAT, "list_models")
    routes = [ast.unparse(d) for d in fn.decorator_list]
    assert f"router.get('{path.removeprefix('/v1')}', tags=['openai'])" in routes, routes
    # it returns the module's constant list: no request reaches the model
    (ret,) = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
    assert isinstance(ret.value, ast.Name) and ret.value.id == "models"
    assert any(isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "models"
               for n in kt_legacy.tree(CHAT).body)
    assert fact["proves"] == "process"


def test_the_server_has_no_health_route_and_no_metrics(kt_legacy):
    routes = [ast.unparse(d) for rel in kt_legacy.files_with("router.")
              for f in kt_legacy.functions(rel).values()
              for d in getattr(f, "decorator_list", [])]
    assert routes and not any("health" in r or "metrics" in r for r in routes), routes
    assert F["metrics"] == {} and get("ktransformers_legacy").metrics is None
