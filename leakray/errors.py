"""Errors that name where bad input came from."""

from __future__ import annotations


class BadInput(ValueError):
    """Refused input, with the file, row and field that made it bad."""

    def __init__(self, message: str, *, path: str | None = None, row: int | str | None = None,
                 field: str | None = None):
        where = ", ".join(
            part for part in (
                f"{path}" if path else None,
                f"row {row}" if row is not None else None,
                f"field '{field}'" if field else None,
            ) if part
        )
        super().__init__(f"{where}: {message}" if where else message)
        self.path, self.row, self.field = path, row, field


class MissingExtra(ImportError):
    """A heavy optional dependency is absent; says the exact install line."""

    def __init__(self, module: str, extra: str):
        super().__init__(f"{module} is not installed; install it with: pip install 'leakray[{extra}]'")
