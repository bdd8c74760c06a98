"""The one exception type users are meant to read: `MiniGPTError`, a one-line message that says what is
wrong and how to fix it (a `ValueError`, so library callers can catch it as one). The command-line entry
points print it as `error: <message>` and exit with status 2 (`exit_on_user_error`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Collection, Mapping
from functools import wraps
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


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


def at_least(minimum: int, **values: int | None) -> None:
    """A schema's range check: one line for the first value below `minimum` (None passes)."""
    for key, value in values.items():
        if value is not None and value < minimum:
            raise MiniGPTError(f"{key}={value} must be >= {minimum}")


def one_of(choices: Collection[str], **values: str) -> None:
    """A schema's choice check: one line for the first value not in `choices`."""
    for key, value in values.items():
        if value not in choices:
            raise MiniGPTError(f"{key}={value!r} must be one of {', '.join(choices)}")


def check_ints(
    allow_none: bool = False, error: type[MiniGPTError] = MiniGPTError, minimum: int = 1, **values: Any
) -> None:
    """One `error` line for the first value that is not an integer >= `minimum` (True/False are not
    integers here); with `allow_none`, None passes (a key whose null means "off" or "the default")."""
    for name, value in values.items():
        if value is None and allow_none:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise error(f"{name}={value!r} must be {what}{' or null' if allow_none else ''}")


def build_config(cls: type[T], d: Mapping[str, Any], section: str) -> T:
    """`cls(**d)` for a config dataclass; keys it does not have (a typo in YAML) are one line, and so is a
    plain ValueError of its checks (the model's GPTConfig raises those: it imports nothing of ours)."""
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise MiniGPTError(f"{section}: unknown key(s) {unknown}; the keys are {', '.join(known)}")
    try:
        return cls(**d)
    except ValueError as err:  # a MiniGPTError as it is
        raise err if isinstance(err, MiniGPTError) else MiniGPTError(str(err)) from None
