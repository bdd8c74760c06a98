"""`mini-gpt train` (= `python train.py`): a Hydra app; a user error is one line, except in a sweep."""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from mini_gpt.conf import CONF_DIR, compose_command_line, exit_with_help_if_asked, register
from mini_gpt.errors import MiniGPTError, exit_on_user_error
from mini_gpt.train.console_log import run_directory
from mini_gpt.train.distributed import launcher_rank
from mini_gpt.train.stops import EXIT_PREEMPTED, DivergedError, NonFiniteLossError, Preempted


# Hydra names the job after this module ("train"): runs go to outputs/train/runs/..., as from train.py.
@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def train_app(cfg: DictConfig) -> float | None:
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    with run_directory(cfg.paths.run_dir, keep_unstarted=in_sweep, output_dir=cfg.paths.output_dir):
        try:
            from mini_gpt.train.resume import checkpoint_path

            checkpoint_path(cfg.ckpt_path)  # a typo fails in a second, before Lightning is imported
            from mini_gpt.train.run import train  # Lightning: seconds to import, which --help and typos skip

            result = train(cfg)
        except KeyboardInterrupt:  # Ctrl-C before fit (during fit, StopOnSignal saves, Lightning exits)
            print("interrupted (Ctrl-C) before training started; nothing half-written was kept, run again to "
                  "continue", file=sys.stderr)  # fmt: skip
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


def sweep_objective(value: float | None) -> float:
    """+inf for a missing or non-finite loss: Optuna aborts a whole sweep on NaN, records +inf as worst."""
    return float(value) if value is not None and math.isfinite(value) else math.inf


def main(argv: Sequence[str] | None = None) -> None:
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]  # Hydra reads its command line from sys.argv
    register()
    exit_with_help_if_asked("train")
    if any(arg.startswith("hparams_search=") for arg in sys.argv[1:]):  # the Optuna plugin's old spelling
        print("error: Optuna searches run with `mini-gpt sweep hparams_search=NAME ...` (the same overrides, "
              "without -m; docs/sweeps.md); `python train.py -m key=a,b` grid sweeps work as before",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    if "hydra/launcher=slurm" in sys.argv[1:] and shutil.which("srun") is None:  # else submitit's traceback
        print("error: hydra/launcher=slurm submits the runs as SLURM jobs, and this machine has no srun; run "
              "the command on the cluster's login node (docs/training.md#slurm)",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    # A typo is one line, not Hydra's report; Hydra's own flags (-m: sweep syntax) leave it to Hydra.
    if not any(arg.startswith("-") for arg in sys.argv[1:]):
        exit_on_user_error(compose_command_line)("train", sys.argv[1:])
    train_app()


if __name__ == "__main__":  # python -m mini_gpt.cli.train: what DDP's other ranks run again
    main()
