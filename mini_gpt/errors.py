"""`MiniGPTError` (a `ValueError`): the one-line message a user reads, printed by the command-line entry
points as `error: <message>` with exit status 2; the package's own warnings as one `warning:` line."""

from __future__ import annotations

import importlib
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


def import_extra(module: str, missing: str) -> Any:
    """`module`, or the error line `missing` (how to install it) where its optional extra is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MiniGPTError(missing) from err


def exit_on_user_error(fn: F) -> F:
    """Decorate a CLI `main`: a `MiniGPTError` is one line on stderr and exit status 2; warnings one line."""

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
    """The package's warnings as one line, without Python's file:line (other libraries' keep it)."""
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
