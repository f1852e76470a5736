"""The rendered steps run for real under the strict stand-ins: srun+pyxis, enroot, apptainer.

Each test renders examples/demo.yaml for one runtime into a job directory, gives the instances
their node tables (as the runtime would after discovery) and runs steps/<name>.sh with
NODELIST set. The stand-ins check every command line and then run the inner command here, so the
launch scripts really execute and the python3 stub records the engine's argv and environment.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ctkit import LOW_MEMLOCK, NODES, USER, Fakes, write_job, write_sif

IMAGE_ENV = {"NCCL_SOCKET_IFNAME": "docker0", "NCCL_DEBUG": "WARN",
             "HPCSERVE_TEST_FROM_HOST": "image"}
HOST_ENV = {"NCCL_DEBUG": "INFO", "HPCSERVE_TEST_FROM_HOST": "host"}


def run_step(fakes: Fakes, job: Path, name: str, env: dict | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess:
    return fakes.run(["bash", str(job / "steps" / f"{name}.sh")], low_memlock=True,
                     env={"NODELIST": ",".join(NODES[name]), **HOST_ENV, **(env or {})},
                     timeout=timeout)


def start_step(fakes: Fakes, job: Path, name: str, env: dict | None = None) -> subprocess.Popen:
    return fakes.popen(["bash", str(job / "steps" / f"{name}.sh")], low_memlock=True,
                       env={"NODELIST": ",".join(NODES[name]), **HOST_ENV, **(env or {})})


def wait_for(pred, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def by_node(calls: list[dict]) -> dict[str, dict]:
    return {c["node"]: c for c in calls}


def arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def assert_engines_ran(fakes: Fakes, job: Path, name: str = "decode-0") -> dict[str, dict]:
    engines = by_node([c for c in fakes.calls("engine")
                       if c["argv"][0].endswith("hpcserve_sim.py")])
    assert sorted(engines) == sorted(NODES[name])
    for rank, node in enumerate(NODES[name]):
        e = engines[node]
        assert e["argv"][0] == f"{job}/hpcserve_sim.py"
        assert arg(e["argv"], "--node-rank") == str(rank)
        assert arg(e["argv"], "--host") == f"127.0.0.{rank + 1}"
        assert arg(e["argv"], "--dist-init-addr") == "127.0.0.1:5757"
        # the launch script's own exports win over the image's value in every runtime
        assert e["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
        assert e["env"]["SGLANG_HOST_IP"] == f"127.0.0.{rank + 1}"
    return engines


def assert_memlock_raised(engine: dict) -> None:
    soft, hard = engine["memlock"]
    _, test_hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert soft == hard
    if test_hard == resource.RLIM_INFINITY or test_hard > LOW_MEMLOCK:
        assert soft != LOW_MEMLOCK


# ------------------------------------------------------------------------------------- pyxis

def import_as_the_runtime_does(fakes: Fakes, job: Path) -> str:
    """What the runtime runs once per pyxis job before any step: plan.json's import."""
    imp = json.loads((job / "plan.json").read_text())["container"]["import"]
    r = fakes.run(["bash", imp["helper"], imp["uri"], imp["sqsh"]])
    assert r.returncode == 0, r.stderr
    assert [c["uri"] for c in enroot_calls(fakes, "import")] == [imp["uri"]]
    return imp["sqsh"]


