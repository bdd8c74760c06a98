"""One training run, from a composed config to checkpoints and summary.json: `train(cfg) -> RunResult`.

    config -> GPTDataModule (token files, tokenizer) -> GPTConfig (vocabulary from the tokenizer)
           -> GPTLitModule -> Trainer (+ callbacks, loggers) -> fit -> checkpoints, summary.json

With `init_from=...` the model comes from mini_gpt.train.finetune and is evaluated once before the first
step (the curve's step 0). Multi-device: Lightning re-runs the entry point once per extra device, so all
before `trainer.fit` runs on every rank; data preparation, printing, summary.json and W&B are guarded by
rank. Torch, Lightning and the model code are imported inside `train()`, after the checks that need none
of them: a wrong `ckpt_path=` fails in a second, and importing this module stays light.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mini_gpt.conf.schema import checked_config
from mini_gpt.errors import MiniGPTError
from mini_gpt.files import remove_empty
from mini_gpt.machine import MIN_WINDOW_S, LoadMeter, thread_note
from mini_gpt.train.console_log import record_console
from mini_gpt.train.distributed import BatchLayout, accumulation_for, dead_ranks

if TYPE_CHECKING:
    import lightning as L

    from mini_gpt.train.callbacks import RunSummary
    from mini_gpt.train.module import GPTLitModule
    from mini_gpt.train.precision import PrecisionChoice

__all__ = [
    "RunResult",
    "apply_batch_layout",
    "budget_steps",
    "check_multirun_strategy",
    "check_steps",
    "check_trainer_numbers",
    "flops_per_token",
    "hydra_trial",
    "launcher_rank",
    "run_directory",
    "sweep_objective",
    "train",
    "trainer_arguments",
]

# What Hydra and a run that never reached training leave in a run directory (removed on such a failure).
_UNSTARTED_ENTRIES = {".hydra", "train.log", "wandb", "csv", "checkpoints", "attention_maps"}
_KEPT_IF_FILLED = {"checkpoints", "attention_maps"}  # a run that never trained writes no file in these
_runs_in_process = 0  # train() calls so far: the first run's clock starts at process start


def launcher_rank() -> int:
    """This process's global rank as its launcher set it (DDP re-launch, torchrun, SLURM), else 0."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


@contextmanager
def run_directory(
    run_dir: str | Path, keep_unstarted: bool = False, output_dir: str | Path | None = None
) -> Iterator[None]:
    """The run directory around one run (rank 0; other ranks just run the block). `train.log` records the
    console, a failure's traceback included. A run that fails before training started (no summary.json)
    leaves no folder, unless `keep_unstarted` (a sweep trial's folder holds its error for the table): what
    Hydra and the run wrote is removed, then the folder and its emptied parents below `output_dir`."""
    if launcher_rank() != 0:
        yield
        return
    run_dir = Path(run_dir)
    completed = False
    try:
        with record_console(run_dir / "train.log"):
            yield
        completed = True
    finally:
        if not completed and not keep_unstarted and not (run_dir / "summary.json").exists():
            _remove_unstarted(run_dir.resolve(), Path(output_dir).resolve() if output_dir else None)


def _remove_unstarted(run_dir: Path, output_dir: Path | None) -> None:
    if not run_dir.is_dir():
        return
    for entry in run_dir.iterdir():
        if entry.name in _KEPT_IF_FILLED and any(p.is_file() for p in entry.rglob("*")):
            continue  # an earlier run's checkpoints in a reused paths.run_dir: never ours to delete
        if entry.name in _UNSTARTED_ENTRIES:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    inside = output_dir is not None and output_dir in run_dir.parents
    parents = [p for p in run_dir.parents if inside and output_dir in p.parents]
    remove_empty([run_dir, *parents])  # the run dir, then emptied folders below output_dir


def _run_start() -> float:
    """Unix time this run's clock starts: process start for the first run of the process (imports and
    start-up count), the call itself for later ones (the next trials of a Hydra multirun)."""
    global _runs_in_process
    _runs_in_process += 1
    return psutil.Process().create_time() if _runs_in_process == 1 else time.time()


