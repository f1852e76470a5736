"""An engine's flag matrix: which flags each release accepts, and the words of named settings.

Every engine adapter keeps the flag sets of the releases it knows as data (engines/data/<engine>_
flags.json, extracted from the release wheels by a script in tools/). This module is what the
adapters share: picking the release for a configured version, spelling a named setting with the
first spelling whose flags the release has (and has not deprecated), and checking raw `args`
(refused when the release lacks the flag, naming the releases that have it and the setting that
replaces it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from .. import package_data
from ..errors import echo
from ..author.words import Var, Word

DATA = package_data.path("engines", "data")


class FlagError(Exception):
    """A setting the configured release cannot express; `key` names the offending setting,
    relative to the role (or to `engine`, `router`) it belongs to."""

    def __init__(self, key: tuple, message: str):
        self.key = key
        self.message = message
        super().__init__(message)


def vkey(v: str) -> tuple:
    """Sort key of a release: 1.0.0rc3 < 1.0.0 < 1.0.0.post1 < 1.0.1."""
    base, rc, pre = v.partition("rc")
    out = []
    for part in base.replace("post", ".post.").split("."):
        if part == "post" or not part:
            continue
        out.append(int(part))
    if rc:
        return tuple(out[:3]) + (-2, int(pre or 0))
    # 0.5.2 < 0.5.2.post1: pad so a post release sorts after its base
    return tuple(out[:3]) + ((out[3],) if len(out) > 3 else (-1,))


@lru_cache(maxsize=None)
def _load(filename: str) -> dict:
    with open(DATA / filename, encoding="utf-8") as f:
        return json.load(f)["versions"]


@dataclass(frozen=True)
class Release:
    engine: str           # the engine's title, for messages ("SGLang")
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

    def at_least(self, version: str) -> bool:
        return vkey(self.data_version) >= vkey(version)


@dataclass(frozen=True)
class FlagMatrix:
    title: str      # "SGLang"
    filename: str   # under engines/data/
    # The releases hpcserve accepts (engine.version, engine.check_flags_as, an upgrade's target):
    # those whose flags its tests check with the release's own parser. None: every release in
    # the table. A release only in the table is refused by name (its flags stay as data).
    checked: tuple[str, ...] | None = None

    def versions(self) -> dict:
        return _load(self.filename)

    def data(self, rel: "Release") -> dict:
        """Everything the table holds for a release beyond its flags (an options file's
        fields, a server's bool-from-text options)."""
        return self.versions()[rel.data_version]

    def known_versions(self) -> list[str]:
        """The releases hpcserve accepts, oldest first."""
        m = self.versions()
        return sorted((v for v in m if self.checked is None or v in self.checked), key=vkey)

    def versions_having(self, flag: str) -> list[str]:
        """Every release of the table with `flag`, accepted or not (a message's history)."""
        m = self.versions()
        return [v for v in sorted(m, key=vkey) if flag in m[v]["flags"]]

    def table_only(self, version: str) -> str:
        """Why a release the table has is not accepted, in words."""
        return (f"{self.title} {echo(version)} is no longer accepted: hpcserve's tests cannot "
                "check its flags with its own parser; the releases it accepts are "
                + ", ".join(self.known_versions()))

    def nearest(self, version: str) -> str:
        """The known releases closest below and above `version`, in words."""
        known = self.known_versions()
        below = [v for v in known if vkey(v) < vkey(version)]
        above = [v for v in known if vkey(v) > vkey(version)]
        if not above:
            return f"the newest it knows is {known[-1]}"
        if not below:
            return f"the oldest it knows is {known[0]}"
        return f"the nearest it knows are {below[-1]} and {above[0]}"

    def release(self, version: str, check_as: str | None = None) -> Release:
        """The release whose flags `version` is spelled with: its own, or for a release the
        table lacks, the one `check_as` names (engine.check_flags_as); refused without it,
        since flags that moved between releases would be spelled wrong."""
        m = self.versions()
        if version in m and version in self.known_versions():
            return self._release(version, version)
        if version in m and check_as is None:
            raise FlagError(("engine", "version"), self.table_only(version))
        if check_as is None:
            raise FlagError(("engine", "version"),
                            f"{self.title} {echo(version)} is not in hpcserve's flag matrix "
                            f"({self.nearest(version)}): set engine.check_flags_as: newest "
                            "(or a known release) to check its flags against that one")
        use = self.known_versions()[-1] if check_as == "newest" else check_as
        if use in m and use not in self.known_versions():
            raise FlagError(("engine", "check_flags_as"), self.table_only(use))
        if use not in m:
            raise FlagError(("engine", "check_flags_as"),
                            f"{self.title} {echo(use)} is not in hpcserve's flag matrix "
                            f"({self.nearest(use)}): name a release it knows, or newest")
        return self._release(version, use, f"{self.title} {version} is not in hpcserve's flag "
                                            f"matrix: its flags are checked against {use} "
                                            f"(engine.check_flags_as: {check_as})")

    def _release(self, version: str, use: str, note: str | None = None) -> Release:
        d = self.versions()[use]
        return Release(self.title, version, use, frozenset(d["flags"]),
                       frozenset(d.get("deprecated", [])), d.get("choices", {}), note)


def fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def flags_of(words: list[Word]) -> list[str]:
    return [w for w in words if isinstance(w, str) and w.startswith("--")]


# A named setting's spellings, newest first: each maps the value to argv words.
Spelling = Callable[[Any], list]


@dataclass(frozen=True)
class Vocabulary:
    """How an engine spells its named settings (in argv order) and guards its raw `args`."""

    spellings: tuple[tuple[str, tuple[Spelling, ...]], ...]
    owned: Mapping[str, str]    # flag -> the setting that sets it (hpcserve derives it)
    legacy: Mapping[str, str]   # old flag -> what to write instead ("(...)" = explanation only)

    def spell(self, rel: Release, setting: str, value: Any) -> list:
        """The argv words for one named setting in this release."""
        candidates = [s(value) for s in dict(self.spellings)[setting]]
        for words in candidates:
            if rel.fresh(*flags_of(words)):
                return check_choices(rel, words, (setting,))
        for words in candidates:
            if rel.has(*flags_of(words)):
                return check_choices(rel, words, (setting,))
        wanted = " or ".join(" ".join(flags_of(w)) for w in candidates if flags_of(w))
        raise FlagError((setting,), f"{rel.engine} {rel.version} has no flag for {setting} "
                                    f"(looked for {wanted})")

    def raw_arg(self, rel: Release, matrix: FlagMatrix, name: str, value: Any) -> list:
        """Words for one entry of `args`, refusing flags the release lacks or hpcserve owns."""
        flag = "--" + name
        key = ("args", name)
        if flag in self.owned:
            raise FlagError(key, f"{flag} is set by hpcserve from the plan; use "
                                 f"{self.owned[flag]} instead")
        if flag not in rel.flags:
            have = matrix.versions_having(flag)
            msg = f"{rel.engine} {rel.version} has no {flag}"
            if have:
                msg += f" (it exists in {have[0]}..{have[-1]} of the releases in its flag table)"
            if flag in self.legacy:
                msg += f"; write {self.legacy[flag]} and hpcserve spells it for {rel.version}"
            raise FlagError(key, msg)
        if flag in self.legacy and not self.legacy[flag].startswith("("):
            raise FlagError(key, f"write {self.legacy[flag]} instead of args.{name}: hpcserve "
                                 f"spells it for each {rel.engine} release")
        check_not_empty(key, flag, value)
        return arg_words(flag, value, lambda words: check_choices(rel, words, key))

    def settings_argv(self, rel: Release, matrix: FlagMatrix,
                      settings: dict[str, Any]) -> tuple[list, list[str]]:
        """(words, warnings) of every named setting that has a value, then of `args`."""
        w: list = []
        used: dict[str, str] = {}
        warnings: list[str] = []
        for name, _ in self.spellings:
            v = settings.get(name)
            if v is None:
                continue
            words = self.spell(rel, name, v)
            for f in flags_of(words):
                if f in used:
                    raise FlagError((name,), f"in {rel.engine} {rel.version}, {name} and "
                                             f"{used[f]} both need {f}; set only one")
                used[f] = name
                if f in rel.deprecated:
                    warnings.append(f"{f} ({name}) is deprecated in {rel.engine} {rel.version}")
            w += words
        for name, value in settings.get("args", {}).items():
            words = self.raw_arg(rel, matrix, name, value)
            if words and isinstance(words[0], str) and words[0] in used:
                raise FlagError(("args", name), f"{words[0]} is already set by "
                                                f"{used[words[0]]}")
            if words and words[0] in rel.deprecated:
                warnings.append(f"{words[0]} is deprecated in {rel.engine} {rel.version}")
            w += words
        return w, warnings


def check_choices(rel: Release, words: list, key: tuple) -> list:
    for i, w in enumerate(words[:-1]):
        ch = rel.choices.get(w) if isinstance(w, str) else None
        nxt = words[i + 1]
        if ch and isinstance(nxt, str) and not nxt.startswith("--") and nxt not in ch:
            raise FlagError(key, f"{nxt!r} is not a valid {w} in {rel.engine} {rel.version}; "
                                 f"choices: {', '.join(ch)}")
    return words


def check_not_empty(key: tuple, flag: str, value: Any) -> None:
    if isinstance(value, list) and not value:
        raise FlagError(key, f"an empty list gives {flag} no value; write true for a bare flag "
                             "or null to leave it out")


def arg_words(flag: str, value: Any, check: Callable[[list], list] = lambda w: w) -> list:
    """A raw flag with its value: true = bare flag, false/None = absent, a list = several values,
    {from_env: NAME} = a secret expanded in the task, never written."""
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    if hasattr(value, "from_env"):
        return [flag, (Var(value.from_env, secret=True),)]
    if isinstance(value, list):
        return check([flag, *map(fmt, value)])
    return check([flag, fmt(value)])