def test_pyxis_step(tmp_path: Path, fakes: Fakes) -> None:
    lustre = tmp_path / "lustre"
    lustre.mkdir()
    job = write_job(tmp_path, ["site.container.runtime=pyxis",
                               "site.container.image=lmsysorg/sglang:v0.5.23",
                               f"site.container.mounts=[{lustre}:{lustre}]",
                               "site.container.env=[NCCL_DEBUG]"])
    fakes.image_env(IMAGE_ENV)
    # without the image imported, pyxis has nothing to start from
    r = run_step(fakes, job, "decode-0")
    assert r.returncode != 0 and "is not a squashfs file" in r.stderr, r.stderr
    sqsh = import_as_the_runtime_does(fakes, job)
    r = run_step(fakes, job, "decode-0")
    assert r.returncode == 0, r.stderr
    [srun] = [c for c in fakes.calls("srun") if c["ok"]]
    assert srun["container"] and srun["nodes"] == ["nodeA", "nodeB"]
    px = srun["pyxis"]
    assert px["image"] == sqsh  # the squashfs imported once, not the registry on every node
    assert px["mounts"] == [[str(lustre), str(lustre), "x-create=auto,rbind"],
                            [str(job), str(job), "x-create=auto,rbind"],
                            [str(tmp_path / "model"), str(tmp_path / "model"),
                             "x-create=auto,rbind,ro"]]
    assert px["workdir"] == str(job)
    assert px["flags"] == {"mount_home": 0, "writable": 1}
    assert px["env"] == ["NCCL_DEBUG", "HPCSERVE_API_KEY"]  # the deployment's key: the host's
    assert srun["command"][:3] == ["bash", f"{job}/launch/container-task.sh", "decode-0"]
    for node, e in assert_engines_ran(fakes, job).items():
        assert e["env"]["NCCL_DEBUG"] == "INFO"  # named in --container-env: the host's value
        assert e["env"]["HPCSERVE_TEST_FROM_HOST"] == "image"  # not named: the image wins
        assert e["env"]["SLURMD_NODENAME"] == node
        assert e["cwd"] == str(job)
        assert_memlock_raised(e)


# --------------------------------------------------------------------------------- apptainer

def test_apptainer_step(tmp_path: Path, fakes: Fakes) -> None:
    sif = tmp_path / "images" / "sglang.sif"
    sif.parent.mkdir()
    write_sif(sif)
    shared = tmp_path / "shared"
    shared.mkdir()
    job = write_job(tmp_path, ["site.container.runtime=apptainer", f"site.container.image={sif}",
                               f"site.container.mounts=[{shared}:{shared}:ro]",
                               "site.container.env=[NCCL_DEBUG]"])
    fakes.image_env(IMAGE_ENV)
    r = run_step(fakes, job, "decode-0")
    assert r.returncode == 0, r.stderr
    calls = fakes.calls("apptainer")
    assert len(calls) == 2 and all(c["ok"] for c in calls)
    for c in calls:
        assert c["image"] == str(sif) and c["nv"] and c["cwd"] == str(job)
        assert c["binds"] == [[str(shared), str(shared), ["ro"]], [str(job), str(job), []],
                              [str(tmp_path / "model"), str(tmp_path / "model"), ["ro"]]]
        assert c["command"] == ["bash", f"{job}/launch/decode-0.sh"]
    for node, e in assert_engines_ran(fakes, job).items():
        assert e["env"]["NCCL_DEBUG"] == "INFO"  # APPTAINERENV_NCCL_DEBUG from container.env
        assert e["env"]["HPCSERVE_TEST_FROM_HOST"] == "image"
        assert e["env"]["SLURMD_NODENAME"] == node  # the host environment passes through
        assert e["cwd"] == str(job)
        assert_memlock_raised(e)


# ------------------------------------------------------------------------------------ enroot

def enroot_job(tmp_path: Path, image: Path | str, extra: list[str] = ()) -> Path:
    return write_job(tmp_path, ["site.container.runtime=enroot", f"site.container.image={image}",
                                "site.container.env=[NCCL_DEBUG]", *extra])


def enroot_calls(fakes: Fakes, sub: str) -> list[dict]:
    return [c for c in fakes.calls("enroot") if c["argv"][0] == sub]


def assert_all_removed(fakes: Fakes, job: Path) -> None:
    assert not fakes.data.exists() or not any(fakes.data.iterdir())
    assert not any((job / "run" / "containers").iterdir())