def hydra_trial() -> tuple[str, int] | None:
    """(sweep dir, job number) inside a Hydra multirun job (`python train.py -m ...`), else None."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return HydraConfig.get().sweep.dir, HydraConfig.get().job.num


def sweep_objective(value: float | None) -> float:
    """The value handed to a sweeper: +inf for a missing or non-finite loss. hydra-optuna-sweeper 1.3
    (optuna 2.10) aborts the whole sweep on NaN, while +inf is recorded as a complete, worst trial."""
    if value is None or not math.isfinite(value):
        return math.inf
    return float(value)


def apply_batch_layout(
    trainer: L.Trainer, micro_batch: int, block_size: int, global_batch_tokens: int | None
) -> BatchLayout:
    """Set the trainer's gradient accumulation (from `global_batch_tokens` when set, now that devices are
    resolved) and convert `val_check_interval` from optimizer steps (config) to micro-batches (Lightning)."""
    world = trainer.world_size
    accumulate = trainer.accumulate_grad_batches
    if global_batch_tokens is not None:
        accumulate = accumulation_for(global_batch_tokens, micro_batch, block_size, world)
    trainer.accumulate_grad_batches = accumulate
    if isinstance(trainer.val_check_interval, int):  # fast_dev_run sets a float: leave it alone
        trainer.val_check_interval *= accumulate
    devices = trainer.num_devices
    return BatchLayout(micro_batch, block_size, accumulate, devices, world // devices)


def check_multirun_strategy(trainer: L.Trainer, multirun: bool) -> None:
    """A sweep trial must train alone or be a rank a cluster launcher (SLURM, torchrun) started: DDP that
    re-runs the script per device makes every extra rank run the whole sweep, and ddp_spawn trains in
    child processes, leaving this one without the val losses the trial must return."""
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


@dataclass
class RunOptions:
    """The top-level keys of train.yaml that train() reads (the groups' own dataclasses check theirs)."""

    seed: int
    threads: int | None
    ckpt_path: str | None
    compile: bool
    float32_matmul_precision: str
    global_batch_tokens: int | None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise MiniGPTError(f"threads={self.threads} must be >= 1 (or null: one per core)")
        if self.float32_matmul_precision not in MATMUL_PRECISIONS:
            raise MiniGPTError(
                f"float32_matmul_precision={self.float32_matmul_precision!r} must be one of "
                f"{', '.join(MATMUL_PRECISIONS)}"
            )

    @classmethod
    def from_config(cls, cfg: DictConfig) -> RunOptions:
        return checked_config(cls, {f.name: cfg.get(f.name) for f in fields(cls)}, "")


MATMUL_PRECISIONS = ("highest", "high", "medium")


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


def _instantiate(node: Any, key: str, **kwargs: Any) -> Any:
    """hydra's instantiate, with a value the class refuses (`trainer.max_steps=abc`) as one line."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, MiniGPTError):
            raise err.__cause__ from None
        cause = err.__cause__ or err
        reason = " ".join(str(cause).split())[:300]
        raise MiniGPTError(
            f"bad {key} config ({type(cause).__name__}: {reason}); check the {key}.* values you set"
        ) from None


def _callbacks(cfg: DictConfig, run_summary: RunSummary, extra: Sequence[Any] = ()) -> list[Any]:
    """The configured callbacks (`_target_` entries, null = dropped), the caller's (a sweep trial's
    pruning report) + final validation + the summary."""
    from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar

    from mini_gpt.train.callbacks import ValidateAtEnd

    callbacks = [
        _instantiate(c, f"callbacks.{name}")
        for name, c in (cfg.get("callbacks") or {}).items()
        if c is not None
    ]
    # Lightning refuses a progress bar / checkpoint callback that its own switch turned off.
    if not cfg.trainer.get("enable_progress_bar", True):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    if not cfg.trainer.get("enable_checkpointing", True):
        callbacks = [c for c in callbacks if not isinstance(c, ModelCheckpoint)]
    # RunSummary after SaveOnInterrupt: it sees the Ctrl-C save.
    return [*callbacks, *extra, ValidateAtEnd(), run_summary]


def _model_dict(cfg: DictConfig, vocab_size: int) -> dict[str, Any]:
    """`cfg.model` with the tokenizer's vocabulary size filled in (or checked, when set)."""
    model = _plain(cfg.model)
    if model.get("vocab_size") is None:
        model["vocab_size"] = vocab_size
    elif model["vocab_size"] < vocab_size:
        raise MiniGPTError(
            f"model.vocab_size={model['vocab_size']} < the tokenizer's {vocab_size}; "
            "set model.vocab_size=null (use the tokenizer's) or larger"
        )
    return model


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    module: GPTLitModule  # the trained model (`.model`) and its loss curve (`.stats`)
    summary: dict[str, Any] | None  # what summary.json holds; None on ranks other than 0

    @property
    def best_val_loss(self) -> float | None:
        """The run's objective (what a sweep minimises); None without an evaluation or on rank > 0."""
        return self.summary["best_val_loss"] if self.summary else None

    @property
    def best_ckpt(self) -> Path | None:
        return _path(self.summary, "best_ckpt")

    @property
    def last_ckpt(self) -> Path | None:
        return _path(self.summary, "last_ckpt")


