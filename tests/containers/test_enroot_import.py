"""containers/enroot-import.sh against the fake enroot, whose import writes a real squashfs file
progressively (as enroot does), with real flock and unsquashfs."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ctkit import ROOT, Fakes

HELPER = ROOT / "containers" / "enroot-import.sh"



@pytest.fixture(autouse=True)
def _squashfs_tools() -> None:
    # These tests must run in CI, not skip: scripts/setup.sh installs squashfs-tools.
    if not (shutil.which("mksquashfs") and shutil.which("unsquashfs")):
        pytest.fail("squashfs-tools is not installed (scripts/setup.sh installs it)")


def valid(path: Path) -> bool:
    return subprocess.run(["unsquashfs", "-l", str(path)], capture_output=True).returncode == 0


def imports(fakes: Fakes) -> list[dict]:
    return [c for c in fakes.calls("enroot") if c["argv"][0] == "import" and c["ok"]]


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(".tmp-"))


def test_imports_validates_and_moves_into_place(tmp_path: Path, fakes: Fakes) -> None:
    target = tmp_path / "images" / "sglang.sqsh"
    r = fakes.run(["bash", str(HELPER), "lmsysorg/sglang:v0.5.23", str(target)])
    assert r.returncode == 0, r.stderr
    [imp] = imports(fakes)
    assert imp["uri"] == "docker://lmsysorg/sglang:v0.5.23"  # docker:// assumed, as pyxis does
    # made in a new directory beside TARGET, under TARGET's name, then renamed into place
    out = Path(imp["output"])
    assert out.name == target.name and out.parent.parent == target.parent
    assert out.parent.name.startswith(".tmp-")
    assert valid(target)
    assert (tmp_path / "images" / "sglang.sqsh.lock").exists()
    assert leftovers(target.parent) == []


def test_existing_valid_image_is_left_alone(tmp_path: Path, fakes: Fakes) -> None:
    target = tmp_path / "sglang.sqsh"
    assert fakes.run(["bash", str(HELPER), "docker://nvcr.io#nvidia/pytorch:24.01-py3",
                      str(target)]).returncode == 0
    before = target.stat().st_mtime_ns
    r = fakes.run(["bash", str(HELPER), "docker://nvcr.io#nvidia/pytorch:24.01-py3", str(target)])
    assert r.returncode == 0 and "up to date" in r.stderr
    assert len(imports(fakes)) == 1 and target.stat().st_mtime_ns == before


def test_broken_image_is_imported_again(tmp_path: Path, fakes: Fakes) -> None:
    target = tmp_path / "sglang.sqsh"
    target.write_bytes(b"hsqs" + b"\0" * 100)  # squashfs magic, nothing behind it
    r = fakes.run(["bash", str(HELPER), "lmsysorg/sglang:v0.5.23", str(target)])
    assert r.returncode == 0, r.stderr
    assert "is not a whole image; making it again" in r.stderr and len(imports(fakes)) == 1 and valid(target)


def test_concurrent_imports_make_one_import_and_a_valid_file(tmp_path: Path, fakes: Fakes) -> None:
    target = tmp_path / "images" / "sglang.sqsh"
    env = {"HPCSERVE_FAKE_ENROOT_IMPORT_SECONDS": "1.5"}
    procs = [fakes.popen(["bash", str(HELPER), "lmsysorg/sglang:v0.5.23", str(target)], env=env)
             for _ in range(4)]
    seen_partial = False
    while any(p.poll() is None for p in procs):
        # whoever looks meanwhile finds no file or a whole one, never enroot's partial output
        if target.exists() and not valid(target):
            seen_partial = True
        time.sleep(0.05)
    outs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e for _, e in outs]
    assert not seen_partial
    assert len(imports(fakes)) == 1
    assert sum("made by another process" in e for _, e in outs) == 3
    assert valid(target) and leftovers(target.parent) == []


@pytest.mark.parametrize("mode", ["error", "truncate"])
def test_failed_import_leaves_nothing(tmp_path: Path, fakes: Fakes, mode: str) -> None:
    # "error": enroot fails half-way; "truncate": it exits 0 with a broken file, which only the
    # unsquashfs -l validation catches.
    target = tmp_path / "sglang.sqsh"
    r = fakes.run(["bash", str(HELPER), "lmsysorg/sglang:v0.5.23", str(target)],
                  env={"HPCSERVE_FAKE_ENROOT_IMPORT_FAIL": mode})
    assert r.returncode != 0
    assert not target.exists() and leftovers(tmp_path) == []
    if mode == "truncate":
        assert "is not whole" in r.stderr


@pytest.mark.parametrize("args, message", [
    ([], "usage"),
    (["lmsysorg/sglang:v0.5.23"], "usage"),
    (["lmsysorg/sglang:v0.5.23", "/tmp/x.img"], "must end in .sqsh"),
    (["oras://ghcr.io/x/y:1", "/tmp/x.sqsh"], "unsupported image URI"),
    (["--bogus", "a", "/tmp/x.sqsh"], "usage"),
])
def test_bad_usage(fakes: Fakes, args: list[str], message: str) -> None:
    r = fakes.run(["bash", str(HELPER), *args])
    assert r.returncode == 2 and message in r.stderr
    assert imports(fakes) == []


DIGEST = "sha256:" + "5e" * 32


def test_a_pinned_image_is_used_only_with_the_record_of_its_import(tmp_path: Path,
                                                                   fakes: Fakes) -> None:
    """IMAGE@sha256:... is imported by that reference and recorded (TARGET.digest); a file at
    TARGET without the record (copied by hand, imported from a tag) is imported again."""
    target = tmp_path / "images" / "sglang.sqsh"
    uri = f"docker://lmsysorg/sglang@{DIGEST}"
    r = fakes.run(["bash", str(HELPER), uri, str(target)])
    assert r.returncode == 0, r.stderr
    [imp] = imports(fakes)
    assert imp["uri"] == uri and valid(target)
    assert (target.parent / "sglang.sqsh.digest").read_text() == DIGEST + "\n"
    assert target.parent.stat().st_mode & 0o777 == 0o700  # the user's own part
    r = fakes.run(["bash", str(HELPER), uri, str(target)])
    assert r.returncode == 0 and "is up to date" in r.stderr and len(imports(fakes)) == 1
    (target.parent / "sglang.sqsh.digest").unlink()
    r = fakes.run(["bash", str(HELPER), uri, str(target)])
    assert r.returncode == 0, r.stderr
    assert f"is not a whole image recorded as {DIGEST}; making it again" in r.stderr
    assert len(imports(fakes)) == 2
    assert (target.parent / "sglang.sqsh.digest").read_text() == DIGEST + "\n"
    assert leftovers(target.parent) == []


@pytest.mark.parametrize("pin", ["sha256:abc", "sha256:" + "5E" * 32, "sha256:" + "5e" * 33])
def test_a_malformed_pin_is_refused(tmp_path: Path, fakes: Fakes, pin: str) -> None:
    r = fakes.run(["bash", str(HELPER), f"lmsysorg/sglang@{pin}", str(tmp_path / "x.sqsh")])
    assert r.returncode == 2 and "names its digest as @sha256: and 64 lower-case hex" in r.stderr
    assert imports(fakes) == [] and not (tmp_path / "x.sqsh").exists()


def test_the_site_caches_owner_imports_for_every_user_to_read(tmp_path: Path,
                                                              fakes: Fakes) -> None:
    """--owner naming the user who runs it: the site's cache, made 0755, its image and record
    0644 (others read them; the other users' side is tests/adversary/test_planted_caches.py)."""
    import getpass
    site = tmp_path / "site-images"
    target = site / "sglang.sqsh"
    r = fakes.run(["bash", str(HELPER), "--owner", getpass.getuser(),
                   f"lmsysorg/sglang@{DIGEST}", str(target)])
    assert r.returncode == 0, r.stderr
    assert site.stat().st_mode & 0o777 == 0o755
    assert target.stat().st_mode & 0o777 == 0o644 and valid(target)
    assert (site / "sglang.sqsh.digest").stat().st_mode & 0o777 == 0o644
