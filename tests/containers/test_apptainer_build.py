"""An Apptainer registry image built once into a SIF in the image cache: containers/
apptainer-build.sh against the strict apptainer stand-in (whose build writes a SIF file
progressively, as apptainer does), and the in-job runtime running it once per job from rendered
job directories, a later job reusing the file, two jobs at once building it once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ctkit import ROOT, USER, Fakes, plan_for
from hpcserve.author import render
from hpcserve.runtime import job as jobmod

HELPER = ROOT / "containers" / "apptainer-build.sh"
URI = "docker://lmsysorg/sglang:v0.5.23"
SETS = ["site.container.runtime=apptainer", f"site.container.image={URI}"]


def builds(fakes: Fakes) -> list[dict]:
    return [c for c in fakes.calls("apptainer") if c["argv"][0] == "build" and c["ok"]]


def whole(fakes: Fakes, path: Path) -> bool:
    """The stand-in's own `apptainer exec` accepts the file (it refuses a partial SIF)."""
    return fakes.run(["apptainer", "exec", str(path), "true"]).returncode == 0


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(".tmp-"))


def test_builds_checks_and_moves_into_place_then_reuses(tmp_path: Path, fakes: Fakes) -> None:
    target = tmp_path / "images" / "sglang.sif"
    r = fakes.run(["bash", str(HELPER), URI, str(target)])
    assert r.returncode == 0, r.stderr
    [b] = builds(fakes)
    out = Path(b["target"])  # a new directory beside TARGET, renamed into place
    assert b["uri"] == URI and out.name == target.name and out.parent.parent == target.parent
    assert whole(fakes, target) and leftovers(target.parent) == []
    before = target.stat().st_mtime_ns
    r = fakes.run(["bash", str(HELPER), URI, str(target)])
    assert r.returncode == 0 and "is up to date" in r.stderr
    assert len(builds(fakes)) == 1 and target.stat().st_mtime_ns == before


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_partial_or_corrupt_sif_is_not_used_but_built_again(tmp_path: Path, fakes: Fakes,
                                                               damage: str) -> None:
    target = tmp_path / "sglang.sif"
    assert fakes.run(["bash", str(HELPER), URI, str(target)]).returncode == 0
    data = target.read_bytes()
    target.write_bytes(data[:len(data) // 2] if damage == "truncated" else b"SIF" * 100)
    assert not whole(fakes, target)  # apptainer would not run it
    r = fakes.run(["bash", str(HELPER), URI, str(target)])
    assert r.returncode == 0, r.stderr
    assert "is not a whole image; making it again" in r.stderr
    assert len(builds(fakes)) == 2 and whole(fakes, target)


@pytest.mark.parametrize("mode", ["error", "truncate"])
def test_a_failed_build_leaves_nothing(tmp_path: Path, fakes: Fakes, mode: str) -> None:
    # "error": apptainer fails half-way; "truncate": it exits 0 with a partial file, which only
    # the helper's check of the SIF header against the file's size catches
    target = tmp_path / "sglang.sif"
    r = fakes.run(["bash", str(HELPER), URI, str(target)],
                  env={"HPCSERVE_FAKE_APPTAINER_BUILD_FAIL": mode})
    assert r.returncode != 0
    assert not target.exists() and leftovers(tmp_path) == []
    if mode == "truncate":
        assert "is not whole" in r.stderr


@pytest.mark.parametrize("args, message", [
    ([URI], "usage"),
    ([URI, "/tmp/x.sqsh"], "must end in .sif"),
    (["lmsysorg/sglang:v0.5.23", "/tmp/x.sif"], "must be a registry URI"),
    (["--force", URI, "/tmp/x.sif"], "usage"),
])
def test_bad_usage(fakes: Fakes, args: list[str], message: str) -> None:
    r = fakes.run(["bash", str(HELPER), *args])
    assert r.returncode == 2 and message in r.stderr and builds(fakes) == []


@pytest.mark.parametrize("argv, message", [
    # enroot's registry#image spelling is not a docker reference to apptainer
    (["build", "@/x.sif", "docker://nvcr.io#nvidia/pytorch:24.01-py3"], "invalid reference format"),
    (["build", "@/x.sif", "docker://LMSYSorg/sglang:v0.5.23"], "invalid reference format"),
    (["build", "@/x.sif", "ftp://host/img"], "Unsupported transport type: ftp"),
    (["build", "@/x.sif"], "accepts 2 arg(s), received 1"),
    (["build", "--gpu", "@/x.sif", URI], "unknown flag: --gpu"),
    (["build", "@/missing/x.sif", URI], "could not open"),
    (["pull"], "requires at least 1 arg(s)"),
])
def test_the_stand_in_refuses_what_apptainer_would(tmp_path: Path, fakes: Fakes,
                                                   argv: list[str], message: str) -> None:
    argv = [a.replace("@", str(tmp_path)) for a in argv]
    r = fakes.run(["apptainer", *argv])
    assert r.returncode != 0 and message in r.stderr, r.stderr
    # an existing target needs --force, as the real build says
    (tmp_path / "old.sif").write_bytes(b"x")
    r = fakes.run(["apptainer", "build", str(tmp_path / "old.sif"), URI])
    assert r.returncode == 255 and "will not overwrite" in r.stderr
    assert fakes.run(["apptainer", "pull", "-F", str(tmp_path / "old.sif"), URI]).returncode == 0


# ---------------------------------------------------------------- the in-job runtime, per job

def _job(jobs: Path, name: str) -> jobmod.Job:
    """A rendered job directory under `jobs` (the demo on an Apptainer site with a registry
    image), opened by the runtime as job.sbatch opens it."""
    d = jobs / name
    p = plan_for([*SETS, f"name={name}"])
    render.write_job(render.render_files(p, str(d)), d)
    return jobmod.Job(str(d))


@pytest.fixture
def on_path(fakes: Fakes, monkeypatch):
    """The runtime's helper finds the stand-ins as a batch node finds apptainer."""
    for k, v in fakes.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return fakes


def test_each_job_builds_once_a_later_job_reuses_and_two_at_once_build_once(tmp_path, on_path,
                                                                           monkeypatch):
    fakes = on_path
    jobs = tmp_path / "jobs"
    first = _job(jobs, "first")
    imp = first.plan.container.import_
    sif = Path(imp.sif)
    assert sif.parent == jobs / ".hpcserve-images" / USER and imp.uri == URI
    # the tasks exec that file, not the registry
    task = (jobs / "first" / "launch" / "container-task.sh").read_text()
    assert f"  {sif} \\\n" in task and URI not in task.split("exec apptainer")[1]
    first.discovery.wait_image_import(first.discovery.start_image_import())
    assert len(builds(fakes)) == 1 and whole(fakes, sif)
    assert f"image ready: {sif}" in (jobs / "first" / "logs" / "hpcserve-job.log").read_text()
    # a later job finds it whole and builds nothing
    later = _job(jobs, "later")
    later.discovery.wait_image_import(later.discovery.start_image_import())
    assert len(builds(fakes)) == 1
    assert "is up to date" in (jobs / "later" / "logs" / "import-image.log").read_text()
    # gone (a new image tag, a cleaned cache): two jobs starting at once build it once
    sif.unlink()
    two = [_job(jobs, n) for n in ("a", "b")]
    monkeypatch.setenv("HPCSERVE_FAKE_APPTAINER_BUILD_SECONDS", "1.0")
    procs = [j.discovery.start_image_import() for j in two]
    seen_partial, end = False, time.time() + 60   # each build takes 1 s
    while any(p.poll() is None for p in procs):
        assert time.time() < end, "the two image builds did not end within 60 s"
        # whoever looks meanwhile finds no file or a whole one, never apptainer's partial output
        seen_partial |= sif.exists() and not whole(fakes, sif)
        time.sleep(0.05)
    for j, p in zip(two, procs):
        j.discovery.wait_image_import(p)
    assert not seen_partial and len(builds(fakes)) == 2 and whole(fakes, sif)
    logs = [(jobs / n / "logs" / "import-image.log").read_text() for n in ("a", "b")]
    assert sum("was made by another process" in t for t in logs) == 1, logs
    assert leftovers(sif.parent) == []
    for j in (first, later, *two):
        j.log.close()
    assert json.loads((jobs / "a" / "plan.json").read_text())["preflight"]["image"] == {
        "note": f"{URI} is built into {sif} by the batch host, before any step"}


def test_the_site_caches_owner_builds_into_it_for_every_user(tmp_path, on_path):
    """site.container.image_cache: the job of its owner builds the image there once, readable by
    every user (0755 directory, 0644 file); the runtime tells the helper the owner."""
    import getpass
    site = tmp_path / "site-images"
    d = tmp_path / "jobs" / "own"
    p = plan_for([*SETS, "name=own", f"site.container.image_cache.dir={site}",
                  f"site.container.image_cache.owner={getpass.getuser()}"])
    render.write_job(render.render_files(p, str(d)), d)
    job = jobmod.Job(str(d))
    imp = job.plan.container.import_
    assert imp.owner == getpass.getuser()
    assert imp.sif == f"{site}/lmsysorg+sglang+v0.5.23.sif"
    job.discovery.wait_image_import(job.discovery.start_image_import())
    job.log.close()
    sif = Path(imp.sif)
    assert len(builds(on_path)) == 1 and whole(on_path, sif)
    assert site.stat().st_mode & 0o777 == 0o755 and sif.stat().st_mode & 0o777 == 0o644
