"""The one exception type users are meant to read.

Every mistake a user can make (a wrong path, an empty corpus, `n_embd` not divisible by `n_head`, a
prompt with unknown characters, ...) is raised as `MiniGPTError` with a single line that says what is
wrong and how to fix it. It subclasses `ValueError`, so library callers can catch it as one. The
command line entry points catch it, print `error: <message>` and exit with status 2 instead of a
traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
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
