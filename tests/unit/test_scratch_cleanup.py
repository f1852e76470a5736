"""launch/scratch-cleanup.sh on one node, run as the runtime runs it after the job's steps ended:
the engine's private temporary directory goes, and so do the shared memory segments it left in
/dev/shm (a crashed vLLM worker never unlinks its own), but only those: not what was there
before the engine started, and not one another process still holds."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from hpcserve.author import config, plan, render

ROOT = Path(__file__).resolve().parents[2]


def test_the_cleanup_removes_what_the_engine_left_and_nothing_else(tmp_path):
    job = tmp_path / "job"
    p = plan.build(config.load(ROOT / "examples" / "vllm-cpu-tp2.yaml"))
    render.write_job(render.render_files(p, str(job)), job)
    script = job / "launch" / "scratch-cleanup.sh"
    tag = f"hpcserve-test-{uuid.uuid4().hex[:8]}"
    shm = Path("/dev/shm")
    before, left, held = (shm / f"{tag}-{k}" for k in ("before", "left", "held"))
    before.write_bytes(b"x")
    (job / "run" / "shm").mkdir(parents=True)
    # the engine's start on node "n1": /dev/shm as it was then
    (job / "run" / "shm" / "worker-0.0.n1").write_text("\n".join(os.listdir(shm)) + "\n")
    left.write_bytes(b"x")
    held.write_bytes(b"x")
    holder = subprocess.Popen(["sleep", "60"], stdin=open(held, "rb"))
    # the launch script's directories on n1, as it records them (two attempts), and one of
    # another user's at a recorded path, and one at the name the job id predicts: theirs stay
    scratch = [tmp_path / "tmp" / f"hpcserve-job77-worker-0.0.{k}" for k in ("aB3dE6", "Xy9z01")]
    theirs = tmp_path / "tmp" / "hpcserve-job77-worker-0.0.theirs"
    guessed = tmp_path / "tmp" / "hpcserve-job77"
    for d in (*scratch, theirs, guessed):
        (d / "inside").mkdir(parents=True)
    os.chown(theirs, 65534, 65534)
    (job / "run" / "scratch").mkdir()
    (job / "run" / "scratch" / "worker-0.0.n1").write_text(
        "".join(f"{d}\n" for d in (*scratch, theirs, tmp_path / "elsewhere")))
    (tmp_path / "elsewhere").mkdir()
    try:
        env = {**os.environ, "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "77",
               "TMPDIR": str(tmp_path / "tmp")}
        r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert not left.exists() and before.exists() and held.exists()
        assert not any(d.exists() for d in scratch)
        assert theirs.exists() and guessed.exists() and (tmp_path / "elsewhere").exists()
        assert not (job / "run" / "shm" / "worker-0.0.n1").exists()
        assert not (job / "run" / "scratch" / "worker-0.0.n1").exists()
    finally:
        holder.kill()
        holder.wait()
        for f in (before, left, held):
            f.unlink(missing_ok=True)
