"""`mini-gpt train [group=option ...] [key=value ...]` (= `python train.py ...`): a Hydra app on
conf/train.yaml, so Hydra's flags work too (`-m` sweeps, `--cfg job`, `hydra.*` keys). The run itself is
`mini_gpt.train.run.train`; here a user error becomes one `error:` line (exit status 2), except in a
sweep, where a failing trial raises (the sweeper records it) and a NaN loss returns +inf, never NaN.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import hydra
from omegaconf import DictConfig

from mini_gpt.conf import CONF_DIR, exit_on_bad_overrides, exit_with_help_if_asked, register_resolvers
from mini_gpt.errors import MiniGPTError

register_resolvers()


# Hydra names the job after this module ("train"): runs go to outputs/train/runs/..., as from train.py.
@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def train_app(cfg: DictConfig) -> float | None:
    from mini_gpt.train.callbacks import EXIT_PREEMPTED, DivergedError, NonFiniteLossError, Preempted
    from mini_gpt.train.resume import resumed_config
    from mini_gpt.train.run import hydra_trial, launcher_rank, run_directory, sweep_objective, train

    in_sweep = hydra_trial() is not None
    with run_directory(cfg.paths.run_dir, keep_unstarted=in_sweep, output_dir=cfg.paths.output_dir):
        try:
            result = train(resumed_config(cfg))  # ckpt_path=...: the run's own config + the command line's
        except KeyboardInterrupt:  # Ctrl-C before fit (during fit, SaveOnInterrupt saves, Lightning exits)
            print(
                "interrupted (Ctrl-C) before training started; nothing half-written was kept, "
                "run again to continue",
                file=sys.stderr,
            )
            sys.exit(130)
        except Preempted as stop:  # SIGTERM / SIGUSR1: last.ckpt saved, summary.json says preempted
            if launcher_rank() == 0:  # every rank stops; one says so
                print(stop, file=sys.stderr)
            sys.exit(EXIT_PREEMPTED)
        except MiniGPTError as err:  # bad user input or a NaN stop: one line, no traceback
            print(f"error: {err}", file=sys.stderr)
            if not in_sweep:
                sys.exit(2)
            if isinstance(err, NonFiniteLossError | DivergedError):
                return math.inf  # a diverged trial: worst value, so the sampler learns to avoid it
            raise  # the sweeper records a failed trial and goes on (sys.exit would end the whole sweep)
    return sweep_objective(result.best_val_loss) if in_sweep else result.best_val_loss


def main(argv: Sequence[str] | None = None) -> None:
    """`python train.py ARGS` / `mini-gpt train ARGS`; `argv` default: the command line."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]  # Hydra reads its command line from sys.argv
    exit_with_help_if_asked("train")  # the groups and keys of train.yaml, with their comments
    if any(arg.startswith("hparams_search=") for arg in sys.argv[1:]):  # the Optuna plugin's old spelling
        print(
            "error: Optuna searches run with `mini-gpt sweep hparams_search=NAME ...` (the same overrides, "
            "without -m; docs/sweeps.md); `python train.py -m key=a,b` grid sweeps work as before",
            file=sys.stderr,
        )
        sys.exit(2)
    exit_on_bad_overrides("train")  # a typo is one line, not Hydra's report
    train_app()


if __name__ == "__main__":
    main()
