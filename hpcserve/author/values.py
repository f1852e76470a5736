"""Value types and name patterns shared by the configuration and the engine adapters.

They live apart from config.py because the engines' settings classes use them while config.py
imports the engines (to know their vocabularies): neither may import the other's module first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Union

from .schema import FieldProblem, doc

NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
FLAG_NAME = r"[a-z0-9][a-z0-9-]*"


@dataclass(frozen=True)
class FromEnv:
    """A value read at run time from the submitting environment (sbatch exports it to the job):
    how secrets are given, by name, so that no file of the job directory ever holds them."""

    from_env: str = field(metadata=doc("the environment variable's name", pattern=ENV_NAME))


EnvValue = Union[str, int, float, bool, FromEnv]
ArgValue = Union[str, int, float, bool, list[Union[str, int, float]], FromEnv, None]

# Names whose values are secrets: a literal one in a config would end up in launch scripts and
# plan.json, readable by everyone who can read the job directory.
_SECRET_ENV = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|"
                         r"SECRET_KEY)$|^HF_TOKEN$", re.IGNORECASE)
_SECRET_ARG = re.compile(r"(^|-)(api-key|password|secret|token)$")


def check_secrets(values: dict, where: str, *, args: bool) -> None:
    for k, v in values.items():
        secret = _SECRET_ARG.search(k) if args else _SECRET_ENV.search(k)
        if secret and v is not None and not isinstance(v, (FromEnv, bool)):
            raise FieldProblem((where, k), f"{k} looks like a secret: a value written here would "
                                           "be copied into the job directory; write "
                                           "{from_env: NAME} and export NAME before submitting")


def looks_secret(name: str) -> bool:
    """Whether a key names a secret (an environment variable's or a flag's name)."""
    return bool(_SECRET_ENV.search(name) or _SECRET_ARG.search(name))
