"""Shared fixtures.

`dev_cluster`: one real 4-node Slurm cluster (hpcserve.devcluster) for the whole session, for tests
marked `slurm`; `slurm_env`: the environment that points Slurm's commands at it. On a failure in a
test that used it, the controller's and nodes' log tails are attached to the report.

How the suite runs side by side, and the per-tier timings it prints: tests/suiteplan.py.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import signal
import subprocess
import threading
from typing import Any, Callable, Iterator

import pytest

import suiteplan

# Each live pytest session holds one slot (an flock, released by the kernel even if pytest is
# killed). The slot picks the state dir, subnet and interface prefix, so two sessions on one machine
# never fight over names, and a session killed before its teardown leaves its leftovers at a fixed
# place where the next session in that slot finds (and removes) them.
_SLOTS = 8
_JOB_IDS = 1_000_000  # job ids per slot: each session's cluster gives out its own (FirstJobId)
_active_clusters: list[Any] = []
# The unprivileged user the test jobs run as (tests/jobs/jobkit.py's OWNER; scripts/setup.sh
# makes it)
JOBS_USER = "hpcserve-a"


def _slot_dir(slot: int) -> Any:
    """/tmp/hpcserve-pytest-<slot>, the session's own folder (its dev cluster's too), 0755 so
    that the test jobs' user may reach what is put there for them; refused where another user
    made it first or may write it."""
    import stat
    from pathlib import Path
    d = Path(f"/tmp/hpcserve-pytest-{slot}")
    d.mkdir(mode=0o755, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        pytest.fail(f"{d} is not this user's alone (owner uid {st.st_uid}, mode "
                    f"{st.st_mode & 0o7777:o}): remove it")
    d.chmod(0o755)
    return d


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Any:
    """The wheel `pip wheel` builds from the checkout, as a release would ship it: built once
    per run, by the first pytest-xdist worker that asks (the others wait on its lock, in the
    folder the run's workers share)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent   # this run's, above each worker's own
    with open(shared / "wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        base = shared / "wheel"
        built = sorted((base / "dist").glob("hpcserve-*.whl"))
        if not built:
            _build_wheel(base)
            built = sorted((base / "dist").glob("hpcserve-*.whl"))
    (wheel,) = built
    return wheel


def _build_wheel(base: Any) -> None:
    import shutil
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    shutil.rmtree(base, ignore_errors=True)   # a build that failed half-way
    # From a copy without build outputs: setuptools puts a stale build/lib/ (a module removed
    # since) into the wheel whole.
    src = base / "src"
    outputs = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "jobs",
                                     ".pytest_cache")

    def ignore(d: str, names: list[str]) -> set[str]:
        return {n for n in names if n == "__pycache__"} | (
            outputs(d, names) if Path(d) == root else set())

    shutil.copytree(root, src, symlinks=True, ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(base / "dist"), str(src)], check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="session")
def installed_wheel(built_wheel, devcluster_slot) -> Any:
    """The install users do: the wheel installed with pip (and the `dev` extra, the local
    cluster's routers) into a fresh venv of the system's python3, outside the checkout, where
    the test jobs' unprivileged user may run it too. The venv's bin/ directory."""
    import shutil
    venv = _slot_dir(devcluster_slot) / "installed-wheel"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{built_wheel}[dev]"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return venv / "bin"


