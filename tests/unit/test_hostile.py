"""Hostile strings in every string field: refused as config errors, or passed through literally.

For each string of the corpus, every string field of a deployment and its inline site (found by
walking the config records) gets that string, tagged with the field's number. Fields the config
refuses must be refused with a ConfigError; the rest is rendered and written, and every generated
script is run by bash with stub srun/python3/apptainer/enroot/... first on PATH that record their
argv and environment. No command in the strings may ever run (no PWNED file anywhere), every
accepted value must reach the stubs (or the #SBATCH options as sbatch reads them, or plan.json)
byte for byte, and the scripts must succeed.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpcserve.author.config import Deployment
from hpcserve.errors import ConfigError
from unitkit import (Leaf, install_stubs, leaf_fields, make_stub, read_stub_log,
                     sbatch_components, sbatch_options, set_path, small_pd, string_carrying,
                     stub_env, write_nodes, write_yaml)

HOSTILE = [
    "two words  here",
    "it's",
    'say "hi"',
    "$(touch PWNED)",
    "`touch PWNED`",
    "a;touch PWNED;",
    "a && touch PWNED",
    "a | touch PWNED",
    ">PWNED",
    "*",
    "~",
    "{a,b}",
    "$HOME",
    "${HOME}",
    "back\\slash\\",
    "ünïcødé ✓",
    "-leading-dash",
    "'",
    '"',
    "#not-a-comment",
    "%s%n$1!!",
    "@ABS@",  # replaced by $(touch <tmp>/pwn/PWNED): an absolute target that surely exists
]
MEGA = "a b'c\"d$(touch PWNED)`touch PWNED`;e&&f|g*h~i{j,k}$HOME\\l ünïcødé ✓ #m %n"
RUNTIMES = ["pyxis", "apptainer", "enroot", "none"]
# Where the position of the string in the value matters (option-like, tilde expansion).
START_SENSITIVE = {"-leading-dash", "~"}
# Commands named by config values: a stub is installed at the configured path.
COMMANDS = {("site", "paths", "python"), ("engine", "python"), ("router", "python"),
            ("site", "paths", "router_python"), ("benchmark", "python")}
# Mapping fields get one entry: key -> the hostile value.
MAP_KEYS = {("site", "slurm", "extra_directives"): "comment",
            ("roles", "prefill", "args"): "chat-template", ("roles", "decode", "args"): "chat-template",
            ("router", "args"): "hostile-router-flag"}
# Accepted, and deliberately nowhere in the job directory (see test_canary.ALLOW).
NOWHERE = {("site", "description"), ("site", "node", "gpu_type")}
# Fields another one shadows (engine.image over site.container.image, jobs_dir over paths.jobs_dir).
SHADOW = {("site", "container", "image"): ("engine", "image"),
          ("site", "paths", "jobs_dir"): ("jobs_dir",),
          ("site", "paths", "router_python"): ("router", "python")}
CONTAINER = ("site", "container")
# Fields the runtime reads from plan.json (as a path, never through a shell): plan.json's key.
PLAN_JSON = {("jobs_dir",): "jobs_dir", ("site", "paths", "jobs_dir"): "jobs_dir",
             ("site", "metrics", "file_sd_dir"): "file_sd_dir"}


def _leaves() -> list[Leaf]:
    return [lf for lf in leaf_fields(Deployment) if string_carrying(lf)]


def _tag(h: str, k: int) -> str:
    return f"{h}/t{k}" if h in START_SENSITIVE else f"t{k}_{h}"


def _value(leaf: Leaf, h: str, k: int, pybin: Path):
    """(value to configure, the string that must arrive somewhere)."""
    t = _tag(h, k)
    p = leaf.path
    if p in COMMANDS:
        s = f"{pybin}/t{k}_{h}"
        return s, s
    if p == ("site", "container", "mounts"):
        s = f"/mnt/{t}:/ctr/{t}"
        return [s], s
    if p in (("model", "path"), ("site", "container", "workdir")):
        s = f"/{p[-1]}/{t}"
        return s, s
    kind = string_carrying(leaf)
    if kind == "list":
        return [t], t
    if kind == "dict":
        return {MAP_KEYS.get(p, f"HOSTILE_{k}"): t}, t
    return t, t


class Run:
    """One deployment with a hostile string in every string field, rendered and executed."""

    def __init__(self, h: str, runtime: str, root: Path, site_side: bool):
        """site_side: the site's image and jobs_dir carry the string (the deployment's overrides
        of them stay unset), else the deployment's do."""
        self.h, self.runtime, self.root = h, runtime, root
        self.pybin = root / "pybin"
        self.pwn = root / "pwn"
        self.pwn.mkdir(parents=True)
        if h == "@ABS@":
            self.h = h = f"$(touch {self.pwn}/PWNED)"
        self.leaves = _leaves()
        self.doc = small_pd(runtime)
        self.doc["router"] = {"enabled": True}
        # site.fabric's string (slurm_version) needs its required sibling; with no directive and
        # no check, the fabric changes nothing else of the job
        self.doc["site"]["fabric"] = {"nvlink_domain_nodes": 4, "topology": "none",
                                      "check": False}
        # roles' autoscale string (cool_down) needs its required bounds; min = max = the one
        # instance each role has: no slot is rendered
        for role in ("prefill", "decode"):
            self.doc["roles"][role]["autoscale"] = {"min": 1, "max": 1}
        self.values: dict[tuple, tuple] = {}
        for k, leaf in enumerate(self.leaves):
            if leaf.path in (SHADOW.values() if site_side else SHADOW):
                continue
            if runtime == "none" and (leaf.path[:2] == CONTAINER or leaf.path == ("engine", "image")):
                continue  # no container: its settings are not used
            if leaf.path[:3] == CONTAINER + ("image_cache",):
                # a record of two required, pattern-checked names (a path, a user): a hostile
                # value in either is refused at load (test_config.py), and the one
                # left alone would only be refused for its missing sibling
                continue
            v, want = _value(leaf, h, k, self.pybin)
            self.values[leaf.path] = (v, want)
        self.refused: dict[tuple, ConfigError] = {}
        self.problems: list[str] = []

    def doc_with(self, paths) -> dict:
        doc = copy.deepcopy(self.doc)
        for p in paths:
            set_path(doc, p, self.values[p][0])
        return doc

    def build(self):
        """Render with every hostile value the config accepts; those it refuses are recorded."""
        from hpcserve.author import config, plan
        from hpcserve.author.render import render_files
        active = list(self.values)
        f = self.root / "deploy.yaml"
        self.job = self.root / "job"
        for _ in range(len(self.values) + 1):
            write_yaml(f, self.doc_with(active))
            try:
                self.plan = plan.build(config.load(f))
                self.files = render_files(self.plan, str(self.job))
                self.active = active
                return
            except ConfigError as e:
                culprit = self._culprit(e, active)
                self.refused[culprit] = e
                active = [p for p in active if p != culprit]
        raise AssertionError("no renderable configuration left")

    def _culprit(self, e: ConfigError, active: list[tuple]) -> tuple:
        dotted = {".".join(map(str, p)): p for p in active}
        field = e.field or ""
        for d in sorted(dotted, key=len, reverse=True):
            if field == d or field.startswith(d + ".") or field.startswith(d + "["):
                return dotted[d]
        # The error does not name a hostile field: find the one whose value causes it.
        from hpcserve.author import config, plan
        from hpcserve.author.render import render_files
        f = self.root / "probe.yaml"
        for p in active:
            write_yaml(f, self.doc_with([p]))
            try:
                render_files(plan.build(config.load(f)), str(self.root / "probe-job"))
            except ConfigError:
                self.problems.append(f"error for {'.'.join(map(str, p))} names field {field!r}: {e}")
                return p
        raise AssertionError(f"ConfigError not caused by a hostile value: {e}")

    def execute(self):
        from hpcserve.author.render import write_job
        for p in COMMANDS & set(self.active):
            make_stub(Path(self.values[p][0]))
        self.bin = install_stubs(self.root / "bin")
        self.log = self.root / "calls.jsonl"
        self.cwd = self.root / "cwd"
        self.home = self.root / "home"
        for d in (self.cwd, self.home):
            d.mkdir()
        write_job(self.files, self.job)
        # What an unquoted glob would match, so globbing cannot go unnoticed.
        for d in (self.cwd, self.job):
            for k in range(len(self.leaves)):
                (d / f"t{k}_globhit").touch()
        nodes = {}
        for i in self.plan.instances:
            rows = [(r, f"{i.name}-n{r}", f"10.{i.component}.{i.index}.{r + 1}", "eth0", "mlx5_0")
                    for r in range(i.nodes)]
            write_nodes(self.job, i.name, rows)
            nodes[i.name] = rows
        (self.job / "run" / "endpoints.env").write_text("".join(
            f"{i.role.upper()}_{i.index}_IP={shlex.quote(nodes[i.name][0][2])}\n"
            for i in self.plan.instances) + "ROUTER_IP=10.9.9.9\nSERVING_URL=http://10.9.9.9:8000\n",
            encoding="utf-8")
        # HPCSERVE_API_KEY: what job.sbatch exports to the job's steps from secret/api-key
        env = stub_env(self.bin, self.log, self.home, NODELIST="n1,n2", SLURM_JOB_ID="77",
                       SLURM_STEP_ID="3", HPCSERVE_API_KEY="k-hostile-test")
        runs = [("job.sbatch", [], {}, True)]
        imp = json.loads(self.files["plan.json"][0])["container"].get("import")
        if imp:  # pyxis, apptainer: what the runtime runs once before any step (the apptainer
            # stub writes no SIF, which the build helper then refuses: it need not succeed)
            runs.append((os.path.basename(imp["helper"]),
                         [imp["uri"], imp.get("sqsh") or imp["sif"]], {}, "sqsh" in imp))
        runs += [(rel, [], {}, True) for rel in sorted(self.files) if rel.startswith("steps/")]
        tasks = [(i.name, nodes[i.name][0][1]) for i in self.plan.instances]
        if self.plan.router:
            tasks.append(("router", "router-node"))
        if self.plan.benchmark:
            tasks.append(("bench", "router-node"))
        if "launch/container-task.sh" in self.files:
            for task, node in tasks:
                for fail in (["unsquashfs"], []) if self.runtime == "enroot" else ([],):
                    runs.append(("launch/container-task.sh",
                                 [task, "bash", str(self.job / "launch" / f"{task}.sh")],
                                 {"SLURMD_NODENAME": node, "HPCSERVE_STUB_FAIL": ",".join(fail)},
                                 False))
        for name, rows in nodes.items():
            for r in rows:
                runs.append((f"launch/{name}.sh", [], {"SLURMD_NODENAME": r[1]}, True))
        if self.plan.router:
            runs.append(("launch/router.sh", [], {}, True))
        if self.plan.benchmark:
            runs.append(("launch/bench.sh", [], {}, True))
        for rel, args, extra, must_succeed in runs:
            p = subprocess.run(["bash", str(self.job / rel), *args], env={**env, **extra},
                               cwd=self.cwd, capture_output=True, text=True, timeout=30,
                               stdin=subprocess.DEVNULL)
            if must_succeed and p.returncode != 0:
                self.problems.append(f"{rel} exited {p.returncode}: {p.stderr.strip()[-500:]}")
        self.calls = read_stub_log(self.log)

    def check(self) -> list[str]:
        problems = list(self.problems)
        pwned = [str(p) for d in (self.cwd, self.job, self.home, self.pwn)
                 for p in d.rglob("*") if "PWNED" in p.name]
        if pwned:
            problems.append(f"a command from the config ran: {pwned}")
        try:
            comps = sbatch_components(self.files["job.sbatch"][0])
            sbatch_values = {v for c in comps for _, v in sbatch_options(c) if v is not None}
            if len(comps) != len(self.plan.components):
                problems.append(f"sbatch reads {len(comps)} components")
        except Exception as e:  # noqa: BLE001 - reported below
            problems.append(f"sbatch cannot read job.sbatch: {e}")
            sbatch_values = set()
        words = []
        for c in self.calls:
            words.append(c["path"])
            words += c["argv"]
            words += [v for k, v in c["env"].items() if k != "_"]
        plan_json = self.files["plan.json"][0]
        for p in self.active:
            if p in NOWHERE:
                continue
            want = self.values[p][1]
            if p == ("engine", "image") or p == ("site", "container", "image"):
                want = self._image_as_runtime_takes_it(want)
            if any(want in w for w in words) or want in sbatch_values:
                continue
            if p in PLAN_JSON and json.loads(plan_json)[PLAN_JSON[p]] == want:
                continue
            problems.append(f"{'.'.join(map(str, p))}: {want!r} reached no command, no #SBATCH "
                            "option and not plan.json")
        problems += self._exact()
        return problems

    def _image_as_runtime_takes_it(self, v: str) -> str:
        """Apptainer and enroot take a pyxis-style REGISTRY#IMAGE as a docker:// URI."""
        if self.runtime == "apptainer" and not re.match(r"/|\./|\.\./|[a-z][a-z0-9+.-]*:", v):
            return "docker://" + v.replace("#", "/", 1)
        if self.runtime == "pyxis" and not re.match(r"/|\./|\.\./|[a-z][a-z0-9+.-]*:", v):
            return "docker://" + v  # imported once per job by the helper, as enroot does
        return v

    def _exact(self) -> list[str]:
        """Where a value is a whole argv word or variable, it must be exactly that word."""
        bad = []
        val = {p: w for p, (v, w) in self.values.items() if p in self.active}
        engine_calls = [c for c in self.calls if c["argv"][:2] == ["-m", "sglang.launch_server"]]
        router_calls = [c for c in self.calls
                        if c["argv"][:2] == ["-m", "sglang_router.launch_router"]]
        if not engine_calls or not router_calls:
            return ["the engines' or the router's launch script never reached python"]

        def opt(argv, flag):
            return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]

        for c in engine_calls:
            a = c["argv"]
            role = "prefill" if opt(a, "--disaggregation-mode") == ["prefill"] else "decode"
            for p, flag in ((("model", "path"), "--model-path"),
                            (("model", "served_name"), "--served-model-name")):
                if p in val and opt(a, flag) != [val[p]]:
                    bad.append(f"{flag}: {opt(a, flag)} != [{val[p]!r}]")
            p = ("roles", role, "args")
            if p in val and opt(a, "--chat-template") != [val[p]]:
                bad.append(f"{role} --chat-template: {opt(a, '--chat-template')}")
            for p, var in ((("site", "network", "interface"), "GLOO_SOCKET_IFNAME"),
                           (("site", "network", "ib_devices"), "NCCL_IB_HCA")):
                if p in val and c["env"].get(var) != val[p]:
                    bad.append(f"{var}={c['env'].get(var)!r} != {val[p]!r}")
            if ("site", "network", "ib_devices") in val and \
                    opt(a, "--disaggregation-ib-device") != [val[("site", "network", "ib_devices")]]:
                bad.append(f"--disaggregation-ib-device: {opt(a, '--disaggregation-ib-device')}")
            for p in (("env",), ("site", "network", "env"), ("roles", role, "env")):
                if p in val:
                    key = next(iter(self.values[p][0]))
                    if c["env"].get(key) != val[p]:
                        bad.append(f"{key}={c['env'].get(key)!r} != {val[p]!r}")
        for c in router_calls:
            if ("router", "policy") in val and opt(c["argv"], "--policy") != [val[("router", "policy")]]:
                bad.append(f"--policy: {opt(c['argv'], '--policy')}")
            if ("router", "args") in val and \
                    opt(c["argv"], "--hostile-router-flag") != [val[("router", "args")]]:
                bad.append(f"--hostile-router-flag: {opt(c['argv'], '--hostile-router-flag')}")
            if ("router", "env") in val:
                key = next(iter(self.values[("router", "env")][0]))
                if c["env"].get(key) != val[("router", "env")]:
                    bad.append(f"router {key}={c['env'].get(key)!r}")
        discover = [c for c in self.calls if c["prog"] == "srun" and "discover" in c["argv"]]
        if ("site", "network", "interface") in val:
            for c in discover:
                if opt(c["argv"], "--iface") != [val[("site", "network", "interface")]]:
                    bad.append(f"discover --iface: {opt(c['argv'], '--iface')}")
        bad += self._mounts()
        return bad

    def _mounts(self) -> list[str]:
        """The container mounts parse back into the configured ones and cover the model."""
        if self.runtime in ("none",):
            return []
        specs = []
        for c in self.calls:
            a = c["argv"]
            if c["prog"] == "srun":
                for w in a:
                    if w.startswith("--container-mounts="):
                        specs += [m.split(":")[:2] for m in w.split("=", 1)[1].split(",")]
            elif c["prog"] == "apptainer":
                specs += [a[i + 1].split(":")[:2] for i, w in enumerate(a[:-1]) if w == "--bind"]
            elif c["prog"] == "enroot" and a[:1] == ["start"]:
                specs += [a[i + 1].split(":")[:2] for i, w in enumerate(a[:-1]) if w == "--mount"]
        if not specs:
            return [f"{self.runtime}: no container mounts reached any command"]
        bad = []
        srcs = {s for s, _ in specs}
        mp = ("site", "container", "mounts")
        if mp in self.active:
            want = self.values[mp][1].split(":")
            if want not in specs:
                bad.append(f"configured mount {want} not among {specs}")
        model = self.plan.model_path
        if not any(model == s or model.startswith(s.rstrip("/") + "/") for s in srcs):
            bad.append(f"model path {model!r} not mounted: {specs}")
        return bad


