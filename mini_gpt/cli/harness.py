"""`mini-gpt harness ARGS`: lm-eval's own command line with `mini-gpt` registered as a model (see
`mini_gpt.eval.harness` for why the `lm_eval` command cannot find it)."""

from __future__ import annotations

import itertools
import sys

from mini_gpt.errors import MiniGPTError, exit_on_user_error

__all__ = ["main", "with_default_device"]


def with_default_device(args: list[str]) -> list[str]:
    """`--device auto` added for `--model mini-gpt` when no device is given: lm-eval's own default is
    cuda:0, which on a machine without a GPU would make the model warn about a device nobody asked for."""
    ours = "--model=mini-gpt" in args or ("--model", "mini-gpt") in itertools.pairwise(args)
    given = any(a == "--device" or a.startswith("--device=") for a in args)
    return [*args, "--device", "auto"] if ours and not given else args


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    """Run lm-eval's command line on `argv` (default: this process's arguments), in this process."""
    # Imported here: lm-eval is an optional extra (its absence is a one-line error) and slow to import.
    from mini_gpt.eval import harness

    harness.register()  # importing it registered `mini-gpt` already; a second call changes nothing
    from lm_eval.__main__ import cli_evaluate  # what the `lm_eval` console script runs

    args = list(sys.argv[1:] if argv is None else argv)
    sys.argv = ["lm_eval", *with_default_device(args)]  # cli_evaluate parses sys.argv
    try:
        cli_evaluate()
    except ConnectionError as err:  # from `datasets`: a task's data neither cached nor reachable
        raise MiniGPTError(
            f"{err}; lm-eval fetches a task's data on first use: run the task once where there is network "
            "(the Hugging Face cache keeps it), or copy that cache here and point HF_DATASETS_CACHE at it"
        ) from None
