"""Container runtimes: how an engine or router task runs in the engine image.

Every engine and router step (runtime other than `none`) runs the same task on each of its nodes:

    srun <slurm flags> [pyxis --container-* flags] bash JOB/launch/container-task.sh TASK \\
        bash JOB/launch/TASK.sh

`launch/container-task.sh` is rendered once per job from sbatch_templates/container_task.sh.j2 and
holds everything runtime-specific that happens in the task:

- pyxis: the container exists before the task starts (srun's --container-* flags); the script
  runs inside it and only raises the memlock limit before it execs the launch script. A docker
  image is imported once per job, by hpcserve_runtime on the batch node before any step starts,
  into the shared cache (the same enroot-import.sh), and every step's --container-image names
  that squashfs file: nodes never pull from the registry themselves.
- apptainer: the script runs on the host and execs `apptainer exec --nv --bind ... IMAGE`. A
  registry image is built once per job into a SIF in the shared cache, by hpcserve_runtime on the
  batch node before any step (apptainer-build.sh), and every task execs that file.
- enroot: the script runs on the host: `enroot create` of a container named after the job, step,
  task and node, `enroot start --rw`, and `enroot remove --force` once the task ends, also after a
  signal (the engine gets the TERM, the container is removed once it has exited, and the task
  then exits 0 so that srun's --kill-on-bad-exit does not SIGKILL the other nodes mid-removal).
  A docker image is first imported into a shared cache by the job's copy of
  containers/enroot-import.sh. Only a SIGKILL can leave a container behind (srun kills the other
  tasks of a step whose task failed); run/containers/ lists them and `container-task.sh
  --cleanup`, run on a node, removes them.
- none: no wrapper at all; the step runs the launch script directly.

The job directory and the model path are always mounted at the same paths, so every path in the
plan is valid inside the container as well. The engine's own environment (NCCL_*, GLOO_*, UCX_*,
MC_*, ...) is exported by the launch script inside the container, after the runtime has set up its
environment, so it wins over any value the image defines, in every runtime.

Devices and shared memory: all three runtimes show the host's /dev, /dev/infiniband and /dev/shm by
default (enroot's 10-system.fstab rbinds /dev and binds /dev/shm, pyxis uses enroot, Apptainer has
`mount dev = yes`). The options that would hide them (pyxis --container-unshare=ipc, enroot
--ipc, Apptainer --contain/--containall/--ipc) are deliberately never used; a site that sets
ENROOT_RESTRICT_DEV must also set MELLANOX_VISIBLE_DEVICES for enroot's 99-mellanox hook.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import package_data
from .compile_caches import user_root
from ..errors import ConfigError
from .templates import jinja
from .words import Word

if TYPE_CHECKING:
    from .plan import Plan

RUNTIMES = ("pyxis", "enroot", "apptainer", "none")
TASK_SCRIPT = "launch/container-task.sh"
IMPORT_HELPER = "hpcserve_enroot_import.sh"
IMPORT_SOURCE = package_data.path("container_recipes", "enroot-import.sh")
BUILD_HELPER = "hpcserve_apptainer_build.sh"
BUILD_SOURCE = package_data.path("container_recipes", "apptainer-build.sh")
# the cache procedure both helpers source from their own directory, under this one name
CACHE_LIB = "hpcserve_image_cache.sh"
CACHE_LIB_SOURCE = package_data.path("container_recipes", CACHE_LIB)
# The registry sources `apptainer build` makes a SIF from, which a job builds once (others, as
# shub:// or https://, are left to `apptainer exec`).
APPTAINER_BUILDS = ("docker://", "oras://", "library://")
IMAGE_CACHE = ".hpcserve-images"
CONTAINERS_MADE = "run/containers"  # enroot: one file per container not yet removed

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# enroot, pyxis and Apptainer split mount lists on "," and fields on ":", enroot rejects whitespace
# in a mount and fstab lines (which pyxis writes) cannot hold it either.
_BAD_MOUNT_CHARS = re.compile(r"[,:\s]")
_URI_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*://")  # not registry:5000/img


@dataclass(frozen=True)
class Mount:
    src: str
    dst: str
    mode: str | None  # None (read-write, the runtimes' default), "ro" or "rw"

    def pyxis(self) -> str:
        # pyxis prepends "x-create=auto,rbind" itself and joins extra flags with "+".
        return f"{self.src}:{self.dst}" + (f":{self.mode}" if self.mode else "")

    def enroot(self) -> str:
        # enroot's --mount is an fstab line with ":" between the fields, so SRC:DST:ro would make
        # "ro" the file-system type; spell out what pyxis hands enroot for the same mount.
        opts = "x-create=auto,rbind" + (f",{self.mode}" if self.mode else "")
        return f"{self.src}:{self.dst}:none:{opts}"

    def apptainer(self) -> str:
        return f"{self.src}:{self.dst}" + (f":{self.mode}" if self.mode else "")


def _covered(path: str, by: list[str]) -> bool:
    return any(path == s or path.startswith(s.rstrip("/") + "/") for s in by)


def mounts(plan: "Plan", job_dir: str) -> list[Mount]:
    """The site's mounts plus the job directory (read-write), the model path (read-only), the
    model's staged copy where it is staged (read-only) and the compile-cache directory
    (read-write), unless a site mount already covers them."""
    out: list[Mount] = []
    for m in plan.container.mounts:
        parts = m.split(":")
        out.append(Mount(parts[0], parts[1], parts[2] if len(parts) > 2 else None))
    covered = [m.src for m in out]
    staged = [(plan.stage["path"], "ro")] if plan.stage else []
    ours = [(job_dir, None), (plan.model_path, "ro"), *staged] + (
        [(plan.cache_dir, None)] if plan.cache_dir else [])
    for path, mode in ours:
        if not _covered(path, covered):
            out.append(Mount(path, path, mode))
            covered.append(path)
    for m in out:
        for p in (m.src, m.dst):
            if not p.startswith("/") or _BAD_MOUNT_CHARS.search(p):
                raise ConfigError(
                    f"cannot mount {p!r} into a {plan.container.runtime} container: container "
                    "mounts need absolute paths without ',', ':' or whitespace",
                    field="site.container.mounts")
    return out


def _env_names(plan: "Plan") -> list[str]:
    # secrets given as {from_env: NAME} must come from the host whatever the image sets
    names = list(dict.fromkeys(list(plan.container.env) + list(plan.secret_env)))
    for n in names:
        if not _ENV_NAME.match(n):
            raise ConfigError(f"{n!r} is not an environment variable name",
                              field="site.container.env")
    return names


def enroot_image(plan: "Plan", job_dir: str) -> tuple[str | None, str]:
    """(URI to import or None, squashfs path enroot or pyxis creates the container from).

    A path (a site's prebuilt .sqsh) is used as it is. Anything else is an enroot/pyxis docker
    URI ([docker://][USER@][REGISTRY#]IMAGE[:TAG]), imported once into a cache next to the job
    directory that every job in the same jobs folder shares (enroot-import.sh makes concurrent
    imports safe), so that nodes do not each pull the image from the registry.
    """
    image = plan.image or ""
    if image.startswith(("/", "./", "../")):
        return None, image
    uri = image if _URI_SCHEME.match(image) else f"docker://{image}"
    return uri, _cached(plan, job_dir, uri, ".sqsh")


def _cached(plan: "Plan", job_dir: str, uri: str, suffix: str) -> str:
    """The image cache's file for `uri`: beside the job directories, in the user's own part of
    it (<jobs_dir>/.hpcserve-images/<user>/), or the site's (site.container.image_cache), which
    its owner alone writes. An image is code the deployment runs as its user: the helpers
    (enroot-import.sh, apptainer-build.sh, through hpcserve_image_cache.sh) refuse a directory or
    image another user owns or may write, so nobody else's file is ever taken for the image."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "+", uri.split("://", 1)[-1]).strip("+")
    site = plan.container.image_cache
    if site:
        return f"{site.dir.rstrip('/')}/{stem}{suffix}"
    cache = os.path.join(os.path.dirname(job_dir.rstrip("/")) or "/", IMAGE_CACHE)
    return f"{user_root(cache, plan.user)}/{stem}{suffix}"


def cache_owner(plan: "Plan") -> str | None:
    """The user who alone writes the site's image cache (the helpers' --owner), if it has one."""
    site = plan.container.image_cache
    return site.owner if site else None


def apptainer_image(plan: "Plan", job_dir: str) -> tuple[str | None, str]:
    """(URI to build or None, the image `apptainer exec` runs).

    Apptainer takes paths and URIs; a bare pyxis-style name such as
    nvcr.io#nvidia/pytorch:24.01-py3 becomes docker://nvcr.io/nvidia/pytorch:24.01-py3. A registry
    image (docker://, oras://, library://) is built once per job into a SIF in the same image cache
    as enroot's squashfs files (apptainer-build.sh locks, checks and renames; a later job finds it
    there), so that the tasks on every node do not each pull it."""
    image = plan.image or ""
    if image.startswith(("/", "./", "../")):
        return None, image
    uri = image if _URI_SCHEME.match(image) else "docker://" + image.replace("#", "/", 1)
    if not uri.startswith(APPTAINER_BUILDS):
        return None, uri
    return uri, _cached(plan, job_dir, uri, ".sif")


def image_import(plan: "Plan", job_dir: str) -> dict | None:
    """The image the runtime imports (pyxis: a squashfs) or builds (apptainer: a SIF) once, on the
    batch node before any step, with the helper copied into the job directory; None: nothing to
    do (a path, enroot's tasks importing for themselves, no container)."""
    runtime = plan.container.runtime
    if runtime == "pyxis":
        uri, sqsh = enroot_image(plan, job_dir)
        return uri and {"uri": uri, "sqsh": sqsh, "helper": f"{job_dir}/{IMPORT_HELPER}",
                        "owner": cache_owner(plan)}
    if runtime == "apptainer":
        uri, sif = apptainer_image(plan, job_dir)
        return uri and {"uri": uri, "sif": sif, "helper": f"{job_dir}/{BUILD_HELPER}",
                        "owner": cache_owner(plan)}
    return None


def stop_timeout(plan: "Plan") -> int:
    """Seconds the enroot task waits for its engine after a TERM before it KILLs it itself.

    hpcserve_runtime KILLs an engine step at the earliest (signal_grace - 5) / 2 seconds after its
    TERM; the container can only be removed while the task still runs, so the task gives up on
    the engine 10 s before that, leaving the removal time to finish.
    """
    return max(1, (int(plan.signal_grace) - 5) // 2 - 10)


def wrap_task(plan: "Plan", job_dir: str, task: str) -> tuple[list[Word], list[Word]]:
    """(extra srun flags, command prefix) for one engine instance or the router (`task`)."""
    c = plan.container
    if c.runtime == "none":
        return [], []
    if c.runtime not in RUNTIMES:
        raise ConfigError(f"unknown container runtime {c.runtime!r}",
                          field="site.container.runtime")
    ms = mounts(plan, job_dir)
    prefix: list[Word] = ["bash", f"{job_dir}/{TASK_SCRIPT}", task]
    if c.runtime != "pyxis":
        return [], prefix
    flags: list[Word] = [
        # the squashfs hpcserve_runtime imported once for every node (or the site's own .sqsh)
        f"--container-image={enroot_image(plan, job_dir)[1]}",
        "--container-mounts=" + ",".join(m.pyxis() for m in ms),
        f"--container-workdir={c.workdir or job_dir}",
        "--no-container-mount-home",
        # engines write caches (triton, flashinfer JIT, torch compile) under $HOME, which is not
        # mounted: keep the rootfs writable like `enroot start --rw` does, whatever the site's
        # ENROOT_ROOTFS_WRITABLE default is. The container is unnamed, so pyxis removes it.
        "--container-writable",
    ]
    # --container-env: only the site's own list. pyxis sets the host environment after the
    # entrypoint but lets the image's values win; names listed here keep the host value. Every
    # variable hpcserve sets for an engine (NCCL_/GLOO_/UCX_/NVSHMEM_/MC_/SGLANG_...) is exported
    # by the launch script inside the already started container, so it beats the image without
    # help, and none of them is set on the host at srun time anyway (pyxis skips unset names).
    # What the task reads from the host (SLURMD_NODENAME, SLURM_*) no image defines. So the list
    # is for what the submitting environment deliberately sets and an image might override.
    names = _env_names(plan)
    if names:
        flags.append("--container-env=" + ",".join(names))
    return flags, prefix


def container_files(plan: "Plan", job_dir: str) -> dict[str, tuple[str, int]]:
    """The job-directory files the runtime needs: the task script, and for an enroot image given
    as a URI, the import helper."""
    c = plan.container
    if c.runtime == "none":
        return {}
    ms = mounts(plan, job_dir)
    names = _env_names(plan)
    uri, sqsh = enroot_image(plan, job_dir)
    ctx: dict = {"runtime": c.runtime, "job_dir": job_dir, "workdir": c.workdir or job_dir,
                 "env_names": names, "ib": bool(plan.ib_devices),
                 "image": sqsh if c.runtime == "pyxis" else plan.image,
                 "import_uri": None, "sqsh": None, "import_helper": None, "cache_owner": None,
                 "stop_timeout": stop_timeout(plan), "cache_dir": plan.cache_dir}
    files: dict[str, tuple[str, int]] = {}
    if c.runtime in ("enroot", "pyxis") and uri:
        files[IMPORT_HELPER] = (IMPORT_SOURCE.read_text(encoding="utf-8"), 0o700)
    built, sif = apptainer_image(plan, job_dir)
    if c.runtime == "apptainer" and built:
        files[BUILD_HELPER] = (BUILD_SOURCE.read_text(encoding="utf-8"), 0o700)
    if IMPORT_HELPER in files or BUILD_HELPER in files:
        files[CACHE_LIB] = (CACHE_LIB_SOURCE.read_text(encoding="utf-8"), 0o700)
    if c.runtime == "enroot":
        ctx.update(import_uri=uri, sqsh=sqsh, mounts=[m.enroot() for m in ms],
                   made=f"{job_dir}/{CONTAINERS_MADE}")
        if uri:
            ctx.update(import_helper=f"{job_dir}/{IMPORT_HELPER}", cache_owner=cache_owner(plan))
    elif c.runtime == "apptainer":
        ctx.update(image=sif, built_from=built, mounts=[m.apptainer() for m in ms])
    else:
        ctx["mounts"] = [m.pyxis() for m in ms]
    files[TASK_SCRIPT] = (jinja().get_template("container_task.sh.j2").render(**ctx), 0o700)
    return files
