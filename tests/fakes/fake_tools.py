"""Strict stand-ins for srun + pyxis, enroot and apptainer, and a stub engine.

Each tool checks its command line against the real tool's grammar (as read in pyxis 0.24.0
`args.c`, enroot 4.1.2 `enroot.in`/`src/runtime.sh`/`bin/enroot-mount.c`, apptainer 1.5.3
`cmd/internal/cli/action_flags.go`/`pkg/runtime/engine/apptainer/config/bind.go`; see
/work/shared/reference/engines.md section F), rejects what the real one rejects with the same
message where it has one, and otherwise runs the inner command on this host, so the launch scripts
really execute. A few checks go further than the real tool where the real tool would silently do
the wrong thing for hpcserve; their messages start with "stricter than ...".

Every invocation is appended as one JSON line to $HPCSERVE_FAKE_LOG: {"tool", "argv", "ok", ...}.

Emulated container semantics (what hpcserve relies on):
- pyxis: the host environment passes in, the image's values (from $HPCSERVE_FAKE_IMAGE_ENV, a JSON
  object file) win except for names in --container-env; the task starts in --container-workdir.
- enroot start: the environment is cleared and holds only the image's variables, TERM, HOME and
  the --env ones (enroot-switchroot's clearenv); PATH is the image's or, when the fake image has
  none, the host's (the host is the "image" here). The command starts in "/".
- apptainer exec: the host environment passes in, the image's values win, APPTAINERENV_X sets X.
Variables named HPCSERVE_FAKE_* are test plumbing and pass into every container.

Run as `fake_tools.py TOOL ARGS...`; tests/fakes/bin/{srun,enroot,apptainer} and
tests/fakes/engine/python3 are the executable shims.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ARGV: list[str] = []  # the tool's whole command line, for the log


# --------------------------------------------------------------------------------------- common

class Fail(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.message = message
        self.code = code


def log(tool: str, ok: bool, **extra) -> None:
    path = os.environ.get("HPCSERVE_FAKE_LOG")
    if not path:
        return
    rec = {"tool": tool, "argv": ARGV, "ok": ok, "pid": os.getpid(), "time": time.time(), **extra}
    line = (json.dumps(rec) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def image_env() -> dict[str, str]:
    path = os.environ.get("HPCSERVE_FAKE_IMAGE_ENV")
    if not path:
        return {}
    with open(path, encoding="utf-8") as f:
        return {str(k): str(v) for k, v in json.load(f).items()}


def plumbing(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("HPCSERVE_FAKE_")}


def is_squashfs(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"hsqs"
    except OSError:
        return False


def parse_long(arg: str, table: dict[str, str], argv: list[str], i: int, what: str
               ) -> tuple[str, str | None, int]:
    """getopt_long for one --name[=value] word; table: name -> 'req' | 'none' | 'opt'."""
    name, eq, val = arg[2:].partition("=")
    kind = table.get(name)
    if kind is None:
        raise Fail(f"{what}: unrecognized option '--{name}'")
    if kind == "none":
        if eq:
            raise Fail(f"{what}: option '--{name}' doesn't allow an argument")
        return name, None, i + 1
    if kind == "opt":
        return name, (val if eq else None), i + 1
    if eq:
        return name, val, i + 1
    if i + 1 >= len(argv):
        raise Fail(f"{what}: option '--{name}' requires an argument")
    return name, argv[i + 1], i + 2


def session_pids(sid: int) -> list[int]:
    """Every process of session `sid`: how the fake srun stands in for the step's cgroup."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(d))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


# ------------------------------------------------------------------------------- srun + pyxis

SRUN_LONG = {"het-group": "req", "nodes": "req", "ntasks": "req", "ntasks-per-node": "req",
             "nodelist": "req", "overlap": "none", "job-name": "req", "kill-on-bad-exit": "opt",
             "wait": "req"}
SRUN_SHORT = {"N": ("nodes", "req"), "n": ("ntasks", "req"), "w": ("nodelist", "req"),
              "J": ("job-name", "req"), "K": ("kill-on-bad-exit", "opt"), "W": ("wait", "req")}
# pyxis 0.24.0 args.c spank_opts: has_arg 1 -> required argument, 0 -> none.
PYXIS_LONG = {
    "container-image": "req", "container-mounts": "req", "container-workdir": "req",
    "container-name": "req", "container-save": "req", "container-mount-home": "none",
    "no-container-mount-home": "none", "container-remap-root": "none",
    "no-container-remap-root": "none", "container-entrypoint": "none",
    "no-container-entrypoint": "none", "container-entrypoint-log": "none",
    "container-writable": "none", "container-readonly": "none", "container-env": "req",
    "container-unshare": "req"}

# enroot-mount's mount_opts table (bin/enroot-mount.c): anything else would go to mount(2) as data.
MOUNT_OPTS = {
    "async", "atime", "bind", "defaults", "dev", "diratime", "dirsync", "exec", "iversion",
    "loud", "mand", "noatime", "nodev", "nodiratime", "noexec", "noiversion", "nomand",
    "norelatime", "nostrictatime", "nosuid", "private", "rbind", "relatime", "remount", "ro",
    "rprivate", "rshared", "rslave", "runbindable", "rw", "shared", "silent", "slave",
    "strictatime", "suid", "sync", "unbindable", "lazytime", "nolazytime", "auto", "group",
    "noauto", "nofail", "nogroup", "noowner", "nouser", "nousers", "owner", "user", "users",
    "x-create=dir", "x-create=file", "x-create=auto", "x-move", "x-detach"}

