"""One training run: `plan_run(cfg) -> RunPlan` resolves every setting once, then `train(cfg) -> RunResult`
builds the model, the module and the Trainer from the plan and fits. `cfg` is composed from conf/train.yaml.
Lightning re-runs the entry point per extra device, so everything before `fit` runs on every rank."""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from omegaconf import DictConfig, OmegaConf

from mini_gpt.conf import checked_arguments, typed_config
from mini_gpt.conf.train import TrainConfig
from mini_gpt.data.config import data_config
from mini_gpt.data.datamodule import GPTDataModule
from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.reference import recipe_key
from mini_gpt.interop.checkpoint import check_resume
from mini_gpt.machine import MIN_WINDOW_S, LoadMeter, auto_threads
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import Tokenizer
from mini_gpt.train.budget import TimeBudget
from mini_gpt.train.callbacks.checkpointing import last_checkpoint_path, resume_command
from mini_gpt.train.callbacks.record import Recorder, RunRecord
from mini_gpt.train.distributed import (
    BatchLayout,
    batch_layout,
    check_relaunch,
    dead_ranks,
    launcher_rank,
    local_rank,
    refuse_multirun_devices,
)
from mini_gpt.train.finetune import FinetunePlan, describe, plan_finetune
from mini_gpt.train.loggers import build_loggers, finish_wandb, hydra_trial
from mini_gpt.train.module import GPTLitModule
from mini_gpt.train.precision import PrecisionChoice, check_gpu, choose_precision, device_type
from mini_gpt.train.resume import Resume, explicit_model_keys, read_resume, resumed_config, run_overrides
from mini_gpt.train.summary import print_summary, run_start, run_status, write_summary


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    module: GPTLitModule  # the trained model (`.model`)
    record: RunRecord  # its curves: the logged train loss and every val loss
    summary: dict[str, Any] | None  # what summary.json holds; None on ranks other than 0

    @property
    def best_val_loss(self) -> float | None:
        """The run's objective (what a sweep minimises); None without an evaluation or on rank > 0."""
        return self.summary["best_val_loss"] if self.summary else None

    @property
    def last_ckpt(self) -> Path | None:
        return Path(self.summary["last_ckpt"]) if self.summary and self.summary["last_ckpt"] else None


@dataclass(frozen=True)
class RunPlan:
    """Every setting of one run, resolved once by `plan_run` before the model, the module or the Trainer
    exist; `train()` builds from it and nothing below it sees the raw config."""

    cfg: DictConfig  # the run's config: a resumed run's own, with the command line's changes
    run_config: dict[str, Any]  # the same, unresolved: what a checkpoint keeps to resume it
    options: TrainConfig  # the same, typed and range-checked
    run_dir: Path
    resume: Resume | None  # the checkpoint this run continues, read once
    finetune: FinetunePlan | None  # pretrained weights to start from (init_from, or a resumed fine-tune)
    datamodule: GPTDataModule  # the data, prepared once per node
    tokenizer: Tokenizer  # the data's: it sizes the model
    model_config: GPTConfig
    layout: BatchLayout  # batch x accumulation x devices: the tokens of one optimizer step
    max_steps: int  # trainer.max_steps, or what trainer.max_flops buys; -1 with a time budget
    budget: TimeBudget | None  # trainer.budget_s's clock (from process start, over resumes)
    precision: PrecisionChoice
    threads: tuple[int, str] | None  # (torch threads, why) for one CPU process; None: Lightning's choice
    recipe: dict[str, Any] | None  # picks the reference band summary.json compares with

    def describe(self) -> list[str]:
        """The plan's lines printed at start (rank 0)."""
        lines = [self.layout.describe(), self.precision.describe()]
        if (flops := self.options.trainer.max_flops) is not None:
            lines.append(
                f"trainer.max_flops={flops:.3g}: {self.max_steps} steps (replaces trainer.max_steps)"
            )
        if budget := self.budget:
            before = f"{budget.used_before:.1f} s used by the runs this one resumes; " * bool(self.resume)
            lines.append(
                f"trainer.budget_s={budget.seconds:g}: the run stops within {budget.seconds:g} s of process "
                f"start ({before}start-up, validations and the final one counted); the lr decays by elapsed "
                "time (replaces trainer.max_steps); the steps expected follow the first measured steps"
            )
        if self.threads:
            lines.append(f"threads: {self.threads[0]} ({self.threads[1]})")
        return lines


