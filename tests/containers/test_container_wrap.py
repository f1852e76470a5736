"""hpcserve.author.containers without running anything: srun flags, task prefixes, mounts, images."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from ctkit import GOLDEN, ROOT, plan_for
from hpcserve.author import containers, render
from hpcserve.errors import ConfigError

JD = "/shared/jobs/demo-1"


def containers_spec(p) -> str:
    from hpcserve.author.plan_json import dumps, job_spec
    return dumps(job_spec(p, JD))


def plan(runtime: str, *sets: str):
    extra = [] if runtime == "none" else ["site.container.image=lmsysorg/sglang:v0.5.23"]
    return plan_for([f"site.container.runtime={runtime}", *extra, *sets])


def test_none_is_plain() -> None:
    p = plan("none")
    assert containers.wrap_task(p, JD, "prefill-0") == ([], [])
    assert containers.container_files(p, JD) == {}


def test_pyxis_flags_and_prefix() -> None:
    p = plan("pyxis", "site.container.env=[NCCL_DEBUG,HF_TOKEN]",
             "site.container.mounts=[/lustre:/lustre,/scratch:/scratch:rw]",
             "site.container.workdir=/lustre/work")
    flags, prefix = containers.wrap_task(p, JD, "decode-0")
    assert flags == [
        # the squashfs the job imports once (next to the jobs folder), not the registry URI
        "--container-image=/shared/jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sqsh",
        "--container-mounts=/lustre:/lustre,/scratch:/scratch:rw,"
        f"{JD}:{JD},/models/Kimi-K2-Instruct:/models/Kimi-K2-Instruct:ro",
        "--container-workdir=/lustre/work",
        "--no-container-mount-home",
        "--container-writable",
        # the deployment's API key too: the host's value, whatever the image sets
        "--container-env=NCCL_DEBUG,HF_TOKEN,HPCSERVE_API_KEY",
    ]
    assert prefix == ["bash", f"{JD}/launch/container-task.sh", "decode-0"]
    assert [f for f in containers.wrap_task(plan("pyxis"), JD, "x")[0]
            if f.startswith("--container-env")] == ["--container-env=HPCSERVE_API_KEY"]


@pytest.mark.parametrize("runtime", ["enroot", "apptainer"])
def test_host_side_runtimes_only_prefix(runtime: str) -> None:
    assert containers.wrap_task(plan(runtime), JD, "router") == (
        [], ["bash", f"{JD}/launch/container-task.sh", "router"])


def test_mount_spellings() -> None:
    ro = containers.Mount("/m", "/m", "ro")
    rw = containers.Mount("/j", "/j", None)
    assert (ro.pyxis(), ro.apptainer(), ro.enroot()) == (
        "/m:/m:ro", "/m:/m:ro", "/m:/m:none:x-create=auto,rbind,ro")
    assert (rw.pyxis(), rw.apptainer(), rw.enroot()) == (
        "/j:/j", "/j:/j", "/j:/j:none:x-create=auto,rbind")


def test_site_mount_covering_the_job_and_model_is_not_repeated() -> None:
    p = plan("pyxis", "site.container.mounts=[/shared:/shared]", "model.path=/shared/models/k2")
    assert containers.mounts(p, JD) == [containers.Mount("/shared", "/shared", None)]


@pytest.mark.parametrize("sets, job_dir, field", [
    (["site.container.mounts=[data:/data]"], JD, "site.container.mounts"),
    ([], "/shared/jobs/a,b", "site.container.mounts"),
    ([], "/shared/my jobs/x", "site.container.mounts"),
    ([], "relative/job", "site.container.mounts"),
    (["site.container.env=[NCCL-DEBUG]"], JD, "site.container.env"),
])
def test_unmountable_paths_and_bad_names_are_refused(sets, job_dir, field) -> None:
    # the config checks the site's own values; the job directory is checked when rendering
    for runtime in ("pyxis", "enroot", "apptainer"):
        with pytest.raises(ConfigError) as e:
            render.render_files(plan(runtime, *sets), job_dir)
        assert (e.value.field or "").startswith(field)


def test_enroot_image_path_or_cached_import() -> None:
    assert containers.enroot_image(plan("enroot", "site.container.image=/img/s.sqsh"), JD) == (
        None, "/img/s.sqsh")
    assert containers.enroot_image(plan("enroot"), JD) == (
        "docker://lmsysorg/sglang:v0.5.23",
        "/shared/jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sqsh")
    assert containers.enroot_image(
        plan("enroot", "site.container.image=docker://nvcr.io#nvidia/pytorch:24.01-py3"), JD) == (
        "docker://nvcr.io#nvidia/pytorch:24.01-py3",
        "/shared/jobs/.hpcserve-images/alice/nvcr.io+nvidia+pytorch+24.01-py3.sqsh")
    assert containers.enroot_image(
        plan("enroot", "site.container.image=registry:5000#team/sglang:1"), JD)[0] == (
        "docker://registry:5000#team/sglang:1")


@pytest.mark.parametrize("image, want", [
    ("/shared/sglang.sif", "/shared/sglang.sif"),
    ("docker://lmsysorg/sglang:v0.5.23", "docker://lmsysorg/sglang:v0.5.23"),
    ("oras://ghcr.io/x/sglang:1", "oras://ghcr.io/x/sglang:1"),
    ("lmsysorg/sglang:v0.5.23", "docker://lmsysorg/sglang:v0.5.23"),
    ("nvcr.io#nvidia/pytorch:24.01-py3", "docker://nvcr.io/nvidia/pytorch:24.01-py3"),
    ("registry:5000#team/sglang:1", "docker://registry:5000/team/sglang:1"),
    ("https://example.org/sglang.sif", "https://example.org/sglang.sif"),
])
def test_apptainer_image(image: str, want: str) -> None:
    """A path runs as it is; a registry image is built once into the image cache beside the job
    directories, and the tasks run that SIF; other URIs are left to apptainer exec."""
    uri, run = containers.apptainer_image(plan("apptainer", f"site.container.image={image}"), JD)
    if want.startswith(("docker://", "oras://")):
        stem = want.split("://", 1)[1].replace("/", "+").replace(":", "+")
        assert (uri, run) == (want, f"{Path(JD).parent}/.hpcserve-images/alice/{stem}.sif")
    else:
        assert (uri, run) == (None, want)


@pytest.mark.parametrize("grace, want", [(10, 1), (60, 17), (120, 47), (180, 77)])
def test_stop_timeout_leaves_room_before_the_kill(grace: int, want: int) -> None:
    p = plan("enroot", f"site.slurm.signal_grace={grace}")
    assert containers.stop_timeout(p) == want
    # the runtime KILLs an engine tier at the earliest (grace - 5) / 2 s after its TERM
    assert want < max(1.0, (grace - 5) / 2)


def test_pyxis_starts_from_the_job_imported_squashfs_or_the_sites_own() -> None:
    spec = json.loads(containers_spec(plan("pyxis")))
    assert spec["container"]["import"] == {
        "uri": "docker://lmsysorg/sglang:v0.5.23",
        "sqsh": "/shared/jobs/.hpcserve-images/alice/lmsysorg+sglang+v0.5.23.sqsh",
        "helper": f"{JD}/{containers.IMPORT_HELPER}", "owner": None}
    assert containers.IMPORT_HELPER in containers.container_files(plan("pyxis"), JD)
    # a site's prebuilt squashfs: used as it is, nothing imported
    own = plan("pyxis", "site.container.image=/lustre/images/sglang.sqsh")
    assert containers.wrap_task(own, JD, "x")[0][0] == \
        "--container-image=/lustre/images/sglang.sqsh"
    assert json.loads(containers_spec(own))["container"]["import"] is None
    assert containers.IMPORT_HELPER not in containers.container_files(own, JD)


def test_import_helper_is_shipped_only_for_uri_images() -> None:
    files = containers.container_files(plan("enroot"), JD)
    # its owner's alone, as every file of a job directory
    assert files[containers.IMPORT_HELPER] == (
        (ROOT / "containers" / "enroot-import.sh").read_text(), 0o700)
    assert containers.IMPORT_HELPER not in containers.container_files(
        plan("enroot", "site.container.image=/img/s.sqsh"), JD)


def test_memlock_warning_only_with_ib() -> None:
    without = containers.container_files(plan("pyxis"), JD)[containers.TASK_SCRIPT][0]
    with_ib = containers.container_files(
        plan("pyxis", "site.network.ib_devices=[mlx5_0]"), JD)[containers.TASK_SCRIPT][0]
    assert 'ulimit -S -l "$(ulimit -H -l)"' in without and "locked-memory limit" not in without
    assert "locked-memory limit" in with_ib


@pytest.mark.parametrize("variant", sorted(v for v in GOLDEN if v != "none"))
def test_task_scripts_parse(variant: str, tmp_path: Path) -> None:
    files = render.render_files(plan_for(GOLDEN[variant]), JD)
    for rel in ("launch/container-task.sh", "steps/decode-0.sh"):
        script = tmp_path / rel.replace("/", "_")
        script.write_text(files[rel][0])
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, f"{variant}/{rel}: {r.stderr}"


@pytest.mark.parametrize("runtime", ["pyxis", "enroot", "apptainer"])
def test_config_values_reach_the_shell_quoted(runtime: str) -> None:
    image = "/img/$(touch pwned)`id`'q.sqsh"
    job_dir = "/jobs/it's-$(x)"
    p = plan_for([f"site.container.runtime={runtime}", f"site.container.image={image}",
                  "site.container.env=[NCCL_DEBUG]"])
    files = render.render_files(p, job_dir)
    task = files["launch/container-task.sh"][0]
    step = files["steps/prefill-0.sh"][0]
    assert shlex.quote(f"{job_dir}/launch/container-task.sh") in step
    if runtime == "pyxis":
        assert shlex.quote(f"--container-image={image}") in step
    elif runtime == "enroot":
        assert f"image={shlex.quote(image)}\n" in task
        assert f"--mount {shlex.quote(f'{job_dir}:{job_dir}:none:x-create=auto,rbind')}" in task
    else:
        assert f"  {shlex.quote(image)} \\\n" in task
        assert f"--bind {shlex.quote(f'{job_dir}:{job_dir}')}" in task


def test_a_site_image_cache_names_its_file_and_owner_to_every_import() -> None:
    """site.container.image_cache: the image's file is in the site's directory, not the user's
    part of the jobs folder, and both the batch host's import (pyxis) and the tasks' (enroot)
    tell the helper whose cache it is."""
    sets = ["site.container.image_cache.dir=/site/images", "site.container.image_cache.owner=svc"]
    spec = json.loads(containers_spec(plan("pyxis", *sets)))
    assert spec["container"]["import"] == {
        "uri": "docker://lmsysorg/sglang:v0.5.23",
        "sqsh": "/site/images/lmsysorg+sglang+v0.5.23.sqsh",
        "helper": f"{JD}/{containers.IMPORT_HELPER}", "owner": "svc"}
    files = containers.container_files(plan("enroot", *sets), JD)
    assert (f"run bash {JD}/{containers.IMPORT_HELPER} --owner svc \"$uri\" \"$image\""
            in files[containers.TASK_SCRIPT][0])
    assert containers.CACHE_LIB in files