def test_enroot_step(tmp_path: Path, fakes: Fakes, sqsh: Path) -> None:
    job = enroot_job(tmp_path, sqsh)
    fakes.image_env(IMAGE_ENV)
    r = run_step(fakes, job, "decode-0")
    assert r.returncode == 0, r.stderr
    creates, starts, removes = (enroot_calls(fakes, s) for s in ("create", "start", "remove"))
    assert len(creates) == 2 and len(starts) == 2 and len(removes) == 2
    step = fakes.calls("srun")[0]["step"]
    names = {c["name"] for c in creates}
    assert names == {f"hpcserve-4242.{step}-decode-0.0-{n}" for n in NODES["decode-0"]}
    assert {c["name"] for c in starts} == names == {c["removed"] for c in removes}
    engines = assert_engines_ran(fakes, job)
    for s in starts:
        assert s["writable"] and s["mounts"] == [
            f"{job}:{job}:none:x-create=auto,rbind",
            f"{tmp_path / 'model'}:{tmp_path / 'model'}:none:x-create=auto,rbind,ro"]
        assert {"SLURMD_NODENAME", "SLURM_JOB_ID", "NCCL_DEBUG"} <= set(s["env_names"])
    for node, e in engines.items():
        [c] = [c for c in creates if c["name"].endswith(f"-{node}")]
        [rm] = [x for x in removes if x["removed"] == c["name"]]
        assert c["time"] < e["time"] < rm["time"]
        assert e["env"]["NCCL_DEBUG"] == "INFO"  # passed with --env
        assert e["env"]["HPCSERVE_TEST_FROM_HOST"] == "image"  # unnamed host values stay out
        assert e["env"]["SLURMD_NODENAME"] == node
        assert e["cwd"] == str(job)
        assert_memlock_raised(e)
    assert_all_removed(fakes, job)


def test_enroot_sigterm_stops_the_engine_then_removes(tmp_path: Path, fakes: Fakes,
                                                      sqsh: Path) -> None:
    job = enroot_job(tmp_path, sqsh)
    p = start_step(fakes, job, "decode-0", {"HPCSERVE_FAKE_ENGINE": "serve",
                                            "HPCSERVE_FAKE_ENGINE_STOP_SECONDS": "0.5"})
    wait_for(lambda: len(fakes.calls("engine")) == 2)
    p.send_signal(signal.SIGTERM)  # srun forwards it to every process of the step
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    stopped = fakes.calls("engine-signal")
    removes = enroot_calls(fakes, "remove")
    assert len(removes) == 2 and all(c["ok"] for c in removes)
    assert max(c["time"] for c in stopped) < min(c["time"] for c in removes)
    assert err.count("SIGTERM, stopping") == 2
    assert_all_removed(fakes, job)


def test_enroot_engine_ignoring_term_is_killed_and_removed(tmp_path: Path, fakes: Fakes,
                                                           sqsh: Path) -> None:
    # SGLang ranks >= 1 ignore TERM; the task kills them after its stop timeout (1 s for the
    # demo's signal_grace of 10 s) so that the container is still removed in time.
    job = enroot_job(tmp_path, sqsh)
    p = start_step(fakes, job, "decode-0", {"HPCSERVE_FAKE_ENGINE": "ignore-term"})
    wait_for(lambda: len(fakes.calls("engine")) == 2)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert time.monotonic() - t0 < 8
    assert len(enroot_calls(fakes, "remove")) == 2
    assert_all_removed(fakes, job)


def test_enroot_failed_node_kills_the_other_and_cleanup_removes_its_container(
        tmp_path: Path, fakes: Fakes, sqsh: Path) -> None:
    # nodeB's engine fails; srun --kill-on-bad-exit SIGKILLs nodeA's task before it can remove
    # its container. The marker in run/containers lets `container-task.sh --cleanup` find it.
    job = enroot_job(tmp_path, sqsh)
    r = run_step(fakes, job, "decode-0", {"HPCSERVE_FAKE_ENGINE": "serve",
                                          "HPCSERVE_FAKE_ENGINE_nodeB": "exit:3:1"})
    assert r.returncode != 0
    leftover = sorted(p.name for p in (job / "run" / "containers").iterdir())
    assert len(leftover) == 1 and leftover[0].endswith("-decode-0.0-nodeA")
    assert sorted(p.name for p in fakes.data.iterdir()) == leftover
    c = fakes.run(["srun", "--nodes=1", "--ntasks=1", "--nodelist=nodeA", "bash",
                   str(job / "launch" / "container-task.sh"), "--cleanup"])
    assert c.returncode == 0, c.stderr
    assert "removed leftover container" in c.stderr
    assert_all_removed(fakes, job)


