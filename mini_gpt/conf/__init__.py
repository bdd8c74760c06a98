"""The Hydra configs of every mini-gpt tool, shipped inside the package (so a wheel install has them too).

`train.yaml` and its groups (model/ data/ optim/ trainer/ callbacks/ logger/ paths/ hydra/ experiment/
debug/ hparams_search/) configure `python train.py`; `generate.yaml`, `export.yaml` and
`visualize.yaml` the command-line tools; `sweep/` holds W&B sweep specs (no defaults list uses it).
Every tool finds them one way: `CONF_DIR`, the directory of this file. Hydra is imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parent
# A source checkout (the package beside pyproject.toml) keeps outputs/ and data/ in the checkout, whatever
# the working directory; an installed package uses the working directory.
_CHECKOUT = CONF_DIR.parents[1]
PROJECT_ROOT = _CHECKOUT if (_CHECKOUT / "pyproject.toml").is_file() else Path.cwd()


def register_resolvers() -> None:
    """`${project_root:}` (used by paths/default.yaml); call before Hydra composes a config."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT), replace=True)


def compose(overrides: Sequence[str] = (), config_name: str = "train", hydra: bool = False) -> Any:
    """The config `python train.py OVERRIDES` (or another tool) would run with, without running it.

    `hydra=True` also returns the `hydra` node (sweeper, launcher, run dirs).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=hydra)


def hydra_main(config_name: str, task: Callable[[Any], Any]) -> Any:
    """Run `task(cfg)` on `CONF_DIR/<config_name>.yaml` plus the command line's Hydra overrides.

    A `MiniGPTError` becomes one `error: ...` line on stderr and exit status 2 (see mini_gpt.errors).
    """
    import hydra

    from mini_gpt.errors import exit_on_user_error

    register_resolvers()
    return hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)(
        exit_on_user_error(task)
    )()
