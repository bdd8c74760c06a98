"""Multi-device: rank and batch arithmetic before the Trainer, dead ranks named, FSDP (docs/training.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hydra.utils import get_class

from mini_gpt.errors import MiniGPTError


def _counts(**values: Any) -> None:
    """One line for the first value that is not an int >= 1 (True and 2.5 count nothing)."""
    for key, value in values.items():
        if type(value) is not int or value < 1:
            raise MiniGPTError(f"{key}={value!r} must be a positive integer")


def _env_rank(keys: Sequence[str]) -> int:
    return next((int(os.environ[key]) for key in keys if os.environ.get(key, "").isdigit()), 0)


def launcher_rank() -> int:
    """This process's global rank as its launcher set it (Lightning's DDP, torchrun, SLURM), else 0."""
    return _env_rank(("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"))


def local_rank() -> int:
    return _env_rank(("LOCAL_RANK", "SLURM_LOCALID", "JSM_NAMESPACE_LOCAL_RANK"))


# What a collective raises on a surviving rank when a peer process died (gloo, NCCL, the TCP store).
_PEER_GONE = ("connection reset by peer", "connection closed by peer", "broken pipe", "nccl",
              "socket timeout")  # fmt: skip


def dead_ranks(trainer: Any, err: BaseException) -> str | None:
    """The dead rank behind `err`, in words, or None. Lightning's own child ranks are named (the survivors
    killed); under torchrun / SLURM a lost connection is all there is."""
    if getattr(trainer, "world_size", 1) <= 1:
        return None
    launched = getattr(getattr(trainer.strategy, "launcher", None), "procs", None)
    procs = list(launched or [])
    dead = []
    for rank, proc in enumerate(procs, start=1):
        if code := proc.poll():  # killed by a signal: -N
            how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
            dead.append(f"rank {rank} (pid {proc.pid}, {how})")
    if dead:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        # Lightning 2.6's child-process observer would SIGKILL this process (within 5 s) for a dead child,
        # cutting the error line's exit (status 2) short: all are reaped here, so it has nothing to watch.
        launched.clear()
        return " and ".join(dead) + " died"
    text = f"{type(err).__name__}: {err}".lower()
    if any(marker in text for marker in _PEER_GONE):
        return f"another rank died or lost its connection (this is rank {trainer.global_rank})"
    return None


@dataclass(frozen=True)
class BatchLayout:
    """How one optimizer step's batch is spread over micro-batches, accumulation, devices and nodes."""

    micro_batch: int  # sequences per forward pass on one device (loader.batch_size)
    block_size: int  # tokens per sequence (model.block_size)
    accumulate: int = 1  # micro-batches per optimizer step on each device (trainer.accumulate_grad_batches)
    devices: int = 1  # processes per node (trainer.devices once resolved)
    num_nodes: int = 1  # machines (trainer.num_nodes)

    def __post_init__(self) -> None:
        _counts(**asdict(self))

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    @property
    def sequences_per_step(self) -> int:
        return self.micro_batch * self.accumulate * self.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.sequences_per_step * self.block_size

    def as_dict(self) -> dict[str, int]:
        derived = ("world_size", "sequences_per_step", "tokens_per_step")
        return {**asdict(self), **{key: getattr(self, key) for key in derived}}

    def describe(self) -> str:
        return (
            f"tokens per optimizer step = {self.micro_batch} micro-batch x {self.accumulate} accumulate x "
            f"{self.devices} devices x {self.num_nodes} nodes x {self.block_size} block_size "
            f"= {self.tokens_per_step:,}"
        )


def devices_per_node(accelerator: str, devices: Any) -> int:
    """The processes Lightning starts per node, resolved as its accelerators do (`auto`: every GPU)."""
    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

    from mini_gpt.train.precision import device_type  # here: torch is imported with it

    if device_type(accelerator) == "cuda":
        if devices == "auto":
            return CUDAAccelerator.auto_device_count()
        return len(CUDAAccelerator.parse_devices(devices) or [])
    if devices == "auto" or accelerator not in ("cpu", "auto"):
        return 1  # Apple's MPS and other single-device accelerators
    return CPUAccelerator.parse_devices(devices)