CASES = [(h, RUNTIMES[i % len(RUNTIMES)], i % 2 == 0) for i, h in enumerate(HOSTILE)] + \
        [(MEGA, rt, j % 2 == 0) for j, rt in enumerate(RUNTIMES)]


def _one(args):
    h, runtime, site_side, root = args
    run = Run(h, runtime, root, site_side)
    run.build()
    run.execute()
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    jobs = [(h, rt, side, base / f"case{n}") for n, (h, rt, side) in enumerate(CASES)]
    with ThreadPoolExecutor(max_workers=4) as ex:
        return list(ex.map(_one, jobs))


def test_the_walk_finds_the_string_fields():
    names = {".".join(map(str, lf.path)) for lf in _leaves()}
    for must in ("model.path", "site.slurm.partition", "site.container.mounts", "router.policy",
                 "roles.decode.env", "site.network.ib_devices", "engine.python"):
        assert must in names
    assert len(names) >= 35


@pytest.mark.parametrize("n", range(len(CASES)),
                         ids=[f"{rt}-{h[:20]}" for h, rt, _ in CASES])
def test_hostile_strings_are_refused_or_passed_literally(runs, n):
    run = runs[n]
    problems = run.check()
    assert not problems, f"hostile string {run.h!r} ({run.runtime}):\n" + "\n".join(problems)
    # the scripts really ran: the engine on every node of every instance
    ranks = {(c["env"].get("SGLANG_HOST_IP"), c["argv"][c["argv"].index("--port") + 1])
             for c in run.calls if c["argv"][:2] == ["-m", "sglang.launch_server"]}
    assert len(ranks) == sum(i.nodes for i in run.plan.instances)
    # and most fields took the hostile value (a corpus the config refuses entirely tests nothing)
    assert len(run.active) >= 15, f"only {len(run.active)} fields accepted {run.h!r}"


def test_refusals_are_config_errors_naming_the_field(runs):
    """Every refused value was refused by validation (ConfigError), and the message names it."""
    seen = 0
    for run in runs:
        for p, e in run.refused.items():
            seen += 1
            assert isinstance(e, ConfigError)
            assert e.field, f"{'.'.join(map(str, p))}: error without a field: {e}"
    # names, versions, time limits and choices refuse such strings
    assert seen >= len(runs) * 4


def test_free_text_fields_take_any_string(runs):
    refusable = set()
    for run in runs:
        refusable |= set(run.refused)
    # free-text fields take anything: refusing them would be a bug of its own
    for p in (("model", "served_name"), ("router", "policy"), ("env",), ("site", "slurm", "qos"),
              ("roles", "prefill", "env"), ("site", "network", "env")):
        assert p not in refusable, f"{'.'.join(map(str, p))} refused a hostile string"
