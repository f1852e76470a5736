"""Another user (hpcserve-b, a real second Unix user) in a directory the deployment shares with
everyone: Prometheus's file_sd directory, which many users' jobs write and so is writable by
all (sticky, as a site sets it up). A link they plant at a name the job would write through
neither redirects that write nor stops it."""

from __future__ import annotations

import os

from adversarykit import OTHER, as_other, shared  # noqa: F401  (shared: a fixture)
from hpcserve.runtime.file_sd import write_atomic

def test_a_link_planted_at_the_temporary_name_neither_redirects_nor_stops_the_write(shared):
    """The name the file was once written through (.<name>.tmp, known to anyone) is a link of
    theirs to a file of the job's user: the target is left as it was, the link too, and the
    targets file is written (readable by Prometheus's user) all the same."""
    victim = shared / "victim"
    victim.write_text("keep\n")
    victim.chmod(0o600)
    name = "hpcserve-t-c1-4242.json"
    as_other("ln", "-s", str(victim), f"{shared}/.{name}.tmp")
    write_atomic(str(shared / name), '[{"targets": ["10.0.0.1:8000"]}]\n')
    assert victim.read_text() == "keep\n" and victim.stat().st_mode & 0o777 == 0o600
    assert os.readlink(shared / f".{name}.tmp") == str(victim)
    assert (shared / name).read_text() == '[{"targets": ["10.0.0.1:8000"]}]\n'
    assert as_other("cat", f"{shared}/{name}").stdout.startswith('[{"targets"')
    assert sorted(os.listdir(shared)) == sorted([name, f".{name}.tmp", "victim"])