@pytest.fixture(scope="session")
def owners_hpcserve(built_wheel, site_python, devcluster_slot) -> Any:
    """argv of `hpcserve` as the test jobs' user runs it (tests/jobs/jobkit.py's OWNER, with
    their own HOME): the wheel's package over the site's python, which has its dependencies,
    in a directory they may read. The tests' operator commands on that user's jobs run so,
    as its owner: hpcserve refuses another user's job, root's too."""
    import pwd
    import shutil
    owner = JOBS_USER
    target = _slot_dir(devcluster_slot) / "owners-hpcserve"
    shutil.rmtree(target, ignore_errors=True)
    # compiled, as pip does by default: the user cannot write __pycache__ there, and would
    # compile every module at each command
    r = subprocess.run([str(site_python / "bin" / "python3"), "-m", "pip", "install", "-q",
                        "--no-deps", "--disable-pip-version-check", "--target",
                        str(target), str(built_wheel)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for d, dirs, files in os.walk(target):
        for n in [d, *(os.path.join(d, f) for f in dirs + files)]:
            os.chmod(n, os.stat(n).st_mode | 0o444 | (0o111 if os.path.isdir(n) else 0))
    return ["runuser", "-u", owner, "--", "env", f"HOME={pwd.getpwnam(owner).pw_dir}",
            f"PYTHONPATH={target}",
            str(site_python / "bin" / "python3"), "-m", "hpcserve"]


@pytest.fixture(scope="session")
def site_python() -> Any:
    """The python a site gives every user of its nodes (scripts/setup-site-python.sh: the
    system's, with the routers, mpi4py and PyYAML), which the test jobs run with: they run as
    an unprivileged user, who cannot run the project venv's python where that lies in root's
    home (pyenv's, as on CI). The venv's directory."""
    import pwd
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "scripts" / "setup-site-python.sh"
    r = subprocess.run([str(script)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    venv = Path(r.stdout.strip().splitlines()[-1])
    owner = JOBS_USER
    assert subprocess.run(["id", "-u", owner], capture_output=True).returncode == 0, (
        f"no user {owner}: run scripts/setup.sh as root, which makes the test jobs' user")
    r = subprocess.run(["runuser", "-u", owner, "--", str(venv / "bin" / "python3"), "-c",
                        "import sglang_router, vllm_router, mpi4py, yaml"], cwd="/",
                       capture_output=True, text=True, env={"HOME": pwd.getpwnam(owner).pw_dir,
                                                            "PATH": "/usr/sbin:/usr/bin:/bin"})
    assert r.returncode == 0, (f"{owner} cannot run {venv}", r.stderr)
    return venv


@pytest.fixture(scope="session")
def devcluster_slot() -> Iterator[int]:
    """A small integer no other live pytest session on this machine holds."""
    for k in range(_SLOTS):
        fh = open(f"/tmp/hpcserve-pytest-slot{k}.lock", "w")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            continue
        try:
            yield k
        finally:
            fh.close()
        return
    pytest.fail(f"all {_SLOTS} dev-cluster slots are held by other pytest sessions")


@pytest.fixture(scope="session")
def devcluster_subnet(devcluster_slot: int) -> Callable[[int], str]:
    """subnet(second_octet) -> a /24 under 10.<second_octet>.0.0/16 that no interface here uses.

    Each slot draws from its own third octets (slot, slot+8, ...), so concurrent sessions never pick
    the same one, and a subnet some other cluster on this machine already took is skipped.
    """

    def pick(octet: int) -> str:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                             check=True).stdout
        used = [ipaddress.ip_interface(f.split()[3]).network for f in out.splitlines() if " inet " in f]
        for third in range(devcluster_slot, 256, _SLOTS):
            net = ipaddress.ip_network(f"10.{octet}.{third}.0/24")
            if not any(net.overlaps(u) for u in used):
                return str(net)
        pytest.fail(f"no free /24 left in 10.{octet}.0.0/16 for the dev cluster")

    return pick


@pytest.fixture(scope="session")
def dev_cluster(devcluster_slot: int, devcluster_subnet: Callable[[int], str]) -> Iterator[Any]:
    """A real 4-node Slurm cluster (partition `local`) on a free 10.251.x.0/24, up for the session."""
    from hpcserve.devcluster.cluster import DevCluster

    # A short fixed path, not tmp_path: pmix puts unix sockets under it (108-byte limit), and a
    # killed session's leftovers must be findable by the next one.
    state_dir = f"/tmp/hpcserve-pytest-{devcluster_slot}/cluster"
    # Leftovers of a session in this slot that died before its teardown: start from nothing (before
    # picking a subnet, so their bridge does not count as taken).
    DevCluster(state_dir).down()
    cluster = DevCluster(state_dir, nodes=4, subnet=devcluster_subnet(251),
                         prefix=f"hst{devcluster_slot}",
                         job_ids=range(1 + devcluster_slot * _JOB_IDS,
                                       1 + (devcluster_slot + 1) * _JOB_IDS))
    # `timeout pytest ...` ends pytest with SIGTERM, which skips fixture teardown and would leave the
    # cluster running; as KeyboardInterrupt, pytest still tears its session fixtures down.
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        cluster.up()
        _active_clusters.append(cluster)
        yield cluster
    finally:
        if cluster in _active_clusters:
            _active_clusters.remove(cluster)
        cluster.down()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture
def slurm_env(dev_cluster: Any) -> dict[str, str]:
    """os.environ + SLURM_CONF of the session's cluster, for subprocess(env=...)."""
    return dev_cluster.client_env()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and _active_clusters and "dev_cluster" in getattr(item, "fixturenames", ()):
        report.sections.append(("dev cluster logs (tail)", _active_clusters[-1].log_tail()))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    suiteplan.order_and_group(items)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sums up
        config.pluginmanager.register(suiteplan.TierClock(), "hpcserve-tier-clock")
