"""The schema of `mini-gpt train`; `data`'s dataclass depends on its `name` (mini_gpt.data.config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mini_gpt.errors import MiniGPTError, at_least, one_of, threads_setting
from mini_gpt.model.gpt import GPTConfig

LORA_TARGETS = ("c_attn", "c_proj", "c_fc")


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | muon (Muon for hidden 2-D matrices, AdamW for the rest)
    lr: float = 1e-3  # peak AdamW learning rate, reached after warmup_steps
    min_lr_ratio: float = 0.1  # the decay ends at min_lr_ratio x lr (for Muon: x muon_lr)
    weight_decay: float = 0.1  # AdamW's decay, on 2-D matmul weights only (see decay_embeddings)
    betas: tuple[float, float] = (0.9, 0.99)  # AdamW's betas
    eps: float = 1e-8
    decay_embeddings: bool = False  # also decay token/position embeddings (and a tied head)
    fused: bool | None = None  # null = fused AdamW where supported, else foreach
    schedule: str = "cosine"  # cosine | linear | constant (the lr after warmup)
    warmup_steps: int = 100  # linear warmup from lr/warmup_steps to lr
    decay_steps: int | None = None  # step where the decay reaches its floor; null = trainer.max_steps
    muon_lr: float = 0.02  # Muon's peak lr (orthogonalised updates: ~10-20x AdamW's lr is typical)
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0
    muon_nesterov: bool = True
    muon_ns_steps: int = 5  # Newton-Schulz iterations that orthogonalise the update
    muon_adjust_lr_fn: str | None = None  # null/original: lr x sqrt(max(1, rows/cols)); match_rms_adamw
    # the Newton-Schulz matmuls' dtype; auto: bfloat16 on a GPU or a CPU with native bf16, else float32
    muon_ns_dtype: str = "auto"  # auto | bfloat16 | float32

    def __post_init__(self) -> None:
        one_of(("adamw", "muon"), **{"optim.name": self.name})
        one_of(("cosine", "linear", "constant"), **{"optim.schedule": self.schedule})
        one_of(("auto", "bfloat16", "float32"), **{"optim.muon_ns_dtype": self.muon_ns_dtype})
        for key in ("lr", "muon_lr"):
            if not getattr(self, key) > 0:
                raise MiniGPTError(f"optim.{key}={getattr(self, key)} must be > 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise MiniGPTError(f"optim.min_lr_ratio={self.min_lr_ratio} must be in [0, 1] (floor / peak lr)")
        if self.weight_decay < 0 or self.muon_weight_decay < 0:
            raise MiniGPTError("optim.weight_decay and optim.muon_weight_decay must be >= 0")
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]  # YAML gives a list
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise MiniGPTError(f"optim.betas={list(self.betas)} must be two numbers in [0, 1)")
        at_least(0, **{"optim.warmup_steps": self.warmup_steps})
        at_least(1, **{"optim.decay_steps": self.decay_steps})


@dataclass
class FinetuneConfig:
    """conf/finetune/: what trains when a run starts from pretrained weights (init_from=...)."""

    method: str = "full"  # full | lora
    freeze_embeddings: bool = False  # full: freeze wte (and a head tied to it) and wpe
    train_last_n_blocks: int | None = None  # train (full) or adapt (lora) only the last N blocks; null = all
    lora_rank: int = 8  # rank r of the adapters (A: r x in, B: out x r)
    lora_alpha: float = 16.0  # the update is scaled by lora_alpha / lora_rank
    lora_dropout: float = 0.05  # dropout on the adapters' input
    lora_targets: tuple[str, ...] = LORA_TARGETS  # projections that get adapters: c_attn, c_proj, c_fc

    def __post_init__(self) -> None:
        one_of(("full", "lora"), **{"finetune.method": self.method})
        at_least(1, **{"finetune.train_last_n_blocks": self.train_last_n_blocks})
        at_least(1, **{"finetune.lora_rank": self.lora_rank})
        self.lora_targets = tuple(self.lora_targets)
        if set(self.lora_targets) - set(LORA_TARGETS) or not self.lora_targets:
            raise MiniGPTError(
                f"finetune.lora_targets={list(self.lora_targets)} must be a non-empty subset of "
                f"{list(LORA_TARGETS)}"
            )
        if not self.lora_alpha > 0:
            raise MiniGPTError(f"finetune.lora_alpha={self.lora_alpha} must be > 0")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise MiniGPTError(f"finetune.lora_dropout={self.lora_dropout} must be in [0, 1)")

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "lora_targets": list(self.lora_targets)}


@dataclass
class LoaderConfig:
    """Batches fed to the model (mini_gpt.data.datamodule.GPTDataModule); block_size is model.block_size."""

    batch_size: int = 12  # sequences per micro-batch (per device)
    num_workers: int = 0  # DataLoader worker processes; 0 = load in the training process
    pin_memory: Any = "auto"  # pinned host memory for faster host->GPU copies: auto (on a GPU) | true | false
    val_windows: Any = "auto"  # val loss on this many evenly spaced val windows: auto | N | all
    align_to_documents: bool = False  # sharded corpora: every train window starts at a document start
    # N > 0: each train window is a span of ceil(N / 2) to N corpus tokens (drawn per window), repeated to
    # fill it, so copying by content pays: induction heads form (experiment=induction_heads). Val: plain
    repeat_span: int = 0

    def __post_init__(self) -> None:
        at_least(1, **{"loader.batch_size": self.batch_size})
        at_least(0, **{"loader.num_workers": self.num_workers})
        if self.pin_memory not in ("auto", True, False):
            raise MiniGPTError(f"loader.pin_memory={self.pin_memory!r} must be auto, true or false")


@dataclass
class TrainerConfig:
    """conf/trainer/: the arguments of Lightning's Trainer (its `_target_`), plus `max_flops` and
    `budget_s` (ours: they set max_steps)."""

    _target_: str = "lightning.pytorch.Trainer"
    accelerator: str = "auto"  # auto | cpu | gpu | mps
    devices: Any = 1  # devices per node: N, auto or a list
    num_nodes: int = 1  # machines; devices x num_nodes processes in all
    strategy: Any = "auto"  # auto | ddp | a strategy node with _target_ (trainer=ddp, trainer=fsdp)
    precision: str = "auto"  # auto | 32-true | bf16-mixed | 16-mixed (auto: bf16 where it pays)
    max_steps: int = 500  # optimizer steps
    max_flops: float | None = None  # a budget in training FLOPs that sets max_steps (null = max_steps)
    # a wall-clock budget in seconds from process start (over resumes) that replaces max_steps: the lr
    # decays by its elapsed fraction, the final validation and summary fit inside it (null = max_steps)
    budget_s: float | None = None
    max_epochs: int = -1  # no epoch limit (one endless epoch)
    val_check_interval: int = 250  # evaluate every N optimizer steps (and after the last)
    check_val_every_n_epoch: int | None = None  # null: val_check_interval counts steps across epochs
    limit_val_batches: Any = 1.0  # fraction (float) or number (int) of the val windows' batches
    limit_train_batches: Any = 1.0
    num_sanity_val_steps: int = 0  # no sanity validation before training: a faster start
    log_every_n_steps: int = 10  # train/loss, lr, grad_norm, tokens/s, mfu read (one sync) this often
    accumulate_grad_batches: int = 1  # micro-batches per optimizer step (global_batch_tokens sets it)
    gradient_clip_val: float | None = 1.0  # clip the global gradient norm to this; null = no clipping
    gradient_clip_algorithm: str = "norm"  # norm | value
    enable_checkpointing: bool = True
    enable_progress_bar: bool = True
    enable_model_summary: bool = True
    deterministic: Any = False  # true | false | warn
    benchmark: bool | None = None  # cudnn.benchmark
    fast_dev_run: Any = False  # true or N: N train and val batches to check the wiring, nothing written
    overfit_batches: Any = 0.0  # train on this many (int) or this fraction (float) of batches only
    detect_anomaly: bool = False  # autograd anomaly detection (slow): finds the op that made a NaN
    profiler: str | None = None  # simple | advanced | pytorch
    default_root_dir: str | None = None  # where Lightning writes what is not configured elsewhere
    plugins: list[Any] = field(default_factory=list)  # the checkpoint writer (AtomicCheckpointIO)

    def __post_init__(self) -> None:
        at_least(1, **{"trainer.num_nodes": self.num_nodes, "trainer.val_check_interval":
                        self.val_check_interval, "trainer.log_every_n_steps": self.log_every_n_steps,
                        "trainer.accumulate_grad_batches": self.accumulate_grad_batches})  # fmt: skip
        at_least(-1, **{"trainer.max_steps": self.max_steps})
        if self.max_flops is not None and not self.max_flops > 0:
            raise MiniGPTError(f"trainer.max_flops={self.max_flops} must be a positive number of FLOPs")
        if self.budget_s is not None and not self.budget_s > 0:
            raise MiniGPTError(f"trainer.budget_s={self.budget_s} must be a positive number of seconds")
        if self.budget_s is not None and self.max_flops is not None:
            raise MiniGPTError(
                f"trainer.max_flops={self.max_flops:.3g} and trainer.budget_s={self.budget_s:g} are two "
                "budgets; set one of them to null"
            )


@dataclass
class PathsConfig:
    """conf/paths/: absolute paths, independent of the working directory."""

    root_dir: str = "${project_root:}"  # the checkout (an installed package: the working directory)
    output_dir: str = "${paths.root_dir}/outputs"  # all runs go below here
    run_dir: str = "${hydra:runtime.output_dir}"  # this run's directory (hydra.run.dir / hydra.sweep)


@dataclass
class StudySettings:
    """`hparams_search`: the Optuna study of `mini-gpt sweep` (e.g. conf/hparams_search/lr_search.yaml)."""

    study_name: str  # the study's name in its storage
    dir: str  # the trials' folders, the storage and trials.csv
    storage: str | None  # sqlite:///PATH (killed trials are retried), a journal file path, null: in memory
    n_trials: int  # finished trials the study stops at, all workers together
    direction: str = "minimize"  # minimize | maximize the trials' best val/loss
    sampler: dict[str, Any] = field(default_factory=dict)  # _target_: an optuna.samplers class, its arguments
    pruner: dict[str, Any] = field(default_factory=dict)  # name: median | successive_halving | none
    params: dict[str, str] = field(default_factory=dict)  # the searched keys: interval, range, choice, ...
    when: dict[str, str] = field(default_factory=dict)  # key: key=value, search key only where it holds
    heartbeat_interval: int = 10  # seconds between a running trial's heartbeats (database storage)
    grace_period: int = 30  # a running trial without a heartbeat for this long was killed: retry it

    def __post_init__(self) -> None:
        if self.direction not in ("minimize", "maximize"):
            raise MiniGPTError(f"hparams_search.direction={self.direction!r} must be minimize or maximize")
        counts = ("n_trials", "heartbeat_interval", "grace_period")
        at_least(1, **{f"hparams_search.{key}": getattr(self, key) for key in counts})
        if not self.params:
            raise MiniGPTError("hparams_search.params is empty: name at least one key to search")
        for key in self.when:
            if key not in self.params:
                raise MiniGPTError(f"hparams_search.when.{key}: {key} is not one of hparams_search.params")


@dataclass
class TrainConfig:
    model: GPTConfig = field(default_factory=GPTConfig)  # conf/model/: char | tiny | baby | gpt2
    data: Any = None  # conf/data/: shakespeare_char | shakespeare | text | hf | shards | ...
    optim: OptimConfig = field(default_factory=OptimConfig)  # conf/optim/: muon | adamw
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)  # conf/finetune/: full | lora
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # conf/trainer/: default | cpu | gpu | ...
    callbacks: dict[str, Any] = field(default_factory=dict)  # conf/callbacks/: _target_ nodes; null drops one
    logger: dict[str, Any] = field(default_factory=dict)  # conf/logger/: wandb | csv | none
    paths: PathsConfig = field(default_factory=PathsConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    hparams_search: Any = None  # conf/hparams_search/: Optuna searches (mini-gpt sweep)
    seed: int = 1337  # seeds python/numpy/torch and the data stream
    ckpt_path: str | None = None  # resume from this checkpoint (its run's config + the command line's)
    init_from: str | None = None  # start from pretrained weights: gpt2 | gpt2-medium | ... | a dir | a .ckpt
    compile: bool = False  # torch.compile the model
    float32_matmul_precision: str = "high"  # highest | high (TF32 on GPUs) | medium
    threads: Any = "auto"  # CPU threads for torch: auto (torch's default, fewer on a busy CPU) | N
    global_batch_tokens: int | None = None  # tokens per optimizer step; sets trainer.accumulate_grad_batches
    tags: list[str] = field(default_factory=list)  # labels for the run (W&B tags)

    def __post_init__(self) -> None:
        one_of(("highest", "high", "medium"), float32_matmul_precision=self.float32_matmul_precision)
        self.threads = threads_setting(self.threads)
        at_least(1, global_batch_tokens=self.global_batch_tokens)