def _path(summary: dict[str, Any] | None, key: str) -> Path | None:
    return Path(summary[key]) if summary and summary.get(key) else None


# Trainer keys that must be numbers: a string reaches Lightning as `'<' not supported between 'str' ...`.
_TRAINER_NUMBERS = (
    "max_steps", "max_epochs", "val_check_interval", "limit_val_batches", "limit_train_batches",
    "num_sanity_val_steps", "log_every_n_steps", "accumulate_grad_batches", "gradient_clip_val", "num_nodes",
)  # fmt: skip


def trainer_arguments(trainer: dict[str, Any], n_embd: int) -> tuple[dict[str, Any], Any, PrecisionChoice]:
    """conf/trainer as the Trainer's arguments, and what of it is ours: `max_flops` taken out (train()
    turns it into steps) and `precision=auto` resolved for a model `n_embd` wide on its accelerator."""
    from mini_gpt.train.precision import choose_precision

    arguments = dict(trainer)
    max_flops = arguments.pop("max_flops", None)
    precision = choose_precision(
        arguments.get("precision", "auto"), arguments.get("accelerator", "auto"), n_embd
    )
    arguments["precision"] = precision.precision
    return arguments, max_flops, precision


def check_trainer_numbers(trainer: dict[str, Any]) -> None:
    """One line for `trainer.max_steps=abc` (or true) instead of Lightning's TypeError."""
    for key in _TRAINER_NUMBERS:
        value = trainer.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise MiniGPTError(
                f"trainer.{key}={value!r} must be a number; fix it on the command line or in the config"
            )


def check_steps(max_steps: int, optim: Any, resumed_step: int | None) -> None:
    """A resume with nothing left to train is an error; a run that ends inside its warmup gets a note."""
    if resumed_step is not None and max_steps != -1 and resumed_step >= max_steps:
        raise MiniGPTError(
            f"ckpt_path is at step {resumed_step} and trainer.max_steps={max_steps}: nothing is left to "
            f"train; raise trainer.max_steps above {resumed_step}"
        )
    if launcher_rank() == 0 and 0 < max_steps <= optim.warmup_steps:
        print(
            f"note: trainer.max_steps={max_steps} <= optim.warmup_steps={optim.warmup_steps}: the learning "
            "rate is still warming up when the run ends; lower optim.warmup_steps",
            flush=True,
        )


def _loss(value: float | None) -> str:
    """A loss for the summary line: 4 decimals (summary.json keeps every digit)."""
    return "none" if value is None else f"{value:.4f}"


def _note_busy_cpu(trainer: L.Trainer, threads: int | None, load: LoadMeter) -> None:
    """One line suggesting `threads=N` when other processes keep the CPU busy (training on the CPU with
    torch's default threads). `load` has run since train() began; a short window is stretched to
    MIN_WINDOW_S (Lightning imported before, nothing to prepare), a longer one costs nothing."""
    import torch

    if threads is None and trainer.strategy.root_device.type == "cpu":
        load.min_seconds = MIN_WINDOW_S
        note = thread_note(torch.get_num_threads(), load.stop().other_load)
        if note:
            print(note, flush=True)


def flops_per_token(config: Any) -> float:
    """Training FLOPs per token of a model config (`GPT.flops_per_token`, the MFU's count), without
    allocating its weights."""
    import torch

    from mini_gpt.model.gpt import GPT

    with torch.device("meta"):
        return GPT(config).flops_per_token()


