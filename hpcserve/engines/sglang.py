"""SGLang: the version-correct launch_server argv and the sglang-router argv.

The flags each SGLang release accepts come from `data/sglang_flags.json`, extracted from the
release wheels by tools/extract_sglang_flags.py and checked against the real parser in tests.
Named settings are spelled per version by picking the first spelling whose flags all exist (and
are not deprecated) in the configured release; raw `args` are refused when the release lacks
them, with the release range that has them and the named setting that replaces them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from ..words import Var, Word

DATA = Path(__file__).resolve().parent / "data" / "sglang_flags.json"

# Flags hpcserve derives from the plan; a user setting them in `args` would break the topology.
OWNED = {
    "--model-path": "model.path", "--model": "model.path",
    "--served-model-name": "model.served_name",
    "--host": "site.network.interface", "--port": "roles.<role>.port",
    "--dist-init-addr": "roles.<role>.dist_init_port", "--nccl-init-addr": "roles.<role>.dist_init_port",
    "--nnodes": "roles.<role>.nodes", "--node-rank": "(computed in the task)",
    "--disaggregation-mode": "the role name", "--disaggregation-bootstrap-port": "roles.<role>.bootstrap_port",
    "--disaggregation-ib-device": "site.network.ib_devices",
    "--tp-size": "tp", "--tensor-parallel-size": "tp", "--tp": "tp",
    "--pp-size": "pp", "--dp-size": "dp or attn_dp", "--data-parallel-size": "dp",
    "--attn-dp-size": "attn_dp", "--attention-data-parallel-size": "attn_dp",
    "--enable-dp-attention": "attn_dp", "--ep-size": "ep", "--ep": "ep",
    "--expert-parallel-size": "ep", "--nccl-port": "(allocated by hpcserve's port registry)",
}

# Old flags whose meaning a named setting now carries, so an error can say what to write.
LEGACY = {
    "--enable-deepep-moe": "moe_a2a_backend: deepep",
    "--enable-ep-moe": "ep: <tp>",
    "--cuda-graph-max-bs": "cuda_graph_max_bs: N",
    "--cuda-graph-bs": "cuda_graph_bs: [N, ...]",
    "--cuda-graph-max-bs-decode": "cuda_graph_max_bs: N",
    "--cuda-graph-bs-decode": "cuda_graph_bs: [N, ...]",
    "--disable-cuda-graph": "disable_cuda_graph: true",
    "--ep-num-redundant-experts": "redundant_experts: N",
    "--deepep-mode": "deepep_mode: ...",
    "--moe-a2a-backend": "moe_a2a_backend: ...",
    "--disaggregation-decode-tp": "(removed: decode TP is the decode instance's own tp)",
    "--disaggregation-decode-dp": "(removed: decode DP is the decode instance's own attn_dp)",
}


class FlagError(Exception):
    """A setting the configured release cannot express; `key` names the offending setting."""

    def __init__(self, key: tuple, message: str):
        self.key = key
        self.message = message
        super().__init__(message)


def vkey(v: str) -> tuple:
    out = []
    for part in v.replace("post", ".post.").split("."):
        if part == "post" or not part:
            continue
        out.append(int(part))
    # 0.5.2 < 0.5.2.post1: pad so a post release sorts after its base
    return tuple(out[:3]) + ((out[3],) if len(out) > 3 else (-1,))


@lru_cache(maxsize=1)
def _matrix() -> dict:
    with open(DATA, encoding="utf-8") as f:
        return json.load(f)["versions"]


@dataclass(frozen=True)
class Release:
    version: str          # as configured
    data_version: str     # the release whose flag set is used
    flags: frozenset
    deprecated: frozenset
    choices: dict
    note: str | None = None

    def has(self, *flags: str) -> bool:
        return all(f in self.flags for f in flags)

    def fresh(self, *flags: str) -> bool:
        return self.has(*flags) and not any(f in self.deprecated for f in flags)


def known_versions() -> list[str]:
    return sorted(_matrix(), key=vkey)


def release(version: str) -> Release:
    m = _matrix()
    note = None
    use = version
    if version not in m:
        older = [v for v in known_versions() if vkey(v) <= vkey(version)]
        if not older:
            raise FlagError(("engine", "version"),
                            f"SGLang {version} is older than every release hpcserve knows "
                            f"({', '.join(known_versions())})")
        use = older[-1]
        note = (f"SGLang {version} is not in hpcserve's flag matrix; flags are checked against "
                f"{use}, the closest older release it knows")
    d = m[use]
    return Release(version, use, frozenset(d["flags"]), frozenset(d.get("deprecated", [])),
                   d.get("choices", {}), note)


def versions_having(flag: str) -> list[str]:
    return [v for v in known_versions() if flag in _matrix()[v]["flags"]]


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


# Named settings: (setting, [spelling, ...]); a spelling maps the value to argv words.
Spelling = Callable[[Any], list[str]]
SPELLINGS: list[tuple[str, list[Spelling]]] = [
    ("tp", [lambda v: ["--tp-size", _fmt(v)]]),
    ("pp", [lambda v: ["--pp-size", _fmt(v)]]),
    ("attn_dp", [lambda v: ["--attn-dp-size", _fmt(v)],
                 lambda v: ["--dp-size", _fmt(v), "--enable-dp-attention"]]),
    ("dp", [lambda v: ["--dp-size", _fmt(v)]]),
    ("ep", [lambda v: ["--ep-size", _fmt(v)]]),
    ("moe_a2a_backend", [lambda v: ["--moe-a2a-backend", v],
                         # before --moe-a2a-backend (<= 0.4.9): DeepEP was a switch, none the default
                         lambda v: ["--enable-deepep-moe"] if v == "deepep" else
                         [] if v == "none" else ["--moe-a2a-backend", v]]),
    ("deepep_mode", [lambda v: ["--deepep-mode", v]]),
    ("redundant_experts", [lambda v: ["--ep-num-redundant-experts", _fmt(v)]]),
    ("cuda_graph_max_bs", [lambda v: ["--cuda-graph-max-bs-decode", _fmt(v)],
                           lambda v: ["--cuda-graph-max-bs", _fmt(v)]]),
    ("cuda_graph_bs", [lambda v: ["--cuda-graph-bs-decode", *map(_fmt, v)],
                       lambda v: ["--cuda-graph-bs", *map(_fmt, v)]]),
    ("disable_cuda_graph", [lambda v: ["--cuda-graph-backend-decode", "disabled",
                                       "--cuda-graph-backend-prefill", "disabled"] if v else [],
                            lambda v: ["--disable-cuda-graph"] if v else []]),
    ("mem_fraction_static", [lambda v: ["--mem-fraction-static", _fmt(v)]]),
    ("max_running_requests", [lambda v: ["--max-running-requests", _fmt(v)]]),
    ("context_length", [lambda v: ["--context-length", _fmt(v)]]),
    ("chunked_prefill_size", [lambda v: ["--chunked-prefill-size", _fmt(v)]]),
    ("tool_call_parser", [lambda v: ["--tool-call-parser", v]]),
    ("reasoning_parser", [lambda v: ["--reasoning-parser", v]]),
    ("trust_remote_code", [lambda v: ["--trust-remote-code"] if v else []]),
]
SETTING_ORDER = [name for name, _ in SPELLINGS]


def _flags_of(words: list[str]) -> list[str]:
    return [w for w in words if w.startswith("--")]


def spell(rel: Release, setting: str, value: Any) -> list[str]:
    """The argv words for one named setting in this release."""
    options = dict(SPELLINGS)[setting]
    candidates = [s(value) for s in options]
    for words in candidates:
        if rel.fresh(*_flags_of(words)):
            return check_choices(rel, words, (setting,))
    for words in candidates:
        if rel.has(*_flags_of(words)):
            return check_choices(rel, words, (setting,))
    wanted = " or ".join(" ".join(_flags_of(w)) for w in candidates if _flags_of(w))
    raise FlagError((setting,), f"SGLang {rel.version} has no flag for {setting} "
                                f"(looked for {wanted})")


def check_choices(rel: Release, words: list[str], key: tuple) -> list[str]:
    for i, w in enumerate(words[:-1]):
        ch = rel.choices.get(w)
        nxt = words[i + 1]
        if ch and not nxt.startswith("--") and nxt not in ch:
            raise FlagError(key, f"{nxt!r} is not a valid {w} in SGLang {rel.version}; "
                                 f"choices: {', '.join(ch)}")
    return words


def raw_arg(rel: Release, name: str, value: Any) -> list[str]:
    """Words for one entry of `args`, refusing flags the release lacks or hpcserve owns."""
    flag = "--" + name
    key = ("args", name)
    if flag in OWNED:
        raise FlagError(key, f"{flag} is set by hpcserve from the plan; use {OWNED[flag]} instead")
    if flag not in rel.flags:
        have = versions_having(flag)
        msg = f"SGLang {rel.version} has no {flag}"
        if have:
            msg += f" (it exists in {have[0]}..{have[-1]} of the releases hpcserve knows)"
        if flag in LEGACY:
            msg += f"; write {LEGACY[flag]} and hpcserve spells it for {rel.version}"
        raise FlagError(key, msg)
    if flag in LEGACY and not LEGACY[flag].startswith("("):
        raise FlagError(key, f"write {LEGACY[flag]} instead of args.{name}: hpcserve spells it "
                             f"for each SGLang release")
    if value is False:
        return []
    if value is True:
        return [flag]
    if hasattr(value, "from_env"):  # a secret: expanded in the task, never written
        return [flag, (Var(value.from_env),)]
    if isinstance(value, list):
        return check_choices(rel, [flag, *map(_fmt, value)], key)
    return check_choices(rel, [flag, _fmt(value)], key)


@dataclass(frozen=True)
class ServerArgv:
    words: list[Word]
    warnings: list[str]


def server_argv(rel: Release, *, model_path: str, served_name: str | None, mode: str | None,
                port: int, bootstrap_port: int | None, ib_device: Word | None,
                nnodes: int, dist_init_port: int, nccl_port: int | None,
                settings: dict[str, Any]) -> ServerArgv:
    """The launch_server argv of one instance; node-specific parts are Vars resolved in the task."""
    w: list[Word] = ["--model-path", model_path]
    if served_name:
        w += ["--served-model-name", served_name]
    w += ["--host", (Var("NODE_IP"),), "--port", str(port)]
    if mode:
        w += ["--disaggregation-mode", mode]
        if mode == "prefill" and bootstrap_port is not None:
            w += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
        if ib_device is not None:
            w += ["--disaggregation-ib-device", ib_device]
    if nnodes > 1:
        w += ["--dist-init-addr", (Var("LEADER_IP"), f":{dist_init_port}"),
              "--nnodes", str(nnodes), "--node-rank", (Var("NODE_RANK"),)]
    if nccl_port is not None:
        w += ["--nccl-port", str(nccl_port)]
    used: dict[str, str] = {}
    warnings: list[str] = []
    for name in SETTING_ORDER:
        v = settings.get(name)
        if v is None:
            continue
        words = spell(rel, name, v)
        for f in _flags_of(words):
            if f in used:
                raise FlagError((name,), f"in SGLang {rel.version}, {name} and {used[f]} both "
                                         f"need {f}; set only one")
            used[f] = name
            if f in rel.deprecated:
                warnings.append(f"{f} ({name}) is deprecated in SGLang {rel.version}")
        w += words
    for name, value in settings.get("args", {}).items():
        words = raw_arg(rel, name, value)
        if words and isinstance(words[0], str) and words[0] in used:
            raise FlagError(("args", name), f"{words[0]} is already set by {used[words[0]]}")
        if words and words[0] in rel.deprecated:
            warnings.append(f"{words[0]} is deprecated in SGLang {rel.version}")
        w += words
    return ServerArgv(w, warnings)


def server_module() -> list[str]:
    return ["-m", "sglang.launch_server"]


# sglang-router flags the plan writes; repeating one in router.args would silently win.
ROUTER_OWNED = {"--host", "--port", "--pd-disaggregation", "--prefill", "--decode",
                "--worker-urls", "--policy", "--prometheus-host", "--prometheus-port"}


def router_argv(*, pd: bool, prefill: list[tuple[Word, int]], decode: list[Word],
                workers: list[Word], port: int, prometheus_port: int, policy: str,
                args: dict[str, Any]) -> list[Word]:
    """sglang-router (0.3.x) argv: every prefill URL with its bootstrap port, every decode URL."""
    w: list[Word] = []
    if pd:
        w.append("--pd-disaggregation")
        for url, bport in prefill:
            w += ["--prefill", url, str(bport)]
        for url in decode:
            w += ["--decode", url]
    else:
        w.append("--worker-urls")
        w += workers
    w += ["--host", "0.0.0.0", "--port", str(port), "--policy", policy,
          "--prometheus-host", "0.0.0.0", "--prometheus-port", str(prometheus_port)]
    for name, value in args.items():
        if "--" + name in ROUTER_OWNED:
            raise FlagError(("args", name), f"--{name} is set by hpcserve from the plan (router "
                                            "port/policy, worker URLs); use the router's own keys")
        if value is None or value is False:
            continue
        if hasattr(value, "from_env"):  # a secret: expanded in the task, never written
            w += ["--" + name, (Var(value.from_env),)]
            continue
        w += ["--" + name] if value is True else ["--" + name, *map(_fmt, value)] if isinstance(
            value, list) else ["--" + name, _fmt(value)]
    return w
