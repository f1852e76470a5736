"""Another user (hpcserve-b) in the caches a site shares between users: the image cache beside
a shared jobs folder and a site's compile-cache directory. An image and a compiled kernel are
code the deployment runs as its user, so what the other user made at this user's place in them
(their directory, their image in it) is refused in one line naming them, and never used."""

from __future__ import annotations

import dataclasses
import getpass
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from adversarykit import OTHER, as_other, shared  # noqa: F401  (shared: a fixture)
from hpcserve.author import config, plan, render

ROOT = Path(__file__).resolve().parents[2]
ME = getpass.getuser()
HELPERS = {"enroot": ("enroot-import.sh", ".sqsh"), "apptainer": ("apptainer-build.sh", ".sif")}


def _stub(bin_dir: Path, name: str, calls: Path) -> None:
    """`name` on PATH that records each call and does nothing else."""
    f = bin_dir / name
    f.write_text(f'#!/bin/sh\necho "{name} $*" >>{calls}\nexit 0\n')
    f.chmod(0o755)


@pytest.mark.parametrize("tool", sorted(HELPERS))
def test_an_image_directory_another_user_made_at_this_users_place_is_refused(
        shared, tmp_path, tool):
    helper, suffix = HELPERS[tool]
    mine = shared / ".hpcserve-images" / ME
    target = mine / f"lmsysorg+sglang+v0.5.23{suffix}"
    # their "image", where this user's jobs would look for it, in a directory of theirs
    as_other("sh", "-c", f"umask 022; mkdir -p {mine} && echo theirs > {target}")
    bins, calls = tmp_path / "bin", tmp_path / "calls"
    bins.mkdir()
    _stub(bins, tool, calls)
    r = subprocess.run(["bash", str(ROOT / "containers" / helper),
                        "docker://lmsysorg/sglang:v0.5.23", str(target)],
                       env={**os.environ, "PATH": f"{bins}:{os.environ['PATH']}"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    assert f"refusing {mine} for images (owner {OTHER}, mode 755)" in r.stderr, r.stderr
    assert not calls.exists(), calls.read_text()      # nothing imported, nothing built
    assert target.read_text() == "theirs\n"           # nor theirs touched


def test_a_compile_cache_another_user_made_at_this_users_place_stops_the_engine(
        shared, tmp_path):
    cache = shared / "cache"
    as_other("sh", "-c", f"umask 022; mkdir -p {cache}/{ME}/tiny-llama")
    doc = {"name": "cc", "site": {"base": "local", "node": {"gpus": 1},
                                  "paths": {"cache_dir": str(cache)}},
           "model": {"profile": "tiny-llama", "path": "/models/tiny-llama"},
           "engine": {"name": "vllm", "version": "0.32.0", "simulate": True},
           "roles": {"worker": {"nodes": 1}}, "router": {"enabled": False}}
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(doc))
    job = tmp_path / "job"
    p = plan.build(dataclasses.replace(config.load(tmp_path / "d.yaml"), user=ME))
    render.write_job(render.render_files(p, str(job)), job)
    (job / "run").mkdir(exist_ok=True)
    (job / "run" / "worker-0.nodes").write_text("0 n1 127.0.0.1 lo -\n")
    env = {**os.environ, "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7",
           "PATH": f"{ROOT / 'tests' / 'fakes' / 'engine'}:{os.environ['PATH']}",
           "HPCSERVE_FAKE_ENGINE": "exit:0", "HPCSERVE_FAKE_PYTHON": sys.executable}
    r = subprocess.run(["bash", str(job / "launch" / "worker-0.sh")], env=env,
                       capture_output=True, text=True, timeout=60)
    log = (job / "logs" / "worker-0.node0.n1.log").read_text()
    assert r.returncode == 3, (r, log)
    assert f"compile cache {cache}/{ME} refused (owner {OTHER}, mode 755)" in log, log
    assert not (job / "run" / "caches").exists()      # stopped before any cache or engine


SITE_OWNER = "hpcserve-a"  # the site's image account; OTHER plays a user who is not it
DIGEST = "sha256:" + "7c" * 32
PINNED = f"docker://lmsysorg/sglang@{DIGEST}"


def _site_cache(shared: Path) -> tuple[Path, Path]:
    """The site's image cache as its owner's import leaves it: a 0755 directory holding a whole
    squashfs of PINNED and the record of its digest, 0644, all SITE_OWNER's."""
    site = shared / "site-images"
    target = site / "lmsysorg+sglang+sha256+7c.sqsh"
    (site / "rootfs").mkdir(parents=True)
    subprocess.run(["mksquashfs", str(site / "rootfs"), str(target), "-quiet", "-no-progress"],
                   check=True, stdout=subprocess.DEVNULL)
    (site / "rootfs").rmdir()
    Path(f"{target}.digest").write_text(DIGEST + "\n")
    for p in (site, target, Path(f"{target}.digest")):
        p.chmod(0o755 if p == site else 0o644)
        os.chown(p, *_ids(SITE_OWNER))
    return site, target


def _ids(user: str) -> tuple[int, int]:
    import pwd
    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid


def _helper_as_me(tmp_path: Path, target: Path) -> tuple[subprocess.CompletedProcess, Path]:
    bins, calls = tmp_path / "bin", tmp_path / "calls"
    bins.mkdir(exist_ok=True)
    _stub(bins, "enroot", calls)
    r = subprocess.run(["bash", str(ROOT / "containers" / "enroot-import.sh"), "--owner",
                        SITE_OWNER, PINNED, str(target)],
                       env={**os.environ, "PATH": f"{bins}:{os.environ['PATH']}"},
                       capture_output=True, text=True, timeout=60)
    return r, calls


def test_the_sites_image_cache_is_used_as_its_owner_left_it(shared, tmp_path):
    """site.container.image_cache names SITE_OWNER: a job of another user takes the pinned image
    there, whose record names its digest, and imports nothing."""
    site, target = _site_cache(shared)
    r, calls = _helper_as_me(tmp_path, target)
    assert r.returncode == 0 and f"{target} ({SITE_OWNER}'s) is up to date" in r.stderr, r
    assert not calls.exists()


@pytest.mark.parametrize("plant", ["theirs", "writable", "unrecorded", "other-digest", "link",
                                   "missing"])
def test_what_is_not_the_site_owners_verified_image_is_refused(shared, tmp_path, plant):
    """In the site's cache, an image that is another user's (OTHER put it there while the
    directory let them), a directory others may write, an image whose record is missing or names
    another digest, a link, or no image at all: refused in one line, exit 2, nothing imported,
    nothing in the cache changed."""
    site, target = _site_cache(shared)
    record = Path(f"{target}.digest")
    if plant == "theirs":
        os.chown(target, *_ids(OTHER))
    elif plant == "writable":
        site.chmod(0o777)
    elif plant == "unrecorded":
        record.unlink()
    elif plant == "other-digest":
        record.write_text("sha256:" + "00" * 32 + "\n")
    elif plant == "link":
        target.rename(site / "elsewhere.sqsh")
        target.symlink_to(site / "elsewhere.sqsh")
    else:
        target.unlink()
    before = sorted((p.name, p.lstat().st_uid, p.lstat().st_mode) for p in site.iterdir())
    r, calls = _helper_as_me(tmp_path, target)
    assert r.returncode == 2, r
    [line] = r.stderr.splitlines()
    if plant == "writable":
        assert f"refusing {site} for images (owner {SITE_OWNER}, mode 777)" in line
    else:
        assert (f"the site's image cache ({SITE_OWNER}'s, read-only to you) has no verified "
                f"image of {PINNED} at {target}") in line
    if plant == "theirs":
        assert f"(what is there is {OTHER}'s, mode 644)" in line
    assert not calls.exists()
    assert sorted((p.name, p.lstat().st_uid, p.lstat().st_mode) for p in site.iterdir()) == before
