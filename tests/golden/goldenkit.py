"""What the golden tests compare: the examples, where their golden copies live, how they render."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# Copied verbatim into every job directory; compared with their sources instead of a golden copy.
# The in-job runtime: every module of hpcserve/runtime/, as the package hpcserve_runtime/.
RUNTIME = {f"hpcserve_runtime/{f.name}": f
           for f in sorted((ROOT / "hpcserve" / "runtime").glob("*.py"))}
COPIED = {**RUNTIME,
          "hpcserve_sim.py": ROOT / "hpcserve" / "sim" / "sglang.py",  # or the engine's own
          "hpcserve_simcore.py": ROOT / "hpcserve" / "sim" / "hpcserve_simcore.py",
          "hpcserve_facts.py": ROOT / "hpcserve" / "engines" / "facts.py",
          "hpcserve_enroot_import.sh": ROOT / "containers" / "enroot-import.sh"}


GOLDEN_USER = "alice"   # the user the golden job directories are rendered for


def copied(rel: str) -> str | None:
    """The COPIED name of a job-directory path, in the job's own directory or in an autoscale
    slot's under scale/<slot>/ (rendered with the front, its own runtime copy); else None."""
    parts = rel.split("/")
    for name in (rel, "/".join(parts[2:]) if parts[0] == "scale" else None):
        if name in COPIED:
            return name
    return None


def job_dir_for(stem: str) -> str:
    """A fixed job directory per example, so the rendered text does not depend on the machine."""
    return f"/jobs/{stem}"


def render_example(example: Path) -> dict[str, tuple[str, int]]:
    from dataclasses import replace

    from hpcserve.author import config, plan
    from hpcserve.author.render import render_files
    # the cluster user fixed, so that the per-user cache paths read the same for whoever runs this
    cfg = replace(config.load(example), user=GOLDEN_USER)
    return render_files(plan.build(cfg), job_dir_for(example.stem))
