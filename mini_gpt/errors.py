"""The one exception type users are meant to read: `MiniGPTError`, a one-line message that says what is
wrong and how to fix it (a `ValueError`, so library callers can catch it as one). The command-line entry
points print it as `error: <message>` and exit with status 2 (`exit_on_user_error`), and the package's own
warnings as one `warning: <message>` line.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Collection
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
PACKAGE_DIR = Path(__file__).resolve().parent
PYTHON_FORMAT_WARNING = warnings.formatwarning


class MiniGPTError(ValueError):
    """A user-facing error: the message alone must be enough to fix the problem."""


def exit_on_user_error(fn: F) -> F:
    """Decorate a CLI `main`: a `MiniGPTError` becomes one line on stderr and exit status 2, and from then
    on the package's warnings are one line each (`format_warning`)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        warnings.formatwarning = format_warning
        try:
            return fn(*args, **kwargs)
        except MiniGPTError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper  # type: ignore[return-value]


def format_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    """The package's warnings (stray bytes in a corpus, ...) as one line, without Python's file:line and the
    source line that mean nothing to a user; other libraries' warnings keep Python's format."""
    if Path(filename).resolve().is_relative_to(PACKAGE_DIR):
        return f"warning: {message}\n"
    return PYTHON_FORMAT_WARNING(message, category, filename, lineno, line)


def at_least(minimum: int, error: type[MiniGPTError] = MiniGPTError, /, **values: int | None) -> None:
    """A schema's range check: one `error` line for the first value below `minimum` (None passes)."""
    for key, value in values.items():
        if value is not None and value < minimum:
            raise error(f"{key}={value} must be >= {minimum}")


def threads_setting(threads: Any) -> Any:
    """`threads=` of train and the tools: "auto" (null too: what configs saved before it hold) or N >= 1."""
    if threads is None:
        return "auto"
    if threads != "auto" and (type(threads) is not int or threads < 1):
        raise MiniGPTError(f"threads={threads!r} must be auto or a positive integer")
    return threads


def one_of(choices: Collection[str], **values: str) -> None:
    """A schema's choice check: one line for the first value not in `choices`."""
    for key, value in values.items():
        if value not in choices:
            raise MiniGPTError(f"{key}={value!r} must be one of {', '.join(choices)}")