DOCKER_REF = re.compile(
    r"(?:[A-Za-z0-9._-]+@)?(?:[A-Za-z0-9.-]+(?::\d+)?#)?"
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?\Z")


def expand_hostlist(s: str) -> list[str]:
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", s):
        m = re.fullmatch(r"(.*)\[([^\]]*)\]", part)
        if not m:
            out.append(part)
            continue
        for rng in m.group(2).split(","):
            a, _, b = rng.partition("-")
            for k in range(int(a), int(b or a) + 1):
                out.append(f"{m.group(1)}{k:0{len(a)}d}")
    return out


def check_fstab_mount(spec: str, what: str) -> None:
    """What enroot-mount would do with a (colon-split) fstab entry for a bind mount."""
    fields = spec.split(":")
    fsname, mdir = fields[0], fields[1] if len(fields) > 1 else ""
    mtype = fields[2] if len(fields) > 2 else ""
    opts = fields[3] if len(fields) > 3 else ""

    def ismntopt(s: str) -> bool:
        return "," in s or s in MOUNT_OPTS

    if mdir and not mtype and not opts and ismntopt(mdir):
        opts, mtype, mdir = mdir, "none", ""
    if mtype and not opts and ismntopt(mtype):
        opts, mtype = mtype, "none"
    if fsname == "tmpfs":
        return
    if not fsname.startswith(("/", ".")):
        raise Fail(f"{what}: unsupported mount source {fsname!r} in {spec!r}")
    if not mdir:
        mdir = fsname
    if not mtype or mtype == "none":
        mtype = "none"
        opts = opts or "rbind,x-create=auto"
    if mtype != "none":
        raise Fail(f"{what}: failed to mount: {fsname} at {mdir} (file-system type {mtype!r}; "
                   f"a bind mount's fstab type is none)")
    olist = [o for o in opts.split(",") if o]
    unknown = [o for o in olist if o not in MOUNT_OPTS]
    if unknown:
        raise Fail(f"{what}: failed to mount: {fsname} at {mdir} (unknown mount option(s) "
                   f"{','.join(unknown)} passed to mount(2))")
    if "bind" not in olist and "rbind" not in olist:
        raise Fail(f"{what}: failed to mount: {fsname} at {mdir} (no bind/rbind option: "
                   f"mount(2) of type none)")
    if not os.path.exists(fsname):
        raise Fail(f"{what}: failed to mount: {fsname} at {mdir}: No such file or directory")
    if not any(o.startswith("x-create=") for o in olist):
        raise Fail(f"{what}: stricter than enroot: {mdir} need not exist in the image; "
                   "add x-create=auto")


class Pyxis:
    def __init__(self) -> None:
        self.image: str | None = None
        self.mounts: list[tuple[str, str, str]] = []
        self.workdir: str | None = None
        self.name: str | None = None
        self.save: str | None = None
        self.flags: dict[str, int] = {}
        self.env: list[str] = []
        self.unshare: set[str] = set()
        self.given: list[str] = []

    def _once(self, attr: str, opt: str, value: str) -> None:
        if not value:
            raise Fail(f"pyxis: --{opt}: argument required")
        cur = getattr(self, attr)
        if cur is not None and cur != value:
            raise Fail(f"pyxis: --{opt} specified multiple times")
        setattr(self, attr, value)

    def _bool(self, key: str, val: int, both: str) -> None:
        if key in self.flags and self.flags[key] != val:
            raise Fail(f"pyxis: both {both} were specified")
        self.flags[key] = val

    def option(self, name: str, value: str | None) -> None:
        self.given.append(name)
        if name == "container-image":
            self._once("image", name, value or "")
        elif name == "container-mounts":
            if not value:
                raise Fail("pyxis: --container-mounts: argument required")
            for entry in value.split(","):
                self._mount(entry)
        elif name == "container-workdir":
            self._once("workdir", name, value or "")
        elif name == "container-name":
            n, _, fl = (value or "").partition(":")
            if not n:
                raise Fail("pyxis: --container-name: empty name" if value
                           else "pyxis: --container-name: argument required")
            if fl and fl not in ("auto", "create", "exec", "no_exec"):
                raise Fail('pyxis: --container-name: flag must be "auto", "create", "exec" or '
                           '"no_exec"')
            self._once("name", name, n)
        elif name == "container-save":
            if value and value.endswith("/"):
                raise Fail("pyxis: --container-save: target is a directory")
            self._once("save", name, value or "")
        elif name in ("container-mount-home", "no-container-mount-home"):
            self._bool("mount_home", int(not name.startswith("no-")),
                       "--container-mount-home and --no-container-mount-home")
        elif name in ("container-remap-root", "no-container-remap-root"):
            self._bool("remap_root", int(not name.startswith("no-")),
                       "--container-remap-root and --no-container-remap-root")
        elif name in ("container-entrypoint", "no-container-entrypoint"):
            self._bool("entrypoint", int(not name.startswith("no-")),
                       "--container-entrypoint and --no-container-entrypoint")
        elif name == "container-entrypoint-log":
            self.flags["entrypoint_log"] = 1
        elif name in ("container-writable", "container-readonly"):
            self._bool("writable", int(name == "container-writable"),
                       "--container-writable and --container-readonly")
        elif name == "container-env":
            if not value:
                raise Fail("pyxis: --container-env: argument required")
            for n in value.split(","):
                if not n:
                    raise Fail(f"pyxis: --container-env: invalid format: {value}")
                if n not in self.env:
                    self.env.append(n)
        elif name == "container-unshare":
            if not value:
                raise Fail("pyxis: --container-unshare: argument required")
            for ns in value.split(","):
                if not ns:
                    raise Fail("pyxis: --container-unshare: empty namespace argument")
                if ns not in ("net", "ipc", "uts"):
                    raise Fail(f"pyxis: --container-unshare: unknown namespace '{ns}'")
                self.unshare.add(ns)

    def _mount(self, entry: str) -> None:
        src, sep, rest = entry.partition(":")
        if not src:
            raise Fail(f"pyxis: --container-mounts: invalid format: {entry}")
        dst, flags = src, None
        if sep:
            dst, _, flags = rest.partition(":")
            if not dst:
                raise Fail(f"pyxis: --container-mounts: invalid format: {entry}")
            flags = flags.replace("+", ",") or None
        if src.startswith((".", "/")):
            default = "x-create=auto,rbind"
        elif src == "tmpfs":
            default = "x-create=dir"
        elif src == "umount":
            default = "x-detach"
        else:
            raise Fail('pyxis: mount source must be a relative path, an absolute path, "tmpfs" '
                       'or "umount"')
        if not dst.startswith((".", "/")):
            raise Fail("pyxis: mount target must be a relative path or an absolute path")
        opts = default + ("," + flags if flags else "")
        if src.startswith((".", "/")):
            check_fstab_mount(f"{src}:{dst}:none:{opts}", "pyxis (enroot-mount)")
        self.mounts.append((src, dst, opts))

    def check(self) -> bool:
        if self.image is None and self.name is None:
            if self.given:
                raise Fail("stricter than pyxis: pyxis would ignore " +
                           ", ".join("--" + g for g in self.given) +
                           " because neither --container-image nor --container-name is set, "
                           "and run the task outside any container")
            return False
        if self.image is not None:
            if self.image.startswith(("/", ".")):
                if not os.path.isfile(self.image) or not is_squashfs(self.image):
                    raise Fail(f"pyxis: failed to create container filesystem: {self.image} is "
                               "not a squashfs file")
            else:
                ref = self.image.split("://", 1)[1] if self.image.startswith(
                    ("docker://", "dockerd://")) else self.image
                if not DOCKER_REF.match(ref):
                    raise Fail(f"pyxis: failed to import docker image: {self.image}")
        if self.workdir is not None and not os.path.isdir(self.workdir):
            raise Fail(f"pyxis: couldn't start container: working directory {self.workdir} "
                       "does not exist")
        return True

    def task_env(self, host: dict[str, str]) -> dict[str, str]:
        env = dict(host)
        for k in ("LANG", "LANGUAGE", "LC_ALL"):
            if k not in self.env:
                env.pop(k, None)
        for k, v in image_env().items():
            if k in self.env and k in host:
                continue
            env[k] = v
        env.update(plumbing(host))
        return env


def next_step_id() -> int:
    path = os.environ.get("HPCSERVE_FAKE_LOG")
    if not path:
        return os.getpid()
    with open(path + ".stepid", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read().strip() or "0")
        f.seek(0)
        f.truncate()
        f.write(str(n + 1))
        return n


def srun(argv: list[str]) -> int:
    opts: dict[str, str | None] = {}
    pyxis = Pyxis()
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a.startswith("--"):
            name = a[2:].partition("=")[0]
            if name in PYXIS_LONG:
                name, val, i = parse_long(a, PYXIS_LONG, argv, i, "srun")
                pyxis.option(name, val)
                continue
            if name not in SRUN_LONG:
                raise Fail(f"srun: unrecognized option '--{name}' (or not one hpcserve's step "
                           "scripts use)")
            name, val, i = parse_long(a, SRUN_LONG, argv, i, "srun")
            opts[name] = val
            continue
        if a.startswith("-") and len(a) > 1:
            c = a[1]
            if c not in SRUN_SHORT:
                raise Fail(f"srun: invalid option -- '{c}'")
            name, kind = SRUN_SHORT[c]
            if kind == "opt" or len(a) > 2:
                opts[name] = a[2:] or None
                i += 1
            elif i + 1 < len(argv):
                opts[name] = argv[i + 1]
                i += 2
            else:
                raise Fail(f"srun: option requires an argument -- '{c}'")
            continue
        break
    command = argv[i:]
    if not command:
        raise Fail("srun: fatal: No command given to execute.")

    def posint(name: str, pattern: str = r"[1-9]\d*") -> int | None:
        v = opts.get(name)
        if v is None:
            return None
        if not re.fullmatch(pattern, v):
            raise Fail(f"srun: error: Invalid --{name} value: {v}")
        return int(v.split("-")[0])

    if "het-group" in opts:
        hg = opts["het-group"] or ""
        if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", hg):
            raise Fail(f"srun: error: Invalid hetjob component specification: {hg}")
        size = os.environ.get("HPCSERVE_FAKE_HET_SIZE")
        if size and max(int(x) for x in re.split(r"[,-]", hg)) >= int(size):
            raise Fail(f"srun: error: Attempt to run a job step with het group value of {hg}, "
                       f"but the job allocation has maximum value of {int(size) - 1}")
    nnodes = posint("nodes", r"[1-9]\d*(-[1-9]\d*)?")
    ntasks = posint("ntasks")
    per_node = posint("ntasks-per-node") or 1
    if "kill-on-bad-exit" in opts and opts["kill-on-bad-exit"] not in (None, "0", "1"):
        raise Fail(f"srun: error: Invalid --kill-on-bad-exit value: {opts['kill-on-bad-exit']}")
    kill_on_bad = opts.get("kill-on-bad-exit", "0") in (None, "1")
    if "wait" in opts and not re.fullmatch(r"\d+", opts["wait"] or ""):
        raise Fail(f"srun: error: Invalid --wait specification: {opts['wait']}")
    max_wait = int(opts["wait"]) if opts.get("wait") not in (None, "0") else None
    if "nodelist" in opts:
        nodes = expand_hostlist(opts["nodelist"] or "")
        if not nodes or any(not n for n in nodes):
            raise Fail(f"srun: error: Invalid node name specified: {opts['nodelist']!r}")
        if nnodes is not None and nnodes != len(nodes):
            raise Fail(f"srun: error: --nodes={nnodes} but --nodelist names {len(nodes)} "
                       "node(s) (stricter than srun)")
    else:
        pool = [n for n in os.environ.get("HPCSERVE_FAKE_NODES", "").split(",") if n]
        want = nnodes or 1
        nodes = (pool or [f"fakenode{k}" for k in range(want)])[:want]
        if len(nodes) < want:
            raise Fail("srun: error: Requested node configuration is not available")
    if ntasks is not None and ntasks != len(nodes) * per_node:
        raise Fail(f"srun: error: --ntasks={ntasks} with {len(nodes)} node(s) x "
                   f"--ntasks-per-node={per_node} (stricter than srun)")
    in_container = pyxis.check()

    step = next_step_id()
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("HPCSERVE_FAKE_JOB_ID", "4242")
    host = dict(os.environ)
    tasks = []
    log("srun", True, nodes=nodes, step=step, container=in_container,
        pyxis={"image": pyxis.image, "mounts": pyxis.mounts, "workdir": pyxis.workdir,
               "env": pyxis.env, "flags": pyxis.flags} if in_container else None,
        command=command)
    total = len(nodes) * per_node
    for n, node in enumerate(nodes):
        for local in range(per_node):
            rank = n * per_node + local
            env = pyxis.task_env(host) if in_container else dict(host)
            env.update({
                "SLURM_JOB_ID": job, "SLURM_STEP_ID": str(step), "SLURM_STEPID": str(step),
                "SLURMD_NODENAME": node, "SLURM_NODEID": str(n), "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(local), "SLURM_NNODES": str(len(nodes)),
                "SLURM_STEP_NUM_NODES": str(len(nodes)), "SLURM_NTASKS": str(total),
                "SLURM_STEP_NODELIST": ",".join(nodes)})
            if "job-name" in opts:
                env["SLURM_JOB_NAME"] = opts["job-name"] or ""
            cwd = pyxis.workdir if in_container and pyxis.workdir else None
            try:
                p = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True)
            except OSError as e:
                raise Fail(f"srun: error: {node}: task {rank}: {e.strerror}: {command[0]}", 2)
            tasks.append(p)

    def forward(signum, _frame) -> None:
        log("srun-signal", True, signal=signal.Signals(signum).name, step=step)
        for p in tasks:
            for pid in session_pids(p.pid):
                try:
                    os.kill(pid, signum)
                except OSError:
                    pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, forward)
    codes: dict[int, int] = {}
    killed = False
    first_exit = None

    def kill_all() -> None:
        for q in tasks:
            for pid in session_pids(q.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    while len(codes) < len(tasks):
        for k, p in enumerate(tasks):
            if k in codes:
                continue
            rc = p.poll()
            if rc is None:
                continue
            codes[k] = rc if rc >= 0 else 128 - rc
            first_exit = first_exit or time.time()
            if codes[k] != 0 and kill_on_bad and not killed:
                killed = True
                kill_all()
        if max_wait is not None and first_exit and not killed and \
                time.time() - first_exit >= max_wait:
            # srun --wait: the step ends N s after its first task did, each task's state said
            # first (srun/task_state.c's words)
            killed = True
            print(f"srun: First task exited {max_wait}s ago", file=sys.stderr)
            for k in range(len(tasks)):
                print(f"srun: StepId={job}.{step} task {k}: "
                      f"{'running' if k not in codes else 'exited' if codes[k] == 0 else 'exited abnormally'}",
                      file=sys.stderr)
            print(f"srun: launch/slurm: _step_signal: Terminating StepId={job}.{step}",
                  file=sys.stderr, flush=True)
            kill_all()
        time.sleep(0.02)
    # The step ends with its tasks: whatever they left running dies with the step's cgroup.
    for p in tasks:
        for pid in session_pids(p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    rc = max(codes.values()) if codes else 0
    log("srun-exit", True, step=step, rc=rc, task_codes=[codes[k] for k in sorted(codes)])
    return rc


# -------------------------------------------------------------------------------------- enroot

ENROOT_VERSION = "4.1.2"


def enroot_usage(cmd: str) -> Fail:
    return Fail(f"Usage: enroot {cmd} [options] [--] ... (see enroot {cmd} --help)", 1)


def enroot_opts(argv: list[str], cmd: str, spec: dict[str, tuple[str, bool]]
                ) -> tuple[dict[str, list[str]], list[str]]:
    """enroot.in's loops: spec maps -x/--xx to (key, takes value); '--xx=' forms for values.
    Short options never combine, a value must be non-empty, the first non-option ends options."""
    got: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in ("-h", "--help"):
            raise Fail(f"enroot {cmd}: help requested", 0)
        if a.startswith("--") and "=" in a:
            name, _, val = a.partition("=")
            if name not in spec or not spec[name][1] or not name.startswith("--"):
                raise enroot_usage(cmd)
            if not val:
                raise enroot_usage(cmd)
            got.setdefault(spec[name][0], []).append(val)
            i += 1
            continue
        if a in spec:
            key, takes = spec[a]
            if takes:
                if i + 1 >= len(argv) or argv[i + 1] == "":
                    raise enroot_usage(cmd)
                got.setdefault(key, []).append(argv[i + 1])
                i += 2
            else:
                got.setdefault(key, []).append("")
                i += 1
            continue
        if a.startswith("-") and len(a) > 1:
            raise enroot_usage(cmd)
        break
    return got, argv[i:]


def data_path() -> str:
    p = os.environ.get("ENROOT_DATA_PATH")
    if not p:
        raise Fail("fake enroot: ENROOT_DATA_PATH must be set (the fake never writes to your "
                   "home directory)", 2)
    os.makedirs(p, exist_ok=True)
    return p


def container_dir(name: str) -> str:
    if not name:
        raise Fail("[ERROR] Invalid argument")
    if "/" in name:
        raise Fail(f"[ERROR] Invalid argument: {name}")
    return os.path.join(data_path(), name)


def enroot_import(argv: list[str]) -> int:
    got, args = enroot_opts(argv, "import", {
        "-a": ("arch", True), "--arch": ("arch", True),
        "-o": ("output", True), "--output": ("output", True)})
    if len(args) != 1:
        raise enroot_usage("import")
    uri = args[0]
    m = re.fullmatch(r"(docker|dockerd|podman)://(.*)", uri)
    if not m:
        raise Fail(f"[ERROR] Invalid argument: {uri}")
    if m.group(1) == "docker" and not DOCKER_REF.match(m.group(2)):
        raise Fail(f"[ERROR] Invalid image reference: {uri}")
    ref = m.group(2)
    if "output" in got:
        out = got["output"][-1]
    else:
        image = re.sub(r"^[^@]*@", "", ref).split("#")[-1]
        name, _, tag = image.partition(":")
        out = name.replace("/", "+") + (f"+{tag}" if tag else "") + ".sqsh"
    out = os.path.abspath(out)
    if os.path.exists(out):
        raise Fail(f"[ERROR] File already exists: {out}")
    if not shutil.which("mksquashfs"):
        raise Fail("fake enroot import needs mksquashfs (squashfs-tools)", 2)
    log("enroot", True, output=out, uri=uri)
    with tempfile.TemporaryDirectory(prefix="fake-enroot-import-") as tmp:
        root = os.path.join(tmp, "rootfs")
        os.makedirs(os.path.join(root, "etc"))
        with open(os.path.join(root, "etc", "environment"), "w") as f:
            for k, v in image_env().items():
                f.write(f"{k}={v}\n")
        with open(os.path.join(root, "etc", "rc"), "w") as f:
            f.write(f"# enroot-provenance: {uri}\nexec \"$@\"\n")
        for k in range(20):
            with open(os.path.join(root, f"layer-{k}.bin"), "wb") as f:
                f.write(os.urandom(4096))
        built = os.path.join(tmp, "image.sqsh")
        subprocess.run(["mksquashfs", root, built, "-noappend", "-quiet", "-no-progress"],
                       check=True, stdout=subprocess.DEVNULL)
        data = open(built, "rb").read()
    # enroot writes the squashfs file in place while it builds it: readers can see it partial.
    write_progressively(out, data, "HPCSERVE_FAKE_ENROOT_IMPORT",
                        "[ERROR] Failed to download layer (fake failure)")
    return 0


def write_progressively(path: str, data: bytes, knob: str, error: str) -> None:
    """`data` written to `path` in 8 pieces over <knob>_SECONDS, as a tool that writes its output
    while it downloads: readers can see it partial. <knob>_FAIL=error fails half way with `error`;
    =truncate stops half way and returns (a broken file and exit 0, which only a check of the
    file catches)."""
    seconds = float(os.environ.get(f"{knob}_SECONDS", "0"))
    fail = os.environ.get(f"{knob}_FAIL", "")
    chunks = 8
    with open(path, "wb") as f:
        for k in range(chunks):
            if fail and k == chunks // 2:
                f.flush()
                if fail == "error":
                    raise Fail(error)
                return
            f.write(data[k * len(data) // chunks:(k + 1) * len(data) // chunks])
            f.flush()
            time.sleep(seconds / chunks)


def enroot_create(argv: list[str]) -> int:
    got, args = enroot_opts(argv, "create", {
        "-f": ("force", False), "--force": ("force", False),
        "-n": ("name", True), "--name": ("name", True)})
    if len(args) != 1:
        raise enroot_usage("create")
    image = os.path.realpath(args[0])
    if not os.path.isfile(image):
        raise Fail(f"[ERROR] No such file or directory: {image}")
    if not is_squashfs(image):
        raise Fail(f"[ERROR] Invalid image format: {image}")
    name = got["name"][-1] if "name" in got else os.path.basename(image).removesuffix(".sqsh")
    d = container_dir(name)
    if os.path.exists(d):
        if "force" not in got and not os.environ.get("ENROOT_FORCE_OVERRIDE"):
            raise Fail(f"[ERROR] File already exists: {d}")
        shutil.rmtree(d)
    os.makedirs(os.path.join(d, "etc"))
    log("enroot", True, name=name, image=image)
    # Extraction takes a while; a signal meanwhile leaves a partial root file system.
    time.sleep(float(os.environ.get("HPCSERVE_FAKE_ENROOT_CREATE_SECONDS", "0")))
    with open(os.path.join(d, ".fake-enroot.json"), "w") as f:
        json.dump({"image": image, "created": time.time()}, f)
    return 0


ENV_ENTRY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(=|\Z)")


def enroot_start(argv: list[str]) -> int:
    # enroot 4.1.2: --pid/--net/--ipc/--uts exist only on master after that release.
    got, args = enroot_opts(argv, "start", {
        "-c": ("conf", True), "--conf": ("conf", True), "-m": ("mount", True),
        "--mount": ("mount", True), "-e": ("env", True), "--env": ("env", True),
        "-r": ("root", False), "--root": ("root", False), "--rc": ("rc", True),
        "-w": ("rw", False), "--rw": ("rw", False)})
    if len(args) < 1:
        raise enroot_usage("start")
    target, command = args[0], args[1:]
    if not target:
        raise Fail("[ERROR] Invalid argument")
    cdir = None
    if os.path.isfile(target) and is_squashfs(target):
        pass  # an image started directly (squashfuse + overlay)
    else:
        if "/" in target:
            raise Fail(f"[ERROR] Invalid argument: {target}")
        cdir = os.path.join(data_path(), target)
        if not os.path.isdir(cdir):
            raise Fail(f"[ERROR] No such file or directory: {cdir}")
    for m in got.get("mount", []):
        if not re.fullmatch(r"[^\s]+(:[^\s]+)*", m):
            raise Fail(f"[ERROR] Invalid argument: {m}")
    for e in got.get("env", []):
        if not ENV_ENTRY.match(e):
            raise Fail(f"[ERROR] Invalid argument: {e}")
    for key in ("rc", "conf"):
        for p in got.get(key, []):
            if not os.path.isfile(p):
                raise Fail(f"[ERROR] No such file or directory: {os.path.realpath(p)}")
    for m in got.get("mount", []):
        check_fstab_mount(m, "enroot-mount")
    if not command:
        raise Fail("fake enroot: no command given (enroot would run the image's default command)",
                   2)
    host = dict(os.environ)
    img = image_env()
    env: dict[str, str] = {"TERM": host.get("TERM", "dumb")}
    env.update(img)
    for e in got.get("env", []):
        k, eq, v = e.partition("=")
        env[k] = v if eq else host.get(k, "")
    env.setdefault("HOME", host.get("HOME", "/"))
    env.setdefault("PATH", host.get("PATH", "/usr/bin:/bin"))
    env.update(plumbing(host))
    if cdir:
        run = os.path.join(cdir, ".running")
        os.makedirs(run, exist_ok=True)
        open(os.path.join(run, str(os.getpid())), "w").close()
    log("enroot", True, name=target, writable="rw" in got,
        mounts=got.get("mount", []), env_names=[e.partition("=")[0] for e in got.get("env", [])],
        command=command)
    os.chdir("/")
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        raise Fail(f"enroot-switchroot: failed to execute: {command[0]}: {e.strerror}")
    return 1


def enroot_remove(argv: list[str]) -> int:
    got, args = enroot_opts(argv, "remove", {"-f": ("force", False), "--force": ("force", False)})
    if not args:
        raise enroot_usage("remove")
    force = "force" in got or bool(os.environ.get("ENROOT_FORCE_OVERRIDE"))
    for name in args:
        d = container_dir(name)
        if not os.path.isdir(d):
            raise Fail(f"[ERROR] No such file or directory: {d}")
        running = os.path.join(d, ".running")
        busy = [int(p) for p in (os.listdir(running) if os.path.isdir(running) else [])
                if alive(int(p))]
        if busy:
            raise Fail(f"stricter than enroot: {name} is removed while its container still runs "
                       f"(pid {', '.join(map(str, busy))})")
        if not force:
            sys.stderr.write(f"Do you really want to delete {d}? [y/N] ")
            sys.stderr.flush()
            reply = sys.stdin.readline()
            if not reply:
                raise Fail("", 1)  # read fails at EOF, and enroot runs with set -e
            if reply.strip() not in ("y", "Y"):
                continue
        shutil.rmtree(d)
        log("enroot", True, removed=name)
    return 0


def enroot(argv: list[str]) -> int:
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in ("-d", "--debug"):
            i += 1
        elif argv[i] in ("-v", "--version"):
            print(ENROOT_VERSION)
            return 0
        else:
            raise Fail("Usage: enroot COMMAND [ARG...]", 1)
    if i >= len(argv):
        raise Fail("Usage: enroot COMMAND [ARG...]", 1)
    cmd, rest = argv[i], argv[i + 1:]
    if cmd == "version":
        print(ENROOT_VERSION)
        return 0
    if cmd == "list":
        for n in sorted(os.listdir(data_path())):
            print(n)
        return 0
    fn = {"import": enroot_import, "create": enroot_create, "start": enroot_start,
          "remove": enroot_remove}.get(cmd)
    if fn is None:
        if cmd in ("batch", "bundle", "exec", "export", "load"):
            raise Fail(f"fake enroot: {cmd} is not emulated", 2)
        raise Fail("Usage: enroot COMMAND [ARG...]", 1)
    return fn(rest)


# ----------------------------------------------------------------------------------- apptainer

# apptainer 1.5.3 cmd/internal/cli/action_flags.go: name -> (shorthand, kind); kind "bool" or
# "value" (string, string array, map, int).
APPTAINER_EXEC_FLAGS = {
    "app": (None, "value"), "bind": ("B", "value"), "mount": (None, "value"),
    "home": ("H", "value"), "overlay": ("o", "value"), "scratch": ("S", "value"),
    "workdir": ("W", "value"), "disable-cache": (None, "bool"), "shell": ("s", "value"),
    "cwd": (None, "value"), "pwd": (None, "value"), "hostname": (None, "value"),
    "network": (None, "value"), "network-args": (None, "value"), "dns": (None, "value"),
    "security": (None, "value"), "apply-cgroups": (None, "value"),
    "containlibs": (None, "value"), "fusemount": (None, "value"), "tmpdir": (None, "value"),
    "boot": (None, "bool"), "fakeroot": ("f", "bool"), "cleanenv": ("e", "bool"),
    "compat": (None, "bool"), "contain": ("c", "bool"), "containall": ("C", "bool"),
    "nv": (None, "bool"), "nvccli": (None, "bool"), "compat32": (None, "bool"),
    "rocm": (None, "bool"), "writable": ("w", "bool"), "writable-tmpfs": (None, "bool"),
    "no-home": (None, "bool"), "no-mount": (None, "value"), "no-init": (None, "bool"),
    "no-nv": (None, "bool"), "no-rocm": (None, "bool"), "pid": ("p", "bool"),
    "no-pid": (None, "bool"), "ipc": ("i", "bool"), "net": ("n", "bool"),
    "uts": (None, "bool"), "userns": ("u", "bool"), "keep-privs": (None, "bool"),
    "no-privs": (None, "bool"), "add-caps": (None, "value"), "drop-caps": (None, "value"),
    "allow-setuid": (None, "bool"), "env": (None, "value"), "no-env": (None, "value"),
    "env-file": (None, "value"), "no-umask": (None, "bool"), "no-eval": (None, "bool"),
    "dmtcp-launch": (None, "value"), "dmtcp-restart": (None, "value"),
    "blkio-weight": (None, "value"), "blkio-weight-device": (None, "value"),
    "cpu-shares": (None, "value"), "cpus": (None, "value"), "cpuset-cpus": (None, "value"),
    "cpuset-mems": (None, "value"), "memory": (None, "value"),
    "memory-reservation": (None, "value"), "memory-swap": (None, "value"),
    "oom-kill-disable": (None, "bool"), "pids-limit": (None, "value"),
    "unsquash": (None, "bool"), "ignore-subuid": (None, "bool"),
    "ignore-fakeroot-command": (None, "bool"), "ignore-userns": (None, "bool"),
    "underlay": (None, "bool"), "sharens": (None, "bool"), "runscript-timeout": (None, "value"),
    "netns-path": (None, "value"), "intel-hpu": (None, "bool"), "device": (None, "value"),
    "cdi-dirs": (None, "value")}
APPTAINER_GLOBAL = {"debug": ("d", "bool"), "quiet": ("q", "bool"), "silent": ("s", "bool"),
                    "verbose": ("v", "bool"), "nocolor": (None, "bool")}
IMAGE_SCHEMES = ("docker", "docker-daemon", "oras", "library", "shub", "http", "https", "oci",
                 "oci-archive", "docker-archive", "instance")


def pflag_parse(argv: list[str], table: dict[str, tuple[str | None, str]], what: str
                ) -> tuple[list[tuple[str, str]], list[str]]:
    """cobra/pflag with interspersed arguments off: flags until the first positional."""
    shorts = {s: n for n, (s, _) in table.items() if s}
    got: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return got, argv[i + 1:]
        if a.startswith("--"):
            name, eq, val = a[2:].partition("=")
            if name not in table:
                raise Fail(f"Error: unknown flag: --{name}", 255)
            kind = table[name][1]
            if kind == "bool":
                if eq and val not in ("true", "false", "1", "0", "t", "f", "TRUE", "FALSE"):
                    raise Fail(f'Error: invalid argument "{val}" for "--{name}" flag', 255)
                got.append((name, val if eq else "true"))
                i += 1
            elif eq:
                got.append((name, val))
                i += 1
            elif i + 1 < len(argv):
                got.append((name, argv[i + 1]))
                i += 2
            else:
                raise Fail(f"Error: flag needs an argument: --{name}", 255)
            continue
        if a.startswith("-") and len(a) > 1:
            j = 1
            i += 1
            while j < len(a):
                c = a[j]
                if c not in shorts:
                    raise Fail(f"Error: unknown shorthand flag: '{c}' in {a}", 255)
                name = shorts[c]
                if table[name][1] == "bool":
                    got.append((name, "true"))
                    j += 1
                    continue
                if j + 1 < len(a):
                    got.append((name, a[j + 1:].removeprefix("=")))
                elif i < len(argv):
                    got.append((name, argv[i]))
                    i += 1
                else:
                    raise Fail(f"Error: flag needs an argument: '{c}' in {a}", 255)
                break
            continue
        return got, argv[i:]
    return got, []


def parse_binds(spec: str) -> list[tuple[str, str, set[str]]]:
    """apptainer's ParseBindPath for specs without escapes: src[:dst[:opt[,opt]]][,...]."""
    out: list[tuple[str, str, set[str]]] = []
    valid = ("ro", "rw")
    cur: list[str] | None = None
    for tok in spec.split(","):
        tok = tok.strip()
        is_opt = tok in valid or tok.startswith(("image-src=", "id="))
        if cur is not None and len(cur) == 3 and is_opt:
            cur[2] += "," + tok
            continue
        if cur is not None:
            out.append(_bind(cur))
        cur = tok.split(":")
        if len(cur) > 3:
            raise Fail(f"FATAL: while getting bind path: bad bind syntax {tok!r}", 255)
    if cur is not None:
        out.append(_bind(cur))
    return out


def _bind(parts: list[str]) -> tuple[str, str, set[str]]:
    src = parts[0]
    if not src:
        raise Fail(f"FATAL: while getting bind path: empty bind source for bind path "
                   f"{':'.join(parts)!r}", 255)
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    opts: set[str] = set()
    if len(parts) > 2:
        for o in parts[2].split(","):
            if o in ("ro", "rw") or o.startswith(("image-src=", "id=")):
                opts.add(o)
            else:
                raise Fail(f"FATAL: while getting bind path: {o} is not a valid bind option", 255)
    return src, dst, opts


# A subset of apptainer 1.5.3's build and pull flags (cmd/internal/cli/build.go, pull.go): what a
# build from a registry can use; anything else is refused as the real pflag parser would.
APPTAINER_BUILD_FLAGS = {
    "force": ("F", "bool"), "sandbox": ("s", "bool"), "notest": ("T", "bool"),
    "fakeroot": ("f", "bool"), "fix-perms": (None, "bool"), "disable-cache": (None, "bool"),
    "arch": (None, "value"), "authfile": (None, "value"), "docker-login": (None, "bool"),
    "no-https": (None, "bool"), "tmpdir": (None, "value"), "update": ("u", "bool"),
    "section": (None, "value"), "json": (None, "bool"), "nv": (None, "bool")}
APPTAINER_PULL_FLAGS = {
    "force": ("F", "bool"), "dir": (None, "value"), "disable-cache": (None, "bool"),
    "arch": (None, "value"), "authfile": (None, "value"), "docker-login": (None, "bool"),
    "no-https": (None, "bool"), "tmpdir": (None, "value"), "sandbox": (None, "bool")}
# docker:// as Apptainer reads it (the distribution reference grammar): [HOST[:PORT]/]NAME[:TAG]
# [@DIGEST], HOST a name with a dot, a port or localhost, NAME's components lower-case; enroot's
# "#" between registry and name is not part of it.
APPTAINER_DOCKER_REF = re.compile(
    r"(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::\d+)?/|[A-Za-z0-9-]+:\d+/)?"
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?\Z")
BUILD_SOURCES = ("docker", "oras", "library")  # registry sources the fake can "pull"

# The SIF global header (apptainer/sif pkg/sif/sif.go): the launch line (32 bytes), "SIF_MAGIC\0",
# version "01\0", arch "02\0" (amd64), a 16-byte ID, then eight little-endian int64: created,
# modified, free and total descriptors, descriptors' offset and length, data offset and length.
SIF_LAUNCH = b"#!/usr/bin/env run-singularity\n"
SIF_DATA_OFFSET = 32768


def sif_bytes(payload: bytes) -> bytes:
    import struct
    import uuid
    now = int(time.time())
    head = (SIF_LAUNCH.ljust(32, b"\0") + b"SIF_MAGIC\0" + b"01\0" + b"02\0" + uuid.uuid4().bytes
            + struct.pack("<8q", now, now, 47, 48, 4096, 0, SIF_DATA_OFFSET, len(payload)))
    return head + b"\0" * (SIF_DATA_OFFSET - len(head)) + payload


def sif_problem(path: str) -> str | None:
    """Why `path` is not a whole SIF file (None: it is): the magic, and the data the header
    declares lying inside the file (a partial download is shorter)."""
    import struct
    try:
        with open(path, "rb") as f:
            head = f.read(128)
        size = os.path.getsize(path)
    except OSError as e:
        return str(e)
    if len(head) < 128 or head[32:42] != b"SIF_MAGIC\0":
        return "image format not recognized"
    off, length = struct.unpack("<2q", head[112:128])
    if off + length > size:
        return f"the SIF header declares {off + length} bytes of data, the file holds {size}"
    return None


def write_sif(path: str, uri: str) -> None:
    """A SIF written as apptainer writes its build's output (HPCSERVE_FAKE_APPTAINER_BUILD_
    SECONDS and _FAIL: write_progressively)."""
    write_progressively(path, sif_bytes(f"fake image of {uri}\n".encode() + os.urandom(64 * 1024)),
                        "HPCSERVE_FAKE_APPTAINER_BUILD",
                        "FATAL:   While performing build: conveyor failed to get: fake failure")


def _build_source(uri: str) -> None:
    m = re.match(r"([a-z-]+)://(.*)", uri)
    if not m:
        if os.path.exists(uri):
            raise Fail("fake apptainer: building from a definition file is not emulated", 2)
        raise Fail(f"FATAL:   Unable to build from {uri}: unable to open file {uri}: no such "
                   "file or directory", 255)
    if m.group(1) not in IMAGE_SCHEMES:
        raise Fail(f"FATAL:   Unsupported transport type: {m.group(1)}", 255)
    if m.group(1) not in BUILD_SOURCES:
        raise Fail(f"fake apptainer: building from {m.group(1)}:// is not emulated", 2)
    if m.group(1) == "docker" and not APPTAINER_DOCKER_REF.match(m.group(2)):
        raise Fail(f"FATAL:   While performing build: conveyor failed to get: invalid reference "
                   f"format: {uri}", 255)


def _write_image(cmd: str, target: str, uri: str, force: bool) -> int:
    target = os.path.abspath(target)
    if os.path.exists(target) and not force:
        raise Fail(f"FATAL:   Image file already exists: \"{target}\" - will not overwrite", 255)
    if not os.path.isdir(os.path.dirname(target)):
        raise Fail(f"FATAL:   While performing {cmd}: could not open {target}: no such file or "
                   "directory", 255)
    log("apptainer", True, command=cmd, target=target, uri=uri)
    write_sif(target, uri)
    return 0


def apptainer_build(argv: list[str]) -> int:
    """apptainer build [flags] TARGET SPEC, SPEC a registry URI."""
    flags, args = pflag_parse(argv, APPTAINER_BUILD_FLAGS, "apptainer build")
    if len(args) != 2:
        raise Fail(f"Error: accepts 2 arg(s), received {len(args)}", 255)
    values = dict(flags)
    if values.get("sandbox") == "true":
        raise Fail("fake apptainer: --sandbox is not emulated", 2)
    _build_source(args[1])
    return _write_image("build", args[0], args[1], values.get("force") == "true")


def apptainer_pull(argv: list[str]) -> int:
    """apptainer pull [flags] [TARGET] URI."""
    flags, args = pflag_parse(argv, APPTAINER_PULL_FLAGS, "apptainer pull")
    if len(args) not in (1, 2):
        raise Fail(f"Error: requires at least 1 arg(s), only received {len(args)}"
                   if not args else f"Error: accepts at most 2 arg(s), received {len(args)}", 255)
    uri = args[-1]
    _build_source(uri)
    values = dict(flags)
    target = args[0] if len(args) == 2 else re.sub(r"[:/]", "_", uri.split("://", 1)[1]) + ".sif"
    return _write_image("pull", os.path.join(values.get("dir", ""), target), uri,
                        values.get("force") == "true")


def apptainer(argv: list[str]) -> int:
    _glob, rest = pflag_parse(argv, APPTAINER_GLOBAL, "apptainer")
    if not rest:
        raise Fail("Usage: apptainer [global options...] <command>", 255)
    cmd, rest = rest[0], rest[1:]
    if cmd in ("build", "pull"):
        return (apptainer_build if cmd == "build" else apptainer_pull)(rest)
    if cmd != "exec":
        if cmd in ("run", "shell", "instance", "inspect", "test"):
            raise Fail(f"fake apptainer: {cmd} is not emulated", 2)
        raise Fail(f'Error: unknown command "{cmd}" for "apptainer"', 255)
    flags, args = pflag_parse(rest, APPTAINER_EXEC_FLAGS, "apptainer exec")
    if len(args) < 2:
        raise Fail(f"Error: requires at least 2 arg(s), only received {len(args)}", 255)
    image, command = args[0], args[1:]
    m = re.match(r"([a-z-]+):(//)?", image)
    if m and m.group(1) in IMAGE_SCHEMES:
        pass
    elif m and m.group(2):
        raise Fail(f"FATAL: Unsupported transport type: {m.group(1)}", 255)
    elif not os.path.exists(image):
        raise Fail(f"FATAL: could not open image {os.path.abspath(image)}: failed to retrieve "
                   f"path for {image}: lstat {image}: no such file or directory", 255)
    elif os.path.isfile(image) and not is_squashfs(image) and sif_problem(image):
        # a directory is a sandbox and a bare squashfs file an image too; any other file must be
        # a whole SIF (the real one fails to mount a truncated one's partition)
        raise Fail(f"FATAL: could not open image {os.path.abspath(image)}: "
                   f"{sif_problem(image)}", 255)
    binds = []
    for name, val in flags:
        if name == "bind":
            binds += parse_binds(val)
    for src, dst, _ in binds:
        if not os.path.exists(src):
            raise Fail(f"FATAL: container creation failed: mount hook function failure: mount "
                       f"{src}->{dst} error: while mounting {src}: mount source {src} doesn't "
                       "exist", 255)
    values = dict(flags)
    cwd = values.get("cwd") or values.get("pwd")
    if cwd and not os.path.isdir(cwd):
        raise Fail(f"FATAL: container creation failed: could not set working directory {cwd}",
                   255)
    host = dict(os.environ)
    if values.get("cleanenv") == "true" or values.get("containall") == "true":
        env = {k: v for k, v in host.items() if k in ("HOME", "TERM", "LANG", "USER")}
    else:
        env = {k: v for k, v in host.items()
               if not k.startswith(("APPTAINERENV_", "SINGULARITYENV_"))}
    env.update(image_env())
    for k, v in host.items():
        for pre in ("SINGULARITYENV_", "APPTAINERENV_"):
            if k.startswith(pre) and len(k) > len(pre):
                env[k[len(pre):]] = v
    for name, val in flags:
        if name == "env":
            for kv in val.split(","):
                k, eq, v = kv.partition("=")
                if not eq:
                    raise Fail(f"FATAL: while parsing --env: {kv!r} is not KEY=VALUE", 255)
                env[k] = v
    env.update(plumbing(host))
    log("apptainer", True, image=image, binds=[[s, d, sorted(o)] for s, d, o in binds],
        nv=values.get("nv") == "true", cwd=cwd, command=command)
    if cwd:
        os.chdir(cwd)
    try:
        os.execvpe(command[0], command, env)
    except OSError:
        raise Fail(f'FATAL: "{command[0]}": executable file not found in $PATH', 255)
    return 255


# -------------------------------------------------------------------------------------- engine

ENGINE_ENV = ("NCCL_", "GLOO_", "UCX_", "MC_", "NVSHMEM_", "SGLANG_", "SLURM", "CUDA_VISIBLE",
              "HPCSERVE_SIM_", "HPCSERVE_TEST_", "PYTHONUNBUFFERED", "NODELIST", "LANG", "LC_ALL")


def engine(argv: list[str]) -> int:
    """python3 for the engine and router commands: records them, then (HPCSERVE_FAKE_ENGINE, or
    HPCSERVE_FAKE_ENGINE_<node> for one node) exits ("exit:CODE[:AFTER_SECONDS]"), serves until a
    TERM ("serve") or ignores TERM ("ignore-term")."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    env = {k: v for k, v in os.environ.items() if k.startswith(ENGINE_ENV)}
    node = os.environ.get("SLURMD_NODENAME", "")
    mode = (os.environ.get(f"HPCSERVE_FAKE_ENGINE_{node}") or
            os.environ.get("HPCSERVE_FAKE_ENGINE", "exit:0"))
    log("engine", True, env=env, cwd=os.getcwd(), node=node or None, memlock=[soft, hard],
        mode=mode)
    if mode.startswith("exit:"):
        _, code, *after = mode.split(":")
        time.sleep(float(after[0]) if after else 0)
        return int(code)

    def on_term(signum, _frame) -> None:
        log("engine-signal", True, signal=signal.Signals(signum).name)
        if mode == "serve":
            time.sleep(float(os.environ.get("HPCSERVE_FAKE_ENGINE_STOP_SECONDS", "0")))
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while True:
        time.sleep(3600)


TOOLS = {"srun": srun, "enroot": enroot, "apptainer": apptainer, "engine": engine}


def main() -> int:
    tool, argv = sys.argv[1], sys.argv[2:]
    ARGV[:] = argv
    try:
        return TOOLS[tool](argv)
    except Fail as e:
        log(tool, False, error=e.message, rc=e.code)
        if e.message:
            print(e.message, file=sys.stderr)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
