"""Train a GPT: `python train.py [group=option ...] [key=value ...]` (Hydra; configs in conf/).

    python train.py                                   # the default char model on tiny Shakespeare
    python train.py model=baby trainer.max_steps=2000 optim.lr=1e-3 data=shakespeare logger=csv
    python train.py experiment=shakespeare_char_gpu
    python train.py ckpt_path=outputs/train/runs/<date>/<time>/checkpoints/last.ckpt   # resume exactly

Every run writes its resolved config (.hydra/), checkpoints, logs and summary.json under outputs/ in
the repository, whatever the working directory. Returns the best val loss (for sweeps).

Multi-device (trainer=ddp / fsdp): Lightning re-runs this script once per extra device with the same
overrides and hydra.run.dir, so everything before `trainer.fit` runs on every rank; data preparation,
printing, summary.json and W&B are guarded by rank. In a Hydra multirun (sweep) a failing trial raises
(the sweeper records it and goes on) and a NaN/inf loss is returned as +inf, never NaN.
"""

from __future__ import annotations

import time

START_TIME = time.time()  # wall_seconds in summary.json count from here, imports included

import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

if TYPE_CHECKING:
    from mini_gpt.distributed import BatchLayout

REPO_ROOT = Path(__file__).resolve().parent
OmegaConf.register_new_resolver("repo_root", lambda: str(REPO_ROOT), replace=True)


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
    import socket

    try:
        socket.create_connection(("api.wandb.ai", 443), timeout=2).close()
        return "online"
    except OSError:
        return "offline"


def is_multirun() -> bool:
    """True inside a Hydra multirun job (`python train.py -m ...`: a sweep trial)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def default_wandb_group(env: Mapping[str, str], sweep_dir: str | None) -> str | None:
    """W&B group of runs that belong together: a W&B sweep (its agent sets $WANDB_SWEEP_ID) or a Hydra
    multirun (named after its sweep dir); None for a single run or when $WANDB_RUN_GROUP names one."""
    if env.get("WANDB_RUN_GROUP"):
        return None
    if env.get("WANDB_SWEEP_ID"):
        return f"sweep-{env['WANDB_SWEEP_ID']}"
    if sweep_dir:  # .../multiruns/<date>/<time> -> multirun-<date>_<time>
        return "multirun-" + "_".join(Path(sweep_dir).parts[-2:])
    return None


def sweep_objective(value: float | None) -> float:
    """The value handed to a sweeper: +inf for a missing or non-finite loss. hydra-optuna-sweeper 1.3
    (optuna 2.10) aborts the whole sweep on NaN, while +inf is recorded as a complete, worst trial."""
    if value is None or not math.isfinite(value):
        return math.inf
    return float(value)


def build_loggers(cfg: DictConfig) -> tuple[list[Any], bool]:
    """Instantiate cfg.logger's entries; returns (loggers, log_model) with W&B set up to never block."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import instantiate

    loggers, log_model = [], False
    for lcfg in (cfg.get("logger") or {}).values():
        if lcfg is None:
            continue
        lcfg = OmegaConf.to_container(lcfg, resolve=True)
        if str(lcfg.get("_target_", "")).endswith("WandbLogger"):
            log_model = bool(lcfg.pop("log_model", False))  # done by train.py: works offline too
            mode = wandb_mode()
            os.environ["WANDB_MODE"] = mode
            lcfg.update(offline=mode == "offline", log_model=False)
            if is_multirun():  # one W&B run per trial (finished after each), grouped per sweep
                if lcfg.get("group") is None:
                    lcfg["group"] = default_wandb_group(os.environ, HydraConfig.get().sweep.dir)
                if lcfg.get("name") is None:
                    lcfg["name"] = f"trial-{HydraConfig.get().job.num}"
            elif lcfg.get("group") is None:
                lcfg["group"] = default_wandb_group(os.environ, None)
            Path(lcfg["save_dir"]).mkdir(parents=True, exist_ok=True)
        loggers.append(instantiate(lcfg, _convert_="all"))
    return loggers, log_model


def write_summary(
    run_dir: Path, module: Any, trainer: Any, tokens_per_step: int, throughput: Any, ckpt: Any, status: str
) -> Path:
    vals = module.val_history
    summary = {
        "status": status,  # completed | interrupted | nonfinite | failed
        "best_val_loss": min((v for _, _, v in vals), default=None),
        "final_val_loss": vals[-1][2] if vals else None,
        "steps": trainer.global_step,
        "tokens": trainer.global_step * tokens_per_step,  # includes steps before a resume
        "wall_seconds": time.time() - START_TIME,
        "tokens_per_sec": throughput.tokens_per_sec if throughput is not None else None,
        "val_curve": [[s, t - START_TIME, v] for s, t, v in vals],
        "best_ckpt": str(Path(ckpt.best_model_path).resolve()) if ckpt and ckpt.best_model_path else None,
        "last_ckpt": str(Path(ckpt.last_model_path).resolve()) if ckpt and ckpt.last_model_path else None,
    }
    path = run_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2))
    return path


