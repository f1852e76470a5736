"""The stand-ins reject what the real tools reject (tests/fakes/fake_tools.py cites the sources),
and accept the forms the real tools accept."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from ctkit import Fakes, write_sif


@pytest.fixture
def dirs(tmp_path: Path) -> Path:
    for d in ("src", "dst", "work"):
        (tmp_path / d).mkdir()
    (tmp_path / "junk.sqsh").write_bytes(b"not a squashfs file")
    write_sif(tmp_path / "img.sif")
    return tmp_path


def sub(argv: list[str], tmp: Path) -> list[str]:
    return [a.replace("@", str(tmp)) for a in argv]


def rejected(fakes: Fakes, tool: str, argv: list[str], message: str, code: int | None = None
             ) -> subprocess.CompletedProcess:
    r = fakes.run([tool, *argv], stdin=subprocess.DEVNULL)
    assert r.returncode != 0, f"{tool} accepted {argv}"
    if code is not None:
        assert r.returncode == code, r.stderr
    assert message in r.stderr, r.stderr
    return r


def accepted(fakes: Fakes, tool: str, argv: list[str]) -> subprocess.CompletedProcess:
    r = fakes.run([tool, *argv], stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return r


# -------------------------------------------------------------------------------- srun+pyxis

ONE = ["--nodes=1", "--ntasks=1", "--nodelist=n1"]
IMG = "--container-image=lmsysorg/sglang:v0.5.23"


@pytest.mark.parametrize("argv, message", [
    (["--mpi=pmix", "true"], "unrecognized option '--mpi'"),
    (["--export=ALL", "true"], "unrecognized option '--export'"),
    (["-X", "true"], "invalid option -- 'X'"),
    (["--job-name"], "option '--job-name' requires an argument"),
    (["--overlap=yes", "true"], "option '--overlap' doesn't allow an argument"),
    (["--nodes=2", "--nodelist=n1", "true"], "--nodes=2 but --nodelist names 1"),
    (["--ntasks=3", "--nodelist=n1,n2", "true"], "--ntasks=3 with 2 node(s)"),
    (["--het-group=one", "true"], "Invalid hetjob component"),
    (["--het-group=2", "true"], "maximum value of 1"),
    (["--kill-on-bad-exit=2", "true"], "Invalid --kill-on-bad-exit"),
    (["--nodes=0", "true"], "Invalid --nodes"),
    ([*ONE], "No command given"),
    # the value of an option with an optional argument must be attached: "1" is the command
    (["--kill-on-bad-exit", "1", "true"], "No such file or directory: 1"),
])
def test_srun_rejects(fakes: Fakes, dirs: Path, argv: list[str], message: str) -> None:
    rejected(fakes, "srun", sub(argv, dirs), message)
    assert fakes.calls("srun")[-1]["ok"] is False


@pytest.mark.parametrize("argv, message", [
    (["--container-image=", "true"], "--container-image: argument required"),
    ([IMG, "--container-image=other/img:1", "true"], "--container-image specified multiple times"),
    (["--container-image=/nonexistent.sqsh", "true"], "is not a squashfs file"),
    (["--container-image=@/junk.sqsh", "true"], "is not a squashfs file"),
    (["--container-image=LMSys/SGLang:v1", "true"], "failed to import docker image"),
    ([IMG, "--container-mounts=@/src:relative", "true"],
     "mount target must be a relative path or an absolute path"),
    ([IMG, "--container-mounts=data:/data", "true"], "mount source must be a relative path"),
    # enroot's "," between flags splits pyxis entries: flags are joined with "+"
    ([IMG, "--container-mounts=@/src:/dst:ro,rprivate", "true"], "mount source must be"),
    ([IMG, "--container-mounts=@/src:/dst:readonly", "true"], "unknown mount option(s) readonly"),
    ([IMG, "--container-mounts=@/missing:/m", "true"], "No such file or directory"),
    ([IMG, "--container-mounts=:/m", "true"], "--container-mounts: invalid format"),
    ([IMG, "--container-mount-home", "--no-container-mount-home", "true"],
     "both --container-mount-home and --no-container-mount-home"),
    ([IMG, "--container-writable", "--container-readonly", "true"],
     "both --container-writable and --container-readonly"),
    ([IMG, "--container-writable=1", "true"], "doesn't allow an argument"),
    ([IMG, "--container-env=A,,B", "true"], "--container-env: invalid format"),
    ([IMG, "--container-unshare=pid", "true"], "unknown namespace 'pid'"),
    ([IMG, "--container-name=x:bogus", "true"], 'flag must be "auto"'),
    ([IMG, "--container-save=/tmp/dir/", "true"], "target is a directory"),
    ([IMG, "--container-workdir=@/missing", "true"], "working directory"),
    ([IMG, "--container-bogus=1", "true"], "unrecognized option '--container-bogus'"),
    (["--container-mounts=@/src:/src", "true"], "neither --container-image nor --container-name"),
])
def test_pyxis_rejects(fakes: Fakes, dirs: Path, argv: list[str], message: str) -> None:
    rejected(fakes, "srun", [*ONE, *sub(argv, dirs)], message)


def test_pyxis_accepts_its_grammar(fakes: Fakes, dirs: Path) -> None:
    accepted(fakes, "srun", [
        *ONE, IMG, f"--container-mounts={dirs}/src:/dst:ro+rprivate,{dirs}/work:{dirs}/work",
        f"--container-workdir={dirs}/work", "--no-container-mount-home", "--container-writable",
        "--container-env", "A,B", "--container-name=x:no_exec", "--container-unshare=net,uts",
        "true"])
    [srun] = fakes.calls("srun")
    assert srun["pyxis"]["mounts"] == [[f"{dirs}/src", "/dst", "x-create=auto,rbind,ro,rprivate"],
                                       [f"{dirs}/work", f"{dirs}/work", "x-create=auto,rbind"]]
    accepted(fakes, "srun", ["-N", "2", "-n2", "-w", "a,b", "-J", "x", "-K", "true"])
    accepted(fakes, "srun", ["--nodelist=node[01-03]", "--ntasks=3", "true"])


def test_srun_runs_one_task_per_node_with_slurm_variables(fakes: Fakes) -> None:
    r = accepted(fakes, "srun", ["--nodes=2", "--nodelist=a,b", "bash", "-c",
                                 'echo "$SLURMD_NODENAME $SLURM_NODEID $SLURM_PROCID '
                                 '$SLURM_STEP_ID $SLURM_JOB_ID"'])
    assert sorted(r.stdout.split("\n")[:2]) == ["a 0 0 0 4242", "b 1 1 0 4242"]


# ------------------------------------------------------------------------------------- enroot

@pytest.fixture
def created(fakes: Fakes, sqsh: Path) -> str:
    accepted(fakes, "enroot", ["create", "--name", "c1", str(sqsh)])
    return "c1"


@pytest.mark.parametrize("argv, message", [
    (["start", "--net", "c1", "true"], "Usage: enroot start"),  # master only, not in 4.1.2
    (["start", "--pid", "c1", "true"], "Usage: enroot start"),
    (["start", "-rw", "c1", "true"], "Usage: enroot start"),  # short options never combine
    (["start", "--mount"], "Usage: enroot start"),
    (["start", "--mount=", "c1", "true"], "Usage: enroot start"),
    (["start", "--env", "", "c1", "true"], "Usage: enroot start"),
    (["start", "nope", "true"], "No such file or directory"),
    (["start", "a/b", "true"], "Invalid argument: a/b"),
    (["start"], "Usage: enroot start"),
    # "ro" in the third field is the file-system type: enroot-mount makes it a plain ro mount
    (["start", "--mount", "@/src:/dst:ro", "c1", "true"], "no bind/rbind option"),
    (["start", "--mount", "@/src:/dst:none:rbind", "c1", "true"], "add x-create=auto"),
    (["start", "--mount", "@/src:/dst:none:x-create=auto,rbind,readonly", "c1", "true"],
     "unknown mount option(s) readonly"),
    (["start", "--mount", "@/src:/dst:ext4:defaults", "c1", "true"], "file-system type 'ext4'"),
    (["start", "--mount", "@/my src:/dst", "c1", "true"], "Invalid argument: "),
    (["start", "-m", "@/missing:/m", "c1", "true"], "No such file or directory"),
    (["start", "-e", "1BAD", "c1", "true"], "Invalid argument: 1BAD"),
    (["start", "--rc", "@/missing.sh", "c1", "true"], "No such file or directory"),
    # options after NAME are the command's: enroot runs "--rw", which does not exist
    (["start", "c1", "--rw", "true"], "failed to execute: --rw"),
    (["start", "c1"], "no command given"),
    (["create", "--name", "c1", "@/junk.sqsh"], "Invalid image format"),
    (["create", "@/missing.sqsh"], "No such file or directory"),
    (["create"], "Usage: enroot create"),
    (["create", "-n", "x/y", "@/images/sglang.sqsh"], "Invalid argument: x/y"),
    (["remove", "nope"], "No such file or directory"),
    (["remove"], "Usage: enroot remove"),
    (["remove", "--yes", "c1"], "Usage: enroot remove"),
    (["import", "lmsysorg/sglang:v0.5.23"], "Invalid argument: lmsysorg/sglang:v0.5.23"),
    (["import", "docker://LMSys/Bad Ref"], "Invalid image reference"),
    (["import", "-o"], "Usage: enroot import"),
    (["import", "-o", "@/junk.sqsh", "docker://a/b:1"], "File already exists"),
    (["import", "docker://a/b:1", "docker://c/d:2"], "Usage: enroot import"),
    (["frobnicate"], "Usage: enroot COMMAND"),
])
def test_enroot_rejects(fakes: Fakes, dirs: Path, created: str, argv: list[str],
                        message: str) -> None:
    rejected(fakes, "enroot", sub(argv, dirs), message)


def test_enroot_create_twice_and_force(fakes: Fakes, sqsh: Path, created: str) -> None:
    rejected(fakes, "enroot", ["create", "--name", created, str(sqsh)], "File already exists")
    accepted(fakes, "enroot", ["create", "-f", "--name", created, str(sqsh)])
    accepted(fakes, "enroot", ["create", str(sqsh)])  # name defaults to the file's stem
    assert sorted(p.name for p in fakes.data.iterdir()) == ["c1", "sglang"]


def test_enroot_remove_prompts_without_force(fakes: Fakes, created: str) -> None:
    # enroot asks for confirmation on stdin; in a batch task stdin is empty and the read fails
    rejected(fakes, "enroot", ["remove", created], "Do you really want to delete")
    assert (fakes.data / created).is_dir()
    accepted(fakes, "enroot", ["remove", "--force", created])
    assert not (fakes.data / created).exists()
    rejected(fakes, "enroot", ["remove", "--force", created], "No such file or directory")


def test_enroot_remove_of_a_running_container_is_refused(fakes: Fakes, created: str) -> None:
    p = fakes.popen(["enroot", "start", created, "sleep", "30"])
    try:
        time.sleep(0.5)
        rejected(fakes, "enroot", ["remove", "-f", created], "while its container still runs")
    finally:
        p.kill()
        p.wait()
    accepted(fakes, "enroot", ["remove", "-f", created])


def test_enroot_start_environment_is_the_images_plus_named(fakes: Fakes, created: str) -> None:
    fakes.image_env({"FROM_IMAGE": "1", "SHARED": "image"})
    r = fakes.run(["enroot", "start", "--rw", "-e", "SHARED", "--env=SET=x", created, "bash",
                   "-c", 'echo "$FROM_IMAGE ${SHARED-} ${SET-} ${HOST_ONLY-unset} $PWD"'],
                  env={"SHARED": "host", "HOST_ONLY": "h"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "host", "x", "unset", "/"]


def test_enroot_needs_a_data_path(fakes: Fakes, sqsh: Path) -> None:
    env = dict(fakes.env)
    del env["ENROOT_DATA_PATH"]
    r = subprocess.run(["enroot", "create", str(sqsh)], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "ENROOT_DATA_PATH must be set" in r.stderr


# ---------------------------------------------------------------------------------- apptainer

@pytest.mark.parametrize("argv, message", [
    # flags after the image belong to the command: apptainer runs "--bind"
    (["exec", "@/img.sif", "--bind", "@/src:/src", "true"],
     '"--bind": executable file not found'),
    (["exec", "--gpu", "@/img.sif", "true"], "unknown flag: --gpu"),
    (["exec", "-Z", "@/img.sif", "true"], "unknown shorthand flag: 'Z'"),
    (["exec", "--bind", "@/src:/src:readonly", "@/img.sif", "true"],
     "readonly is not a valid bind option"),
    (["exec", "--bind", "@/src:/a:ro:x", "@/img.sif", "true"], "bad bind syntax"),
    (["exec", "--bind", "@/missing:/m", "@/img.sif", "true"], "mount source"),
    (["exec", "@/img.sif"], "requires at least 2 arg(s)"),
    (["exec", "--bind"], "flag needs an argument: --bind"),
    (["exec", "@/missing.sif", "true"], "could not open image"),
    (["exec", "--nv=maybe", "@/img.sif", "true"], 'invalid argument "maybe"'),
    (["exec", "foo://x", "true"], "Unsupported transport type: foo"),
    (["exec", "--pwd", "@/missing", "@/img.sif", "true"], "could not set working directory"),
    (["exec", "--env", "NOVALUE", "@/img.sif", "true"], "is not KEY=VALUE"),
    (["run", "@/img.sif"], "run is not emulated"),
    (["bogus"], 'unknown command "bogus"'),
])
def test_apptainer_rejects(fakes: Fakes, dirs: Path, argv: list[str], message: str) -> None:
    rejected(fakes, "apptainer", sub(argv, dirs), message)


def test_apptainer_accepts_its_grammar(fakes: Fakes, dirs: Path) -> None:
    fakes.image_env({"FROM_IMAGE": "1", "SHARED": "image"})
    r = fakes.run(["apptainer", "-q", "exec", "--nv", "-B", f"{dirs}/src:/a,{dirs}/dst:/b:ro",
                   f"--bind={dirs}/work", "--pwd", f"{dirs}/work", "--env", "SET=x",
                   f"{dirs}/img.sif", "bash", "-c",
                   'echo "$FROM_IMAGE $SHARED $FORCED $SET ${HOST_ONLY-unset} $PWD"'],
                  env={"SHARED": "host", "APPTAINERENV_FORCED": "f", "HOST_ONLY": "h"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "image", "f", "x", "h", f"{dirs}/work"]
    [c] = fakes.calls("apptainer")
    assert c["binds"] == [[f"{dirs}/src", "/a", []], [f"{dirs}/dst", "/b", ["ro"]],
                          [f"{dirs}/work", f"{dirs}/work", []]]
    accepted(fakes, "apptainer", ["exec", "docker://lmsysorg/sglang:v0.5.23", "true"])
    r = fakes.run(["apptainer", "exec", "-e", f"{dirs}/img.sif", "bash", "-c",
                   'echo "${HOST_ONLY-unset}"'], env={"HOST_ONLY": "h"})
    assert r.stdout.strip() == "unset"  # --cleanenv