def refuse_multirun_devices(world_size: int, external: bool, devices: Any) -> None:
    """DDP re-running the script per device would run the whole sweep per rank, and ddp_spawn returns no
    val loss: a trial trains alone or as a rank a cluster launcher (`external`) started."""
    if world_size > 1 and not external:
        raise MiniGPTError(
            "Hydra multirun (-m) cannot run a multi-device strategy started from inside the trial "
            f"(trainer.devices={devices}): sweep with one device per trial, or run each trial as a "
            "multi-GPU SLURM job with hydra/launcher=slurm"
        )


def check_relaunch(launcher: Any) -> None:
    """One line instead of Lightning's `can't open file '.../mini-gpt train'` in every other rank: the
    `mini-gpt` command and `python -m mini_gpt.cli` have no command line a rank could run again."""
    # Lightning 2.6 starts ranks 1..N-1 of `trainer=ddp` with this launcher, by running the process's command
    # again: `python <argv[0]> <argv[1:]>`, or `python -m <__main__'s module> ...`.
    if type(launcher).__name__ != "_SubprocessScriptLauncher":
        return
    import __main__

    spec = getattr(__main__, "__spec__", None)
    if (spec is None and not os.path.isfile(sys.argv[0])) or (spec and spec.name == "mini_gpt.cli.__main__"):
        raise MiniGPTError(
            "a multi-device run starts its other processes by running its command again, which "
            "`mini-gpt train` cannot be: run `python -m mini_gpt.cli.train` with the same overrides (or "
            "`python train.py ...` in the checkout, or torchrun: docs/training.md)"
        )


def batch_layout(
    trainer: Any, micro_batch: int, block_size: int, global_batch_tokens: int | None
) -> BatchLayout:
    devices, nodes = devices_per_node(trainer.accelerator, trainer.devices), trainer.num_nodes
    accumulate = trainer.accumulate_grad_batches
    if global_batch_tokens is not None:
        accumulate = accumulation_for(global_batch_tokens, micro_batch, block_size, devices * nodes)
    return BatchLayout(micro_batch, block_size, accumulate, devices, nodes)


def accumulation_for(global_batch_tokens: int, micro_batch: int, block_size: int, world_size: int) -> int:
    """Micro-batches per device for exactly `global_batch_tokens` a step (rounding would change the batch)."""
    _counts(global_batch_tokens=global_batch_tokens, micro_batch=micro_batch, block_size=block_size,
            world_size=world_size)  # fmt: skip
    per_pass = micro_batch * block_size * world_size
    accumulate, rest = divmod(global_batch_tokens, per_pass)
    if rest or accumulate == 0:
        below, above = accumulate * per_pass, (accumulate + 1) * per_pass
        nearest = f"{above:,}" if accumulate == 0 else f"{below:,} or {above:,}"
        raise MiniGPTError(
            f"global_batch_tokens={global_batch_tokens:,} is not a multiple of micro_batch x block_size x "
            f"world_size = {micro_batch} x {block_size} x {world_size} = {per_pass:,} tokens; use "
            f"{nearest}, or change loader.batch_size / trainer.devices"
        )
    return accumulate


def fsdp_strategy(
    wrap: Sequence[str] = ("mini_gpt.model.gpt.Block",), activation_checkpointing: bool = False,
    sharding_strategy: str = "FULL_SHARD", cpu_offload: bool = False, state_dict_type: str = "full",
    **kwargs: Any,
) -> Any:  # fmt: skip
    """Lightning's FSDPStrategy with each module of a `wrap` class one FSDP unit."""
    from lightning.pytorch.strategies import FSDPStrategy  # here: this module is imported before Lightning

    classes = set()
    for name in wrap:
        try:
            classes.add(get_class(name))
        except (ImportError, ValueError):
            hint = "give a dotted path like mini_gpt.model.gpt.Block"
            raise MiniGPTError(f"cannot import the module class {name!r}; {hint}") from None
    if not classes:
        raise MiniGPTError(
            "trainer.strategy.wrap is empty; list at least one module class (mini_gpt.model.gpt.Block)"
        )
    checkpointed = set(classes) if activation_checkpointing else None
    return FSDPStrategy(
        auto_wrap_policy=classes, activation_checkpointing_policy=checkpointed, cpu_offload=cpu_offload,
        sharding_strategy=sharding_strategy, state_dict_type=state_dict_type, **kwargs,
    )  # fmt: skip
