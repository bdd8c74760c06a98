"""The one exception type users are meant to read.

Every mistake a user can make (a wrong path, an empty corpus, `n_embd` not divisible by `n_head`, a
prompt with unknown characters, ...) is raised as `MiniGPTError` with a single line that says what is
wrong and how to fix it. It subclasses `ValueError`, so library callers can catch it as one. The
command line entry points catch it, print `error: <message>` and exit with status 2 instead of a
traceback. `check_field_types` turns a config value of the wrong type (`seed=abc`) into such a line.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Mapping
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


def _type_name(hint: Any) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if typing.get_origin(hint) is tuple:
        plural = {int: "integers", float: "numbers", str: "strings"}.get(args[0], "values") if args else ""
        return f"a list of {len(args)} {plural}" if args else "a list"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def _fits(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is tuple:  # YAML gives lists
        if not isinstance(value, list | tuple) or (args and Ellipsis not in args and len(value) != len(args)):
            return False
        return all(_fits(v, args[0] if Ellipsis in args else a) for v, a in zip(value, args or value))
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a hint we do not check (the dataclass validates it itself)


def check_field_types(config: Any, section: str, error: type[MiniGPTError] = MiniGPTError) -> None:
    """Raise one `MiniGPTError` line for the first field of dataclass `config` whose value does not have
    its annotated type (e.g. `seed=abc`, `optim.lr=fast`): without this, such values fail later with
    a TypeError traceback deep inside torch or Lightning. `section` prefixes the key (`optim`, `model`;
    "" for top-level keys)."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if not _fits(value, hints[field.name]):
            key = f"{section}.{field.name}" if section else field.name
            raise error(
                f"{key}={value!r} must be {_type_name(hints[field.name])}; "
                "fix it on the command line or in the config"
            )


def check_ints(
    allow_none: bool = False, error: type[MiniGPTError] = MiniGPTError, minimum: int = 1, **values: Any
) -> None:
    """One `error` line for the first value that is not an integer >= `minimum` (default: a positive
    integer; True/False are not integers here); with `allow_none`, None passes (a key whose null means
    "off" or "the default")."""
    for name, value in values.items():
        if value is None and allow_none:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise error(f"{name}={value!r} must be {what}{' or null' if allow_none else ''}")


def build_config(cls: type[T], d: Mapping[str, Any], section: str) -> T:
    """`cls(**d)` for a config dataclass; keys it does not have (a typo in YAML) are one line."""
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise MiniGPTError(f"{section}: unknown key(s) {unknown}; the keys are {', '.join(known)}")
    return cls(**d)
