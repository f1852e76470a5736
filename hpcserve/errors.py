"""User-facing errors: each names where the bad value came from (file:line) and the field."""

from __future__ import annotations


class HpcserveError(Exception):
    """An error the CLI reports in one line with exit code 2, never as a traceback."""

    exit_code = 2


class ConfigError(HpcserveError):
    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.message = message
        self.file = file
        self.line = line
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        what = f"{self.field}: " if self.field else ""
        return f"{where}{what}{self.message}"
