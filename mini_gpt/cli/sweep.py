"""`mini-gpt sweep hparams_search=NAME [group=option ...] [key=value ...]`: an Optuna study over the
search space of conf/hparams_search/NAME.yaml, every other override fixed for all trials (Hydra syntax, as
for `mini-gpt train`). Start the same command in several terminals, machines or SLURM jobs (shared storage)
to run trials in parallel; run it again after a kill to continue the study. At the end: the table of
trials on the console and in <hparams_search.dir>/trials.csv. See docs/sweeps.md.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mini_gpt.conf import compose_command_line, exit_with_help_if_asked
from mini_gpt.errors import MiniGPTError, exit_on_user_error
from mini_gpt.train.study import StudySettings, require_optuna, run_study
from mini_gpt.train.sweeps import TABLE_FILE, render_table

HELP = __doc__


def _train_trial(cfg: Any, callbacks: Sequence[Any]) -> dict[str, Any] | None:
    """Train one trial in its folder; its summary, or None when it failed (the error is in its train.log)."""
    from mini_gpt.train.console_log import run_directory
    from mini_gpt.train.run import train
    from mini_gpt.train.stops import NonFiniteLossError

    run_dir = Path(cfg.paths.run_dir)
    with run_directory(run_dir, keep_unstarted=True):
        try:
            return train(cfg, callbacks=callbacks).summary
        except NonFiniteLossError as err:  # a diverged trial: its summary says so, ranked worst
            print(f"error: {err}", file=sys.stderr)
            return {**json.loads((run_dir / "summary.json").read_text()), "best_val_loss": float("inf")}
        except MiniGPTError as err:
            print(f"error: {err}", file=sys.stderr)
            return None


def _summary(trial_dir: Path) -> dict[str, Any]:
    path = trial_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def trials_rows(study: Any, sweep_dir: Path) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the study's trials: params with 4 significant digits, best marked."""
    trials = study.get_trials(deepcopy=False)
    keys = sorted({k for t in trials for k in t.params})
    try:
        best = study.best_trial.number
    except ValueError:  # no completed trial
        best = None
    header = ["trial", *keys, "state", "best_val_loss", "steps", "wall_seconds", "best"]
    body = []
    for t in trials:
        summary = _summary(sweep_dir / str(t.number))
        wall = summary.get("wall_seconds")
        body.append(
            [
                str(t.number),
                *(
                    f"{t.params[k]:.4g}" if isinstance(t.params.get(k), float) else str(t.params.get(k, "-"))
                    for k in keys
                ),
                t.state.name.lower(),
                "-" if t.value is None else f"{t.value:.4f}",
                str(summary.get("steps", "-")),
                "-" if wall is None else f"{wall:.1f}",
                "*" if t.number == best else "",
            ]
        )
    return header, body


def sweep(argv: Sequence[str]) -> Any:
    require_optuna()
    overrides = list(argv)
    cfg = compose_command_line("train", overrides)
    settings = StudySettings.from_config(cfg)
    study = run_study(settings, lambda o: compose_command_line("train", o), overrides, _train_trial)
    sweep_dir = Path(settings.dir)
    header, body = trials_rows(study, sweep_dir)
    path = sweep_dir / TABLE_FILE
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([header, *body])
    print(f"\ntrials of study {settings.study_name} (also in {path}):\n{render_table(header, body)}")
    return study


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if {"--help", "-h"} & set(args):
        print(HELP)
    exit_with_help_if_asked("train", args)
    exit_on_user_error(sweep)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
