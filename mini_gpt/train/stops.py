"""How a run stops early besides a user error; free of torch and Lightning: the command line catches them."""

from __future__ import annotations

from mini_gpt.errors import MiniGPTError

# sysexits.h EX_TEMPFAIL, "try again later": not a success (the run is unfinished), not a user error (2).
EXIT_PREEMPTED = 75


class NonFiniteLossError(MiniGPTError):
    """Training produced a NaN/inf loss (summary.json status `nonfinite`)."""


class DivergedError(MiniGPTError):
    """The loss exploded while staying finite (summary.json status `diverged`)."""


class Preempted(Exception):
    """Stopped on SIGTERM / SIGUSR1 after saving last.ckpt; its message is the one line to print."""
