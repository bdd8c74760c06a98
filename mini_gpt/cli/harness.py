"""`mini-gpt harness ARGS`: lm-eval's own command line with `mini-gpt` registered (docs/evaluation.md)."""

from __future__ import annotations

import itertools
import site
import sys
from pathlib import Path

from mini_gpt.errors import MiniGPTError, exit_on_user_error

OLD_HOOK_FILE = "mini_gpt_lm_eval.pth"  # what an older version's `install-hook` wrote into site-packages


def with_default_device(args: list[str]) -> list[str]:
    """`--device auto` for `--model mini-gpt`: lm-eval's default cuda:0 makes a GPU-less machine warn."""
    ours = "--model=mini-gpt" in args or ("--model", "mini-gpt") in itertools.pairwise(args)
    given = any(a == "--device" or a.startswith("--device=") for a in args)
    return [*args, "--device", "auto"] if ours and not given else args


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["install-hook"]:
        raise MiniGPTError(
            "install-hook is gone: `mini-gpt harness --model mini-gpt ...` registers the model itself, "
            "and the plain lm_eval command cannot load plugins"
        )
    if args[:1] == ["uninstall-hook"]:
        folders = [*site.getsitepackages(), site.getusersitepackages()]
        removed = [path for d in folders if (path := Path(d) / OLD_HOOK_FILE).is_file()]
        for path in removed:
            path.unlink()
        print(f"removed {', '.join(map(str, removed))}" if removed else f"no {OLD_HOOK_FILE} to remove")
        return
    hub = None
    if any(a in ("--tasks", "-t") or a.startswith("--tasks=") for a in args):  # a run, not `ls` or --help
        from mini_gpt.data.sources import offline_if_hub_unreachable

        hub = offline_if_hub_unreachable()  # before lm-eval imports `datasets`: then it reads the switch
    # Imported here: lm-eval is an optional extra (its absence is a one-line error) and slow to import.
    from mini_gpt.eval import harness

    harness.register()  # importing it registered `mini-gpt` already; a second call changes nothing
    from lm_eval.__main__ import cli_evaluate  # what the `lm_eval` console script runs

    sys.argv = ["lm_eval", *with_default_device(args)]  # cli_evaluate parses sys.argv
    try:
        cli_evaluate()
    except ConnectionError as err:  # from `datasets`: a task's data neither cached nor reachable
        unreachable = f"; the Hugging Face Hub is unreachable ({hub}), so lm-eval ran offline" if hub else ""
        raise MiniGPTError(
            f"{err}{unreachable}; lm-eval fetches a task's data on first use: run the task once where there "
            "is network (the Hugging Face cache keeps it), copy that cache here and point HF_DATASETS_CACHE "
            "at it, or write a task YAML over local files and pass --include_path DIR (docs/evaluation.md)"
        ) from None