def plan_run(
    cfg: DictConfig, overrides: Sequence[str] | None = None, started: float | None = None
) -> RunPlan:
    """Resolve the run's settings: the checkpoint, the config, the data (prepared: its tokenizer), the model
    config, the steps, precision and threads (`started`: the run's clock, a time budget's start; default
    now). Lightning re-runs this per extra device (every rank plans)."""
    load = LoadMeter(MIN_WINDOW_S).start()  # the machine's other load over the set-up: threads=auto

    # The checkpoint, read once; a resumed run continues with its own config.
    resume = read_resume(cfg.get("ckpt_path"), cfg.get("init_from"))
    cfg = resumed_config(cfg, resume, overrides)
    options: TrainConfig = typed_config(cfg, "train")
    experiment = HydraConfig.get().runtime.choices.get("experiment") if HydraConfig.initialized() else None
    check_gpu(options.trainer.accelerator, experiment)  # before any work: a GPU recipe without a GPU
    run_dir = Path(cfg.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    _quiet_lightning()
    L.seed_everything(options.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision(options.float32_matmul_precision)
    if options.threads != "auto":
        torch.set_num_threads(options.threads)

    # The data, prepared once per node (the other ranks wait): its tokenizer sizes the model. Pretrained
    # weights (init_from, or resuming a fine-tuning run) fix the context, so their plan comes first.
    data = data_config(options.data)
    requested = explicit_model_keys(cfg)  # what the command line sets of the model: must fit init_from
    finetune = plan_finetune(options.init_from, options.finetune, requested, resume, data.bpe_file)
    block_size = finetune.config.block_size if finetune else options.model.block_size
    datamodule = GPTDataModule(data, block_size=block_size, seed=options.seed, **loader_arguments(options))
    tokenizer = datamodule.prepare_once(local_rank()).tokenizer

    # The model config: pretrained weights' or ours with the tokenizer's vocabulary; a resumed run's checked
    # against its checkpoint's, before a logger starts a run it would leave behind.
    model_config = finetune.config if finetune else _model_config(options.model, tokenizer.vocab_size)
    if resume:
        check_resume(resume.meta, dataclasses.asdict(model_config), tokenizer, resume.path)

    # The steps: tokens per step over devices and accumulation, max_steps, precision, threads.
    layout = batch_layout(options.trainer, datamodule.batch_size, block_size, options.global_batch_tokens)
    max_steps = options.trainer.max_steps
    if (max_flops := options.trainer.max_flops) is not None:
        max_steps = budget_steps(max_flops, flops_per_token(model_config), layout.tokens_per_step)
    budget = None
    if (seconds := options.trainer.budget_s) is not None:  # the budget ends the run, not a step count
        max_steps = -1
        used_before = float(resume.meta.get("budget_used_s") or 0.0) if resume else 0.0
        budget = TimeBudget(seconds, time.time() if started is None else started, used_before)
    check_steps(max_steps, options.optim.warmup_steps, resume.step if resume else None)
    run_config: dict[str, Any] = OmegaConf.to_container(cfg, resolve=False)  # type: ignore[assignment]
    recipe = recipe_key(run_config, layout.tokens_per_step, max_steps)
    precision = choose_precision(options.trainer.precision, options.trainer.accelerator, model_config.n_embd)
    threads = None
    if device_type(options.trainer.accelerator) == "cpu" and layout.world_size == 1:
        threads = (options.threads, "as set")
        if options.threads == "auto":  # a busy CPU at start: fewer threads than torch's one per core
            threads = auto_threads(torch.get_num_threads(), load.stop().other_load)
    return RunPlan(
        cfg, run_config, options, run_dir, resume, finetune, datamodule, tokenizer, model_config, layout,
        max_steps, budget, precision, threads, recipe
    )  # fmt: skip


def train(
    cfg: DictConfig, callbacks: Sequence[L.Callback] = (), overrides: Sequence[str] | None = None
) -> RunResult:
    """Train as `cfg` says; `callbacks`: extra Lightning callbacks (a sweep trial's pruning report);
    `overrides`: the command line's (default: Hydra's), which a resumed run applies to its own config, and
    whose trainer.max_steps beats a recipe's trainer.max_flops."""
    started = run_start()
    torch_threads = torch.get_num_threads()  # the run's choice holds for the run: given back at the end

    # 1. The plan: every setting resolved once, the data prepared (docs/architecture.md, "The training path").
    plan = plan_run(cfg, overrides, started)
    cfg, options, resume = plan.cfg, plan.options, plan.resume
    if plan.threads:
        torch.set_num_threads(plan.threads[0])

    # 2. The model (pretrained weights checked against the data's tokenizer) and the Lightning module.
    model = plan.finetune.build(plan.tokenizer) if plan.finetune else None
    if launcher_rank() == 0:
        lines = plan.describe() + ([describe(model, plan.finetune.record)] if plan.finetune else [])
        print("\n".join(lines), flush=True)
    module = GPTLitModule(
        plan.model_config, options.optim, tokenizer=plan.tokenizer, max_steps=plan.max_steps, model=model,
        compile=options.compile, finetune=plan.finetune.record if plan.finetune else None,
        tokens_per_step=plan.layout.tokens_per_step, run_config=plan.run_config,
        run_overrides=run_overrides(cfg, resume), budget=plan.budget,
    )  # fmt: skip

    # 3. The Trainer, built once with its final arguments; the callbacks of conf/callbacks/default.yaml come
    #    after the Recorder of the run's curves.
    recorder = Recorder()
    trial = hydra_trial()
    loggers, log_model = build_loggers(OmegaConf.to_container(cfg.logger, resolve=True), trial)  # type: ignore[arg-type]
    trainer: L.Trainer = _instantiate(
        trainer_arguments(cfg.trainer, plan.layout, plan.max_steps, plan.precision.precision), "trainer",
        callbacks=[recorder, *_callbacks(cfg, options), *callbacks], logger=loggers or False, _convert_="all",
    )  # fmt: skip
    check_world(trainer, plan.layout.world_size, multirun=trial is not None)
    # trainer.loggers, not `loggers`: fast_dev_run swaps them for a DummyLogger (no W&B run is started)
    for logger in trainer.loggers:  # rank 0 only (Lightning's loggers are rank-zero guarded)
        logger.log_hyperparams({**OmegaConf.to_container(cfg, resolve=True), "batch": plan.layout.as_dict()})

    # 4. Fit; whatever ends it, summary.json says how (rank 0).
    error: BaseException | None = None
    try:
        if options.init_from:  # the pretrained model's val loss is the curve's step 0
            trainer.validate(module, datamodule=plan.datamodule, verbose=False)
        trainer.fit(module, datamodule=plan.datamodule, ckpt_path=resume.path if resume else None)
    except BaseException as err:
        error = err
        if (dead := dead_ranks(trainer, err)) is not None:  # one line, not a collective's traceback
            raise MiniGPTError(_dead_rank_line(dead, trainer)) from None
        raise
    finally:
        status = run_status(error, trainer.global_step, recorder.record.start_step)
        # status None: refused before the first step, the folder goes (no W&B run to sync)
        best = getattr(trainer.checkpoint_callback, "best_model_path", None) or None
        finish_wandb(loggers, log_model, best, announce=status is not None)
        summary, path = None, plan.run_dir / "summary.json"
        if status is not None and trainer.is_global_zero:
            why = plan.threads[1] if plan.threads else None
            summary = write_summary(path, status, started, trainer, module, recorder.record, plan.recipe, why)
            if status == "interrupted":  # Ctrl-C: Lightning exits (status 1) without returning here
                print_summary(path, summary)
        torch.set_num_threads(torch_threads)
    if summary is not None:
        print_summary(path, summary)
    return RunResult(plan.run_dir, module, recorder.record, summary)


def _quiet_lightning() -> None:
    # Lightning has its own console handler; Hydra's root handler would print every line twice (each rank's
    # "Initializing distributed" line, lightning.fabric's). lightning.pytorch's start-up lines stay unprinted.
    logging.getLogger("lightning").propagate = False
    logging.getLogger("lightning.pytorch").propagate = False
    warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec.*")
    # val/loss is reduced over all ranks by the module itself; Lightning cannot tell and suggests sync_dist.
    warnings.filterwarnings("ignore", message=r".*sync_dist=True.*")
    # Our iterable datasets split their items between DataLoader workers, so their __len__ is exact.
    warnings.filterwarnings("ignore", message=r".*`IterableDataset` has `__len__` defined.*")


def loader_arguments(options: TrainConfig) -> dict[str, Any]:
    """The loader config as GPTDataModule's arguments: `pin_memory=auto` pins batches for a GPU (pinned pages
    let Lightning's non-blocking copies overlap the step; on a CPU they only cost)."""
    loader = dataclasses.asdict(options.loader)
    if loader["pin_memory"] == "auto":
        loader["pin_memory"] = device_type(options.trainer.accelerator) == "cuda"
    return loader


def trainer_arguments(
    trainer: DictConfig, layout: BatchLayout, max_steps: int, precision: str
) -> dict[str, Any]:
    """conf/trainer as the Trainer's final arguments (val_check_interval in micro-batches)."""
    arguments: dict[str, Any] = OmegaConf.to_container(trainer, resolve=True)  # type: ignore[assignment]
    del arguments["max_flops"], arguments["budget_s"]  # ours: they set max_steps
    arguments.update(max_steps=max_steps, precision=precision, accumulate_grad_batches=layout.accumulate)
    arguments["val_check_interval"] *= layout.accumulate
    return arguments


def _model_config(model: GPTConfig, vocab_size: int) -> GPTConfig:
    """`model` with the tokenizer's vocabulary size filled in (or checked, when set)."""
    if model.vocab_size is None:
        return dataclasses.replace(model, vocab_size=vocab_size)
    if model.vocab_size < vocab_size:
        raise MiniGPTError(
            f"model.vocab_size={model.vocab_size} < the tokenizer's {vocab_size}; "
            "set model.vocab_size=null (use the tokenizer's) or larger"
        )
    return model


def flops_per_token(config: GPTConfig) -> float:
    """Training FLOPs per token of a model config (the MFU's count), without allocating its weights."""
    with torch.device("meta"):
        return GPT(config).flops_per_token()


def budget_steps(max_flops: float, per_token: float, tokens_per_step: int) -> int:
    """Optimizer steps that spend `max_flops` training FLOPs (rounded down); at least one."""
    per_step = per_token * tokens_per_step
    steps = int(max_flops // per_step)
    if steps < 1:
        raise MiniGPTError(
            f"trainer.max_flops={max_flops:.3g} is less than one optimizer step ({per_step:.3g} FLOPs = "
            f"{per_token:.3g} FLOPs/token x {tokens_per_step} tokens/step); raise it or use a smaller model"
        )
    return steps


def check_steps(max_steps: int, warmup_steps: int, resumed_step: int | None) -> None:
    """A resume with nothing left to train is an error; a run that ends inside its warmup gets a note."""
    if resumed_step is not None and max_steps != -1 and resumed_step >= max_steps:
        raise MiniGPTError(
            f"ckpt_path is at step {resumed_step} and trainer.max_steps={max_steps}: nothing is left to "
            f"train; raise trainer.max_steps above {resumed_step}"
        )
    if launcher_rank() == 0 and 0 < max_steps <= warmup_steps:
        print(f"note: trainer.max_steps={max_steps} <= optim.warmup_steps={warmup_steps}: the learning "
              "rate is still warming up when the run ends; lower optim.warmup_steps", flush=True)  # fmt: skip


def _instantiate(node: Any, key: str, **kwargs: Any) -> Any:
    """hydra's instantiate, with what the class refuses (an unknown argument, a bad value) as one line."""
    try:
        return instantiate(node, **kwargs)
    except Exception as err:
        cause = err.__cause__ or err
        if isinstance(cause, MiniGPTError):
            raise cause from None
        reason = " ".join(str(cause).split())[:300]
        raise MiniGPTError(
            f"bad {key} config ({type(cause).__name__}: {reason}); check the {key}.* values you set"
        ) from None


def _callbacks(cfg: DictConfig, options: TrainConfig) -> list[L.Callback]:
    """The configured callbacks, less those set to null or `enabled` false."""
    callbacks = []
    for name, node in (cfg.callbacks or {}).items():
        if node is None:
            continue
        callback = _instantiate(checked_arguments(node, f"callbacks.{name}"), f"callbacks.{name}")
        # Lightning refuses a progress bar / checkpoint callback that its own switch turned off.
        off = (isinstance(callback, ProgressBar) and not options.trainer.enable_progress_bar) or (
            isinstance(callback, ModelCheckpoint) and not options.trainer.enable_checkpointing
        )
        if getattr(callback, "enabled", True) and not off:
            callbacks.append(callback)
    return callbacks


def check_world(trainer: L.Trainer, world_size: int, multirun: bool) -> None:
    """The Trainer has the processes the batch layout counted; a sweep trial trains on one device."""
    if trainer.world_size != world_size:
        raise MiniGPTError(
            f"trainer.devices x trainer.num_nodes gives {world_size} processes but Lightning started "
            f"{trainer.world_size}; set trainer.devices to a number"
        )
    if world_size > 1:
        check_relaunch(getattr(trainer.strategy, "launcher", None))
        if multirun:  # (a single-device strategy has no cluster environment)
            external = trainer.strategy.cluster_environment.creates_processes_externally
            refuse_multirun_devices(world_size, external, trainer.num_devices)


def _dead_rank_line(dead: str, trainer: L.Trainer) -> str:
    last = last_checkpoint_path(trainer)
    resume = "no checkpoint was saved yet: run again"
    if last is not None and last.is_file():
        resume = f"resume from the last checkpoint with: {resume_command(last)}"
    return f"{dead} during step {trainer.global_step + 1}; the run stopped (every rank must live); {resume}"
