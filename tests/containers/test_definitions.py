"""containers/ holds an Apptainer definition for every engine adapter hpcserve has
(containers/<engine.name, _ as ->.def), labelled with its engine and release, built from the
image and release the examples pin for that engine, its %post and %test in POSIX shell."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from hpcserve import engines

ROOT = Path(__file__).resolve().parents[2]
DEFS = ROOT / "containers"
# Their instances span nodes: the image must carry the InfiniBand userspace NCCL, UCX and NIXL
# load (the KTransformers adapters refuse more than one node).
MULTI_NODE = ("sglang", "vllm", "trtllm")


def definition(engine: str) -> Path:
    return DEFS / f"{engine.replace('_', '-')}.def"


def parse(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(header keywords, %labels, the other sections' bodies by name)."""
    head, _, rest = path.read_text().partition("\n%")
    header = dict(ln.split(": ", 1) for ln in head.splitlines() if ln and not ln.startswith("#"))
    sections = {}
    for s in ("%" + rest).split("\n%"):
        name, _, body = s.lstrip("%").partition("\n")
        sections[name.strip()] = body
    labels = dict(ln.split(None, 1) for ln in sections.pop("labels", "").splitlines() if ln.strip())
    return header, labels, sections


def pinned_examples() -> list[tuple[str, dict]]:
    """(example, its engine section) of every example that names an image."""
    out = []
    for p in sorted((ROOT / "examples").glob("*.yaml")):
        engine = yaml.safe_load(p.read_text()).get("engine") or {}
        if engine.get("image"):
            out.append((p.stem, engine))
    return out


@pytest.mark.parametrize("engine", engines.names())
def test_every_engine_adapter_has_an_apptainer_definition(engine):
    path = definition(engine)
    assert path.is_file(), f"no Apptainer definition for engine {engine}: {path}"
    header, labels, sections = parse(path)
    assert header["Bootstrap"] == "docker" and header["From"], header
    assert labels["org.hpcserve.engine"] == engine
    assert labels["org.hpcserve.engine-version"] in header["From"]
    assert "test" in sections
    # apptainer runs %post and %test with /bin/sh: they must be POSIX shell
    for name in ("post", "test"):
        if name in sections:
            r = subprocess.run(["sh", "-n"], input=sections[name], capture_output=True, text=True)
            assert r.returncode == 0, (name, r.stderr)
    if engine in MULTI_NODE:
        test = sections["test"]
        assert "libibverbs.so.1" in test and "libmlx5.so.1" in test and "/dev/infiniband" in test


def test_every_definition_is_for_an_engine_adapter():
    named = {definition(e).name for e in engines.names()}
    assert {p.name for p in DEFS.glob("*.def")} == named


@pytest.mark.parametrize("example,engine", pinned_examples(), ids=[e for e, _ in pinned_examples()])
def test_definitions_build_the_images_the_examples_pin(example, engine):
    header, labels, _ = parse(definition(engine["name"]))
    image = engine["image"]
    if image.startswith("/") and labels["org.hpcserve.engine-version"] != engine["version"]:
        # an image the site built of an older release than the definition's (the legacy
        # server's 0.2.1.post1, the one PyPI has, whose own parser checks the example): its
        # file name says which release it holds
        assert f"-{engine['version']}." in image, (example, image)
        return
    assert labels["org.hpcserve.engine-version"] == engine["version"], example
    if not image.startswith("/"):  # a registry name, enroot's `#` before the path
        assert header["From"] == image.replace("#", "/", 1), example


def test_the_sglang_definition_is_the_upstream_image_unchanged():
    header, _, sections = parse(definition("sglang"))
    assert header == {"Bootstrap": "docker", "From": "lmsysorg/sglang:v0.5.23"}
    assert "post" not in sections