def test_enroot_image_uri_is_imported_once(tmp_path: Path, fakes: Fakes, sqsh: Path) -> None:
    job = enroot_job(tmp_path, "lmsysorg/sglang:v0.5.23")
    cache = tmp_path / ".hpcserve-images" / USER / "lmsysorg+sglang+v0.5.23.sqsh"
    env = {"HPCSERVE_FAKE_ENROOT_IMPORT_SECONDS": "0.5"}
    r = run_step(fakes, job, "decode-0", env)  # two tasks race to import
    assert r.returncode == 0, r.stderr
    r = run_step(fakes, job, "prefill-0", env)
    assert r.returncode == 0, r.stderr
    imports = enroot_calls(fakes, "import")
    assert len(imports) == 1 and imports[0]["uri"] == "docker://lmsysorg/sglang:v0.5.23"
    assert {c["image"] for c in enroot_calls(fakes, "create")} == {str(cache)}
    assert subprocess.run(["unsquashfs", "-l", str(cache)], capture_output=True).returncode == 0
    assert len(fakes.calls("engine")) == 3
    assert_all_removed(fakes, job)


# -------------------------------------------------------------------------------------- none

def test_none_runs_the_launch_script_directly(tmp_path: Path, fakes: Fakes) -> None:
    job = write_job(tmp_path, [])
    r = run_step(fakes, job, "decode-0")
    assert r.returncode == 0, r.stderr
    [srun] = fakes.calls("srun")
    assert not srun["container"] and srun["command"] == ["bash", f"{job}/launch/decode-0.sh"]
    assert_engines_ran(fakes, job)
    assert not (job / "launch" / "container-task.sh").exists()


# ------------------------------------------------------------------------------------ router

@pytest.mark.parametrize("runtime", ["pyxis", "enroot", "apptainer", "none"])
def test_router_step(tmp_path: Path, fakes: Fakes, runtime: str, request) -> None:
    sets = [f"site.container.runtime={runtime}"]
    if runtime == "pyxis":
        sets.append("site.container.image=lmsysorg/sglang:v0.5.23")
    elif runtime == "enroot":
        sets.append(f"site.container.image={request.getfixturevalue('sqsh')}")
    elif runtime == "apptainer":
        sif = tmp_path / "sglang.sif"
        write_sif(sif)
        sets.append(f"site.container.image={sif}")
    job = write_job(tmp_path, sets)
    if runtime == "pyxis":
        import_as_the_runtime_does(fakes, job)
    r = run_step(fakes, job, "router")
    assert r.returncode == 0, r.stderr
    [router] = fakes.calls("engine")
    assert router["argv"][:2] == ["-m", "sglang_router.launch_router"]
    assert router["node"] == "nodeP"
    assert arg(router["argv"], "--decode") == "http://127.0.0.1:30000"
    if runtime == "enroot":
        assert [c["name"] for c in enroot_calls(fakes, "create")] == [
            "hpcserve-4242.0-router.0-nodeP"]
        assert_all_removed(fakes, job)


def test_enroot_sigterm_during_create_removes_the_partial_root_fs(tmp_path: Path, fakes: Fakes,
                                                                  sqsh: Path) -> None:
    job = enroot_job(tmp_path, sqsh)
    p = start_step(fakes, job, "decode-0", {"HPCSERVE_FAKE_ENROOT_CREATE_SECONDS": "30"})
    wait_for(lambda: len(enroot_calls(fakes, "create")) == 2)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert enroot_calls(fakes, "start") == [] and fakes.calls("engine") == []
    assert "enroot create of" in err and len(enroot_calls(fakes, "remove")) == 2
    assert_all_removed(fakes, job)


def test_enroot_create_failure_fails_the_task_and_leaves_nothing(tmp_path: Path,
                                                                 fakes: Fakes) -> None:
    junk = tmp_path / "junk.sqsh"
    junk.write_bytes(b"not squashfs")
    job = enroot_job(tmp_path, junk)
    r = run_step(fakes, job, "prefill-0")
    assert r.returncode == 1
    assert "Invalid image format" in r.stderr and "enroot create of" in r.stderr
    assert enroot_calls(fakes, "remove") == [] and fakes.calls("engine") == []
    assert_all_removed(fakes, job)
