"""Weight staging's pure parts: model.stage and the site's stage fields refused with file and line,
the plan's staged path, the manifest, the per-model lock and the cache's size bound (least
recently used out, never one in use). The staging itself, on 4 nodes: tests/jobs/test_stage.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcserve.author import config, plan
from hpcserve.errors import ConfigError
from hpcserve.runtime import stage_cache as sc
from unitkit import write_yaml

SITE = "name: s\nslurm: {partition: p}\npaths:\n  stage_dir: /local/stage\n  stage_max_gb: 10\n"


def dep(tmp_path, site: str = SITE, stage: str = "true"):
    (tmp_path / "site.yaml").write_text(site)
    f = tmp_path / "d.yaml"
    f.write_text("name: t\nsite: site.yaml\nmodel:\n  profile: tiny-llama\n  path: /m/tiny\n"
                 f"  stage: {stage}\nengine: {{name: vllm, version: 0.32.0}}\n"
                 "roles:\n  worker: {nodes: 1}\n")
    return f


def test_the_engines_get_the_staged_path_and_plan_json_says_where_from(tmp_path):
    p = plan.build(dataclasses.replace(config.load(dep(tmp_path)), user="alice"))
    assert p.stage["source"] == "/m/tiny" and p.stage["max_bytes"] == 10 * 10 ** 9
    # in the user's own part of the site's stage directory
    assert p.stage["dir"] == "/local/stage/alice"
    assert p.stage["path"].startswith("/local/stage/alice/tiny-") and p.model_path == "/m/tiny"
    argv = p.instances[0].argv
    assert p.stage["path"] in argv and "/m/tiny" not in argv
    off = plan.build(config.load(dep(tmp_path, stage="false")))
    assert off.stage is None and "/m/tiny" in off.instances[0].argv


@pytest.mark.parametrize("site,stage,where,words", [
    (SITE.replace("  stage_dir: /local/stage\n", ""), "true", ("d.yaml", 6, "model.stage"),
     "declares no node-local directory"),
    (SITE.replace("/local/stage", "local/stage"), "true", ("site.yaml", 4, "paths.stage_dir"),
     "an absolute path"),
    (SITE.replace("  stage_max_gb: 10\n", ""), "true", ("site.yaml", 4, "paths.stage_dir"),
     "needs stage_max_gb"),
    (SITE.replace("10", "0"), "true", ("site.yaml", 5, "paths.stage_max_gb"), "at least"),
    (SITE, "yes please", ("d.yaml", 6, "model.stage"), "expected true or false"),
])
def test_bad_stage_settings_name_file_line_and_field(tmp_path, site, stage, where, words):
    with pytest.raises(ConfigError) as e:
        plan.build(config.load(dep(tmp_path, site, stage)))
    got = (os.path.basename(e.value.file), e.value.line, e.value.field)
    assert got == where and words in e.value.message, str(e.value)


def _model(d, files: dict):
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


def test_the_manifest_is_kept_beside_the_model_or_in_the_cache_and_refuses_changes(tmp_path):
    m = _model(tmp_path / "m", {"a.bin": b"x" * 10, "sub/b.json": b"{}", ".hidden": b"-"})
    man = sc.compute_manifest(str(m))
    assert [f[:2] for f in man["files"]] == [["a.bin", 10], ["sub/b.json", 2]]
    assert sc.save_manifest(man, str(m), str(tmp_path / "c"), "n") == str(m / sc.MANIFEST)
    assert sc.load_manifest(str(m), str(tmp_path / "c"), "n") == man
    # a model directory the job cannot write (here: not a directory): the stage cache keeps it
    (tmp_path / "c").mkdir()
    got = sc.save_manifest(man, str(m / "a.bin"), str(tmp_path / "c"), "n")
    assert got == str(tmp_path / "c" / "n.manifest.json")
    assert sc.load_manifest(str(tmp_path / "nowhere"), str(tmp_path / "c"), "n") == man
    with pytest.raises(sc.StageError) as e:
        sc.check_listing([["a.bin", 11], ["sub/b.json", 2]], man, "the model")
    assert e.value.file == "a.bin" and "11 bytes" in e.value.cause
    with pytest.raises(sc.StageError) as e:
        sc.check_listing([["a.bin", 10], ["new", 1], ["sub/b.json", 2]], man, "the model")
    assert e.value.file == "new" and "not in its manifest" in e.value.cause


_HOLD = """import sys, time
from hpcserve.runtime.stage_cache import Cache
f = Cache(sys.argv[1], 10).try_lock("m")
print("held" if f else "busy", flush=True)
sys.stdin.readline()
"""


def test_the_lock_lets_one_process_stage_a_model_on_a_node_at_a_time(tmp_path, monkeypatch):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        cache = sc.Cache(str(tmp_path), 10)
        assert cache.try_lock("m") is None and cache.try_lock("other") is not None
        with pytest.raises(sc.StageError) as e:
            cache.lock("m", time.time() + 0.2)
        assert "another job held" in e.value.cause and "until this job's deadline" in e.value.cause
        # a deadline days away (a job's time limit) is not waited for: LOCK_WAIT_S at most
        monkeypatch.setattr(sc, "LOCK_WAIT_S", 0.3)
        t0 = time.time()
        with pytest.raises(sc.StageError) as e:
            cache.lock("m", time.time() + 3 * 86400)
        assert time.time() - t0 < 60 and "for 0.3 s (the most a job waits" in e.value.cause
    finally:
        holder.communicate("\n", timeout=10)
    assert sc.Cache(str(tmp_path), 10).try_lock("m") is not None  # free once it exits


def _staged(cache, name: str, size: int, used_at: float):
    part = tmp = os.path.join(cache.dir, name + ".partial-1")
    os.makedirs(part)
    with open(os.path.join(tmp, "w.bin"), "wb") as f:
        f.write(b"z" * size)
    man = {"version": 1, "source": "/m/" + name, "files": [["w.bin", size, "-"]]}
    cache.install(name, part, man)
    os.utime(cache.path(name, ".done"), (used_at, used_at))
    return man


def test_the_cache_keeps_to_its_bound_least_recently_used_first_never_one_in_use(tmp_path):
    cache = sc.Cache(str(tmp_path), 100)
    now = time.time()
    _staged(cache, "old", 40, now - 300)
    _staged(cache, "busy", 40, now - 400)   # the oldest, but a running job uses it
    man = _staged(cache, "new", 10, now - 100)
    cache.add_user("busy", "77", now + 3600)
    cache.add_user("old", "76", now - 1)     # that job's allocation has ended
    assert cache.warm("new", man) and not cache.warm("gone", None)
    os.rename(cache.path("new"), cache.path("new-moved"))  # a copy no longer whole is not warm
    assert not cache.warm("new", man)
    os.rename(cache.path("new-moved"), cache.path("new"))
    assert cache.make_room("next", 45) == ["old"]
    assert not os.path.exists(cache.path("old")) and cache.warm("busy", None)
    with pytest.raises(sc.StageError) as e:
        cache.make_room("next", 70)         # 40 in use + 70 > 100, even with "new" gone
    assert "in use by running jobs" in e.value.cause and not os.path.exists(cache.path("new"))
    with pytest.raises(sc.StageError) as e:
        cache.make_room("huge", 101)
    assert "larger than the stage cache's bound" in e.value.cause
    assert json.loads(open(cache.path("busy", ".done")).read())["bytes"] == 40


def test_a_marker_naming_the_cache_or_its_parent_is_never_a_model_to_remove(tmp_path):
    """Anyone who can write the stage dir could plant `..done` (the name ".") or `...done`
    ("..") claiming a large model: making room must not remove the cache, nor its parent."""
    parent = tmp_path / "site"
    cache = sc.Cache(str(parent / "stage"), 100)
    os.makedirs(cache.dir)
    (parent / "other-users-file").write_text("kept")
    now = time.time()
    _staged(cache, "old", 40, now - 300)
    for planted in ("..done", "...done"):
        (Path(cache.dir) / planted).write_text(json.dumps({"bytes": 90}))
        os.utime(Path(cache.dir) / planted, (now - 900, now - 900))  # the least recently used
    assert [m[2] for m in cache.models()] == ["old"]
    assert cache.make_room("next", 70) == ["old"]
    assert (parent / "other-users-file").read_text() == "kept" and os.path.isdir(cache.dir)
    for name in (".", "..", "a/b"):
        with pytest.raises(sc.StageError, match="no model's name"):
            cache.remove(name)


def test_a_copy_is_on_disk_before_it_is_renamed_into_place_and_marked_complete(
        tmp_path, monkeypatch):
    """The order that makes a marker trustworthy after a crash: every file and directory of
    the copy fsynced, then the rename, the cache directory fsynced, then the marker (itself
    fsynced before its rename). Recorded by wrapping os.fsync/os.rename/os.replace."""
    from hpcserve.runtime import stage_link
    cache = sc.Cache(str(tmp_path / "stage"), 1 << 30)
    os.makedirs(cache.dir)
    partial = cache.path("m-0123456789", ".partial-1")
    os.makedirs(partial)
    events: list[tuple] = []
    real = {n: getattr(os, n) for n in ("fsync", "rename", "replace")}

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real["fsync"](fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for n in ("rename", "replace"):
        monkeypatch.setattr(os, n, lambda a, b, _n=n: (events.append((_n, str(b))),
                                                       real[_n](a, b))[1])
    for rel in ("a.bin", "sub/b.bin"):
        with stage_link._out(partial, rel) as w:
            w.write(b"x")
    cache.install("m-0123456789", partial, {"version": 1, "source": "/m", "files": [
        ["a.bin", 1, None], ["sub/b.bin", 1, None]]})
    monkeypatch.undo()
    final = cache.path("m-0123456789")
    at: dict = {}
    for i, e in enumerate(events):
        at.setdefault(e, i)  # where each first happened
    moved = at[("rename", final)]
    for f in ("a.bin", "sub/b.bin"):
        assert at[("fsync", os.path.join(partial, f))] < moved, events
    assert at[("replace", os.path.join(partial, sc.MANIFEST))] < moved, events
    for d in (partial, os.path.join(partial, "sub")):
        assert at[("fsync", d)] < moved, events
    marker = cache.path("m-0123456789", ".done")
    assert moved < at[("fsync", cache.dir)] < at[("replace", marker)], events
    assert events[-2:] == [("replace", marker), ("fsync", cache.dir)], events
    assert cache.warm("m-0123456789", None)