def apply_batch_layout(
    trainer: Any, micro_batch: int, block_size: int, global_batch_tokens: int | None
) -> BatchLayout:
    """The batch layout of this run; with `global_batch_tokens` set, derive the trainer's gradient
    accumulation from it (devices and nodes are known only once Lightning resolved them)."""
    from mini_gpt.distributed import BatchLayout, accumulation_for

    world = trainer.world_size
    devices = trainer.num_devices
    if global_batch_tokens is not None:
        accumulate = accumulation_for(global_batch_tokens, micro_batch, block_size, world)
        steps = trainer.val_check_interval // trainer.accumulate_grad_batches  # optimizer steps
        trainer.accumulate_grad_batches = accumulate
        trainer.val_check_interval = steps * accumulate  # Lightning counts micro-batches
    return BatchLayout(micro_batch, block_size, trainer.accumulate_grad_batches, devices, world // devices)


def check_multirun_strategy(trainer: Any, multirun: bool) -> None:
    """Refuse what cannot work: in a Hydra multirun (a sweep trial) this process must train alone, or
    be one of the ranks a cluster launcher (SLURM, torchrun) started. DDP that re-runs the script per
    device makes every extra rank run the whole sweep (upstream limitation), and ddp_spawn trains in
    child processes, leaving this one without the step count and val losses the trial must return."""
    from mini_gpt.errors import MiniGPTError

    if (
        multirun
        and trainer.world_size > 1
        and not trainer.strategy.cluster_environment.creates_processes_externally
    ):
        raise MiniGPTError(
            "Hydra multirun (-m) cannot run a multi-device strategy started from inside the trial "
            f"(trainer.devices={trainer.num_devices}): sweep with one device per trial, or run each trial "
            "as a multi-GPU SLURM job with hydra/launcher=slurm"
        )


def prepare_data_once(dm: Any, local_rank: int, timeout_s: float = 24 * 3600) -> None:
    """Prepare the token cache on local rank 0 only; other ranks of the node wait until it is valid.

    With `python train.py trainer=ddp` rank 0 finishes this before Lightning starts the others; under
    torchrun/SLURM all ranks start together and must not tokenize (and write) the same files at once.
    """
    from mini_gpt.data import _out_dir, load_prepared
    from mini_gpt.errors import MiniGPTError

    if local_rank == 0:
        dm.prepare_data()
        return
    meta = _out_dir(dm.cfg) / "meta.json"  # written last, atomically, by the preparing rank
    deadline = time.monotonic() + timeout_s
    while True:
        if meta.is_file():
            try:
                dm.prepared = load_prepared(dm.cfg, block_size=dm.block_size)
                return
            except MiniGPTError:
                pass  # a stale cache that local rank 0 is rebuilding right now
        if time.monotonic() > deadline:
            raise MiniGPTError(f"timed out waiting for local rank 0 to prepare {meta.parent}")
        time.sleep(1.0)


def train(cfg: DictConfig) -> float | None:
    """Build everything from the composed config and fit; the testable core of main()."""
    import logging
    import warnings

    from mini_gpt.errors import MiniGPTError

    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path is not None:  # checked before the slow imports: a typo fails in a second
        ckpt_path = Path(ckpt_path).expanduser().resolve()
        if not ckpt_path.is_file():
            raise MiniGPTError(f"ckpt_path={ckpt_path} does not exist; pass an existing .ckpt to resume")
    run_dir = Path(cfg.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)

    import lightning as L
    import torch
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.callbacks import ProgressBar as ProgressBarBase

    # Lightning has its own console handler; Hydra's root handler would print every line twice.
    logging.getLogger("lightning.pytorch").propagate = False
    warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec.*")
    # val/loss is reduced over all ranks by the module itself; Lightning cannot tell and suggests sync_dist.
    warnings.filterwarnings("ignore", message=r".*sync_dist=True.*")

    from mini_gpt.callbacks import NonFiniteLossError, SaveOnInterrupt, Throughput, ValidateAtEnd
    from mini_gpt.data import DataConfig
    from mini_gpt.datamodule import GPTDataModule
    from mini_gpt.lit_module import GPTLitModule
    from mini_gpt.model import GPTConfig
    from mini_gpt.optim import OptimConfig

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision(cfg.float32_matmul_precision)

    try:
        data_cfg = DataConfig(**OmegaConf.to_container(cfg.data, resolve=True))
        model_dict = OmegaConf.to_container(cfg.model, resolve=True)
        dm = GPTDataModule(data_cfg, block_size=model_dict["block_size"], seed=cfg.seed, **cfg.loader)
    except TypeError as err:  # an unknown key in data/loader
        raise MiniGPTError(f"bad data/loader config: {err}") from None

    # The Trainer comes first: it knows this process's rank (under DDP this script runs once per rank).
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    callbacks.append(ValidateAtEnd())
    # Lightning refuses a progress bar / checkpoint callback that its own switch turned off.
    if not cfg.trainer.get("enable_progress_bar", True):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBarBase)]
    if not cfg.trainer.get("enable_checkpointing", True):
        callbacks = [c for c in callbacks if not isinstance(c, ModelCheckpoint)]
    loggers, log_model = build_loggers(cfg)
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=loggers or False,
        # conf counts optimizer steps; Lightning counts micro-batches
        val_check_interval=cfg.trainer.val_check_interval * cfg.trainer.get("accumulate_grad_batches", 1),
        _convert_="all",
    )
    check_multirun_strategy(trainer, is_multirun())
    layout = apply_batch_layout(trainer, dm.batch_size, dm.block_size, cfg.get("global_batch_tokens"))
    if trainer.is_global_zero:
        print(layout.describe(), flush=True)

    prepare_data_once(dm, trainer.local_rank)  # before fit: DDP children start later, find it ready
    tokenizer = dm.tokenizer
    if model_dict.get("vocab_size") is None:
        model_dict["vocab_size"] = tokenizer.vocab_size
    elif model_dict["vocab_size"] < tokenizer.vocab_size:
        raise MiniGPTError(
            f"model.vocab_size={model_dict['vocab_size']} < the tokenizer's {tokenizer.vocab_size}; "
            "set model.vocab_size=null (use the tokenizer's) or larger"
        )
    module = GPTLitModule(
        GPTConfig.from_dict(model_dict),
        OptimConfig.from_dict(OmegaConf.to_container(cfg.optim, resolve=True)),
        tokenizer=tokenizer,
        max_steps=cfg.trainer.max_steps,
        compile=cfg.compile,
    )

    for logger in loggers:  # rank 0 only (Lightning's loggers are rank-zero guarded)
        logger.log_hyperparams({**OmegaConf.to_container(cfg, resolve=True), "batch": layout.as_dict()})
    throughput = next((c for c in callbacks if isinstance(c, Throughput)), None)
    status = "failed"
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
        status = "completed"
    except NonFiniteLossError:
        status = "nonfinite"
        raise
    except SystemExit:  # Lightning exits after a Ctrl-C (last.ckpt was saved by SaveOnInterrupt)
        status = "interrupted"
        raise
    finally:
        ckpt_cb = trainer.checkpoint_callback
        interrupted = next((c.saved_path for c in callbacks if isinstance(c, SaveOnInterrupt)), None)
        if interrupted and ckpt_cb is not None:
            ckpt_cb.last_model_path = str(interrupted)
        if trainer.is_global_zero:
            summary = write_summary(
                run_dir, module, trainer, layout.tokens_per_step, throughput, ckpt_cb, status
            )
        finish_wandb(loggers, log_model, ckpt_cb)
    if trainer.is_global_zero:
        s = json.loads(summary.read_text())
        print(
            f"summary: {summary}\n  steps={s['steps']} best_val_loss={s['best_val_loss']} "
            f"final_val_loss={s['final_val_loss']} tokens/s={s['tokens_per_sec'] or 0:,.0f} "
            f"wall={s['wall_seconds']:.1f}s\n  last_ckpt={s['last_ckpt']}"
        )
    return s["best_val_loss"] if trainer.is_global_zero else None


