"""`python -m hpcserve`: the `hpcserve` command, for a Python whose scripts are not on PATH."""

from .cli import run

run()