def budget_steps(max_flops: Any, per_token: float, tokens_per_step: int) -> int:
    """Optimizer steps that spend `max_flops` training FLOPs (rounded down); at least one."""
    if isinstance(max_flops, bool) or not isinstance(max_flops, int | float) or not max_flops > 0:
        raise MiniGPTError(f"trainer.max_flops={max_flops!r} must be a positive number of FLOPs, e.g. 1e13")
    per_step = per_token * tokens_per_step
    steps = int(max_flops // per_step)
    if steps < 1:
        raise MiniGPTError(
            f"trainer.max_flops={max_flops:.3g} is less than one optimizer step ({per_step:.3g} FLOPs = "
            f"{per_token:.3g} FLOPs/token x {tokens_per_step} tokens/step); raise it or use a smaller model"
        )
    return steps


def _dead_rank_line(dead: str, trainer: L.Trainer) -> str:
    """`rank 1 (...) died at step N; ... resume with: ...` (every rank must live through a DDP run)."""
    from mini_gpt.train.callbacks.checkpointing import last_checkpoint_path, resume_command

    last = last_checkpoint_path(trainer)
    resume = (
        f"resume from the last checkpoint with: {resume_command(last)}"
        if last is not None and last.is_file()
        else "no checkpoint was saved yet: run again"
    )
    return f"{dead} during step {trainer.global_step + 1}; the run stopped (every rank must live); {resume}"


def train(cfg: DictConfig, callbacks: Sequence[L.Callback] = ()) -> RunResult:
    """Build everything from the composed config and fit; `callbacks`: extra Lightning callbacks."""
    started = _run_start()
    RunOptions.from_config(cfg)  # `seed=abc` is one line here, not a traceback from Lightning
    check_trainer_numbers(_plain(cfg.get("trainer")))
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path is not None:  # checked before the slow imports: a typo fails in a second
        ckpt_path = Path(ckpt_path).expanduser().resolve()
        if not ckpt_path.is_file():
            raise MiniGPTError(f"ckpt_path={ckpt_path} does not exist; pass an existing .ckpt to resume")
    init_from = cfg.get("init_from")
    run_dir = Path(cfg.paths.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)

    load = LoadMeter().start()  # over the imports and the set-up below, for _note_busy_cpu
    import lightning as L
    import torch

    from mini_gpt.data.config import data_config
    from mini_gpt.data.datamodule import GPTDataModule
    from mini_gpt.interop.checkpoint import read_checkpoint
    from mini_gpt.model.gpt import GPTConfig
    from mini_gpt.train.callbacks import RunSummary
    from mini_gpt.train.finetune import FinetuneConfig, describe, plan_finetune
    from mini_gpt.train.loggers import build_loggers, finish_wandb
    from mini_gpt.train.module import GPTLitModule
    from mini_gpt.train.optim import OptimConfig
    from mini_gpt.train.resume import explicit_model_keys, run_overrides

    # Lightning has its own console handler; Hydra's root handler would print every line twice.
    logging.getLogger("lightning.pytorch").propagate = False
    warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec.*")
    # val/loss is reduced over all ranks by the module itself; Lightning cannot tell and suggests sync_dist.
    warnings.filterwarnings("ignore", message=r".*sync_dist=True.*")
    # Our iterable datasets split their items between DataLoader workers, so their __len__ is exact.
    warnings.filterwarnings("ignore", message=r".*`IterableDataset` has `__len__` defined.*")
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision(cfg.float32_matmul_precision)
    if cfg.get("threads") is not None:
        torch.set_num_threads(cfg.threads)

    data_cfg = data_config(_plain(cfg.data))
    resumed = read_checkpoint(ckpt_path) if ckpt_path else None
    optim_cfg = OptimConfig.from_dict(_plain(cfg.optim))
    check_steps(cfg.trainer.max_steps, optim_cfg, resumed.get("global_step") if resumed else None)
    # Pretrained weights (init_from), or the resume of a fine-tuning run, fix the model's config.
    plan = plan_finetune(
        init_from,
        FinetuneConfig.from_dict(_plain(cfg.get("finetune"))),
        explicit_model_keys(cfg),
        ckpt_path=ckpt_path,
        checkpoint_meta=resumed.get("mini_gpt") if resumed else None,
        bpe_file=getattr(data_cfg, "bpe_file", None),
    )
    block_size = plan.config.block_size if plan else cfg.model.block_size
    try:
        dm = GPTDataModule(data_cfg, block_size=block_size, seed=cfg.seed, **cfg.loader)
    except TypeError as err:  # an unknown key in loader
        raise MiniGPTError(f"bad loader config: {err}") from None

    # The Trainer comes before the model: it knows this process's rank (data preparation runs on one).
    run_summary = RunSummary(run_dir / "summary.json", started)
    trial = hydra_trial()
    loggers, log_model = build_loggers(_plain(cfg.get("logger")), trial)
    trainer_cfg, max_flops, precision = trainer_arguments(
        _plain(cfg.trainer), plan.config.n_embd if plan else cfg.model.n_embd
    )
    all_callbacks = _callbacks(cfg, run_summary, callbacks)
    trainer: L.Trainer = _instantiate(
        trainer_cfg, "trainer", callbacks=all_callbacks, logger=loggers or False, _convert_="all"
    )
    check_multirun_strategy(trainer, multirun=trial is not None)
    layout = apply_batch_layout(trainer, dm.batch_size, dm.block_size, cfg.get("global_batch_tokens"))
    if trainer.is_global_zero:
        print(layout.describe(), flush=True)
        print(precision.describe(), flush=True)
        _note_busy_cpu(trainer, cfg.get("threads"), load)

    tokenizer = dm.prepare_once(trainer.local_rank).tokenizer  # DDP children start later, find it ready
    model = plan.build(tokenizer) if plan else None  # checks the data's tokenizer against the source
    if plan and trainer.is_global_zero:
        print(describe(model, plan.record), flush=True)
    gpt_config = (
        plan.config if plan else checked_config(GPTConfig, _model_dict(cfg, tokenizer.vocab_size), "model")
    )
    max_steps = cfg.trainer.max_steps
    if max_flops is not None:
        max_steps = budget_steps(max_flops, flops_per_token(gpt_config), layout.tokens_per_step)
        trainer.fit_loop.epoch_loop.max_steps = max_steps  # trainer.max_steps reads it
        if trainer.is_global_zero:
            print(f"trainer.max_flops={max_flops:.3g}: {max_steps} steps (replaces trainer.max_steps)")
    module = GPTLitModule(
        gpt_config,
        optim_cfg,
        tokenizer=tokenizer,
        max_steps=max_steps,
        compile=cfg.compile,
        model=model,
        finetune=plan.record if plan else None,
        tokens_per_step=layout.tokens_per_step,
        run_config=OmegaConf.to_container(cfg, resolve=False),  # type: ignore[arg-type]
        run_overrides=run_overrides(cfg),
    )
    # trainer.loggers, not `loggers`: fast_dev_run swaps them for a DummyLogger (no W&B run is started)
    for logger in trainer.loggers:  # rank 0 only (Lightning's loggers are rank-zero guarded)
        logger.log_hyperparams({**_plain(cfg), "batch": layout.as_dict()})

    ckpt = trainer.checkpoint_callback
    try:
        if init_from:  # the pretrained model's val loss is the curve's step 0
            trainer.validate(module, datamodule=dm, verbose=False)
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    except Exception as err:  # a dead rank: one line, not a collective's traceback on the survivors
        if (dead := dead_ranks(trainer, err)) is None:
            raise
        raise MiniGPTError(_dead_rank_line(dead, trainer)) from None
    finally:
        best = ckpt and (ckpt.best_model_path or ckpt.last_model_path)
        finish_wandb(loggers, log_model, best or None)
    result = RunResult(run_dir, module, run_summary.summary if trainer.is_global_zero else None)
    if (summary := result.summary) is not None:
        print(
            f"summary: {run_summary.path}\n  steps={summary['steps']} "
            f"best_val_loss={_loss(summary['best_val_loss'])} "
            f"final_val_loss={_loss(summary['final_val_loss'])} "
            f"tokens/s={summary['tokens_per_sec'] or 0:,.0f} wall={summary['wall_seconds']:.1f}s\n"
            f"  last_ckpt={summary['last_ckpt']}"
        )
    return result
