"""Train a GPT: `python train.py [group=option ...] [key=value ...]` (Hydra; configs in conf/).

    python train.py                                   # the default char model on tiny Shakespeare
    python train.py model=baby trainer.max_steps=2000 optim.lr=1e-3 data=shakespeare logger=csv
    python train.py experiment=shakespeare_char_gpu
    python train.py ckpt_path=outputs/train/runs/<date>/<time>/checkpoints/last.ckpt   # resume exactly

The run itself is `mini_gpt.training.train`. Here: a user error becomes one `error:` line (exit status 2);
the console is recorded in the run's train.log, and a run that fails before training leaves no folder;
in a Hydra multirun (sweep) a failing trial raises (the sweeper records it and goes on) and the value
returned to the sweeper is the best val loss, +inf for a NaN/inf loss, never NaN.
"""

import math
import sys

import hydra
from omegaconf import DictConfig

from mini_gpt.conf import CONF_DIR, exit_on_bad_overrides, exit_with_help_if_asked, register_resolvers
from mini_gpt.errors import MiniGPTError

register_resolvers()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    from mini_gpt.callbacks import NonFiniteLossError
    from mini_gpt.resume import resumed_config
    from mini_gpt.training import hydra_trial, run_directory, sweep_objective, train

    in_sweep = hydra_trial() is not None
    with run_directory(cfg.paths.run_dir, keep_unstarted=in_sweep, output_dir=cfg.paths.output_dir):
        try:
            value = train(resumed_config(cfg))  # ckpt_path=...: the run's own config + the command line's
        except KeyboardInterrupt:  # Ctrl-C before fit (during fit, SaveOnInterrupt saves, Lightning exits)
            print(
                "interrupted (Ctrl-C) before training started; nothing half-written was kept, "
                "run again to continue",
                file=sys.stderr,
            )
            sys.exit(130)
        except MiniGPTError as err:  # bad user input or a NaN stop: one line, no traceback
            print(f"error: {err}", file=sys.stderr)
            if not in_sweep:
                sys.exit(2)
            if isinstance(err, NonFiniteLossError):
                return math.inf  # a diverged trial: worst value, so the sampler learns to avoid it
            raise  # the sweeper records a failed trial and goes on (sys.exit would end the whole sweep)
    return sweep_objective(value) if in_sweep else value


if __name__ == "__main__":
    exit_with_help_if_asked("train")  # the groups and keys of train.yaml, with their comments
    exit_on_bad_overrides("train")  # a typo is one line, not Hydra's report
    main()
