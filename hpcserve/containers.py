"""Container runtimes: how a task's command is wrapped so it runs in the engine image.

pyxis works through srun flags; apptainer and enroot wrap the command inside the task. The job
directory and the model path are always mounted at the same paths, so every path in the plan is
valid inside the container as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .words import Word

if TYPE_CHECKING:
    from .plan import Plan


def mounts(plan: "Plan", job_dir: str) -> list[tuple[str, str, str | None]]:
    out: list[tuple[str, str, str | None]] = []
    for m in plan.container.mounts:
        parts = m.split(":")
        out.append((parts[0], parts[1], parts[2] if len(parts) > 2 else None))
    covered = [src for src, _, _ in out]

    def add(path: str, flags: str | None) -> None:
        if not any(path == s or path.startswith(s.rstrip("/") + "/") for s in covered):
            out.append((path, path, flags))
            covered.append(path)

    add(job_dir, None)
    add(plan.model_path, "ro")
    return out


def wrap_task(plan: "Plan", job_dir: str) -> tuple[list[Word], list[Word]]:
    """(extra srun flags, command prefix) for the site's container runtime."""
    c = plan.container
    ms = mounts(plan, job_dir)
    if c.runtime == "pyxis":
        flags: list[Word] = [f"--container-image={plan.image}",
                             "--container-mounts=" + ",".join(
                                 f"{s}:{d}" + (f":{f}" if f else "") for s, d, f in ms),
                             f"--container-workdir={c.workdir or job_dir}",
                             "--no-container-mount-home"]
        if c.env:
            flags.append("--container-env=" + ",".join(c.env))
        return flags, []
    if c.runtime == "apptainer":
        prefix: list[Word] = ["apptainer", "exec", "--nv"]
        for s, d, f in ms:
            prefix += ["--bind", f"{s}:{d}" + (f":{f}" if f else "")]
        prefix += ["--pwd", c.workdir or job_dir, plan.image]
        return [], prefix
    if c.runtime == "enroot":
        # enroot start on a squashfs image: --rw so engines can write caches; mounts as -m.
        prefix = ["enroot", "start", "--rw"]
        for s, d, f in ms:
            prefix += ["--mount", f"{s}:{d}" + (f":{f}" if f else "")]
        prefix.append(plan.image)
        return [], prefix
    return [], []
