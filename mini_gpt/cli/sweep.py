"""`mini-gpt sweep hparams_search=NAME [group=option ...] [key=value ...]`: an Optuna study over the
search space of conf/hparams_search/NAME.yaml, every other override fixed for all trials (Hydra syntax, as
for `mini-gpt train`). Start the same command in several terminals, machines or SLURM jobs (shared storage)
to run trials in parallel; run it again after a kill to continue the study. At the end: the table of
trials on the console and in <hparams_search.dir>/trials.csv. See docs/sweeps.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mini_gpt.conf import compose_command_line, exit_with_help_if_asked, group_options, node_help
from mini_gpt.conf.train import StudySettings
from mini_gpt.errors import MiniGPTError, exit_on_user_error


def _train_trial(cfg: Any, callbacks: Sequence[Any]) -> dict[str, Any] | None:
    """Train one trial in its folder; its summary, or None when it failed (the error is in its train.log)."""
    from mini_gpt.train.console_log import run_directory
    from mini_gpt.train.run import train
    from mini_gpt.train.stops import NonFiniteLossError

    run_dir = Path(cfg.paths.run_dir)
    with run_directory(run_dir, keep_unstarted=True):
        try:
            return train(cfg, callbacks=callbacks).summary
        except MiniGPTError as err:
            print(f"error: {err}", file=sys.stderr)
            if isinstance(err, NonFiniteLossError):  # a diverged trial: its summary says so, ranked worst
                return {**json.loads((run_dir / "summary.json").read_text()), "best_val_loss": float("inf")}
            return None


def sweep(overrides: list[str]) -> Any:
    # Lightning (seconds to import) comes with the study, not with --help or a mistyped key
    from mini_gpt.train.sweep import report_table, require_optuna, run_study, study_settings, study_table

    cfg = compose_command_line("train", overrides)  # a mistyped key is reported before a missing extra
    require_optuna()
    settings = study_settings(cfg)
    study = run_study(settings, lambda o: compose_command_line("train", o), overrides, _train_trial)
    sweep_dir = Path(settings.dir)
    report_table(sweep_dir, *study_table(study, sweep_dir), title=f"study {settings.study_name}")
    return study


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if {"--help", "-h"} & set(args):  # what sweep adds first, then train's keys (fixed for all trials)
        about = f"sweep's keys: conf/hparams_search/NAME.yaml ({group_options('hparams_search')})"
        print(node_help(StudySettings, "hparams_search", about))
        print(__doc__)
    exit_with_help_if_asked("train", args)
    exit_on_user_error(sweep)(args)
    return 0
