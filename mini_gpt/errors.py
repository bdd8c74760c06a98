"""The one exception type users are meant to read: `MiniGPTError`, a one-line message that says what is
wrong and how to fix it (a `ValueError`, so library callers can catch it as one). The command-line entry
points print it as `error: <message>` and exit with status 2 (`exit_on_user_error`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from functools import wraps
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class MiniGPTError(ValueError):
    """A user-facing error: the message alone must be enough to fix the problem."""


def exit_on_user_error(fn: F) -> F:
    """Decorate a CLI `main`: a `MiniGPTError` becomes one line on stderr and exit status 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MiniGPTError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper  # type: ignore[return-value]


def at_least(minimum: int, error: type[MiniGPTError] = MiniGPTError, /, **values: int | None) -> None:
    """A schema's range check: one `error` line for the first value below `minimum` (None passes)."""
    for key, value in values.items():
        if value is not None and value < minimum:
            raise error(f"{key}={value} must be >= {minimum}")


def one_of(choices: Collection[str], **values: str) -> None:
    """A schema's choice check: one line for the first value not in `choices`."""
    for key, value in values.items():
        if value not in choices:
            raise MiniGPTError(f"{key}={value!r} must be one of {', '.join(choices)}")