def finish_wandb(loggers: list[Any], log_model: bool, ckpt_cb: Any) -> None:
    """Upload the checkpoint as an artifact if asked, close the run, say how to sync an offline run."""
    from lightning.pytorch.loggers import WandbLogger

    for logger in loggers:
        if not isinstance(logger, WandbLogger) or logger._experiment is None:
            continue
        import wandb

        run = logger.experiment
        try:
            path = ckpt_cb and (ckpt_cb.best_model_path or ckpt_cb.last_model_path)
            if log_model and path and Path(path).is_file():
                artifact = wandb.Artifact(f"model-{run.id}", type="model")
                artifact.add_file(path)
                run.log_artifact(artifact, aliases=["latest", "best"])
            offline = run.settings.mode in ("offline", "dryrun")  # WandbLogger(offline=True) says "dryrun"
            offline_dir = Path(run.dir).parent if offline else None
        finally:
            wandb.finish()
        if offline_dir is not None:
            print(f"W&B offline run saved; upload it with: wandb sync {offline_dir}")


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from mini_gpt.errors import MiniGPTError

    multirun = is_multirun()
    try:
        value = train(cfg)
    except MiniGPTError as err:  # bad user input or a NaN stop: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        if not multirun:
            sys.exit(2)
        from mini_gpt.callbacks import NonFiniteLossError

        if isinstance(err, NonFiniteLossError):
            return math.inf  # a diverged trial: worst value, so the sampler learns to avoid it
        raise  # the sweeper records a failed trial and goes on (sys.exit would end the whole sweep)
    return sweep_objective(value) if multirun else value


if __name__ == "__main__":
    main()
