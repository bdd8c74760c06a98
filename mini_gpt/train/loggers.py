"""Experiment loggers of a training run, built from `cfg.logger`; W&B never blocks (docs/training.md)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.loggers import WandbLogger


def hydra_trial() -> tuple[str, int] | None:
    """(sweep dir, job number) inside a Hydra multirun job (`python train.py -m ...`), else None."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return HydraConfig.get().sweep.dir, HydraConfig.get().job.num


def wandb_mode() -> str:
    """`$WANDB_MODE` if set; else online only with credentials and a reachable server (never a prompt)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    has_key = bool(os.environ.get("WANDB_API_KEY")) or (
        netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")
    )
    if not has_key:
        return "offline"
    try:
        socket.create_connection(("api.wandb.ai", 443), timeout=2).close()
        return "online"
    except OSError:
        return "offline"


def default_wandb_group(env: Mapping[str, str], sweep_dir: str | None) -> str | None:
    """The W&B group of a W&B sweep's or a Hydra multirun's runs; else None ($WANDB_RUN_GROUP wins)."""
    if env.get("WANDB_RUN_GROUP"):
        return None
    if env.get("WANDB_SWEEP_ID"):
        return f"sweep-{env['WANDB_SWEEP_ID']}"
    if sweep_dir:  # .../multiruns/<date>/<time> -> multirun-<date>_<time>
        return "multirun-" + "_".join(Path(sweep_dir).parts[-2:])
    return None


def build_loggers(logger_cfgs: Mapping[str, Any], trial: tuple[str, int] | None) -> tuple[list[Any], bool]:
    """(loggers, log_model) from `cfg.logger`; in a multirun `trial`, one W&B run per trial."""
    loggers, log_model = [], False
    for lcfg in logger_cfgs.values():
        if lcfg is None:
            continue
        lcfg = dict(lcfg)
        if str(lcfg.get("_target_", "")).endswith("WandbLogger"):
            log_model = bool(lcfg.pop("log_model", False))  # done by finish_wandb: works offline too
            mode = wandb_mode()
            os.environ["WANDB_MODE"] = mode
            lcfg.update(offline=mode == "offline", log_model=False)
            if mode == "offline":  # no banner, no footer: finish_wandb prints the one line that matters
                lcfg["settings"] = {**(lcfg.get("settings") or {}), "silent": True}
                # and for every run of the process: wandb 0.31 honours the setting for a multirun's first only
                os.environ.setdefault("WANDB_SILENT", "true")
            if lcfg.get("group") is None:
                lcfg["group"] = default_wandb_group(os.environ, trial[0] if trial else None)
            if trial and lcfg.get("name") is None:
                lcfg["name"] = f"trial-{trial[1]}"
            Path(lcfg["save_dir"]).mkdir(parents=True, exist_ok=True)
        logger = instantiate(lcfg, _convert_="all")
        # A WandbLogger private (Lightning 2.6.6): it always passes `anonymous`, which wandb >= 0.19 warns of.
        if isinstance(logger, WandbLogger) and isinstance(getattr(logger, "_wandb_init", None), dict):
            logger._wandb_init.pop("anonymous", None)
        loggers.append(logger)
    return loggers, log_model


def finish_wandb(loggers: list[Any], log_model: bool, ckpt_path: str | None, announce: bool = True) -> None:
    """Upload the checkpoint if asked, close the run; `announce`: say how to sync an offline one."""
    if not any(isinstance(logger, WandbLogger) for logger in loggers):
        return
    import wandb  # only with a WandbLogger: heavy, and optional

    run = wandb.run
    if run is None:  # never started (a rank other than 0, or a run that failed before logging)
        return
    try:
        if log_model and ckpt_path and Path(ckpt_path).is_file():
            artifact = wandb.Artifact(f"model-{run.id}", type="model")
            artifact.add_file(ckpt_path)
            run.log_artifact(artifact, aliases=["latest", "best"])
        offline = run.settings.mode in ("offline", "dryrun")  # WandbLogger(offline=True) says "dryrun"
        offline_dir = Path(run.dir).parent if offline else None
    finally:
        wandb.finish()
    if offline_dir is not None and announce:
        upload = f"wandb login, then wandb sync {offline_dir}"
        print(f"W&B run saved offline in {offline_dir}; to upload it: {upload}")
