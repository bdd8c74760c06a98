"""How a training run can stop early, besides a user error: the exceptions the callbacks raise and the exit
status of a preempted run. Kept free of torch and Lightning: the command line catches them."""

from __future__ import annotations

from mini_gpt.errors import MiniGPTError

# sysexits.h EX_TEMPFAIL, "try again later": not a success (the run is unfinished), not a user error (2).
EXIT_PREEMPTED = 75


class NonFiniteLossError(MiniGPTError):
    """Training produced a NaN/inf loss (summary.json status `nonfinite`)."""


class DivergedError(MiniGPTError):
    """The loss exploded while staying finite (summary.json status `diverged`)."""


class Preempted(Exception):
    """Training stopped on SIGTERM / SIGUSR1 after saving last.ckpt (summary.json status `preempted`, exit
    status EXIT_PREEMPTED); its message is the one line to print."""
