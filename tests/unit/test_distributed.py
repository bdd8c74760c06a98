"""mini_gpt.train.distributed: batch arithmetic (hand-computed references) and the FSDP strategy factory."""

from __future__ import annotations

from typing import Any

import pytest

from mini_gpt.errors import MiniGPTError
from mini_gpt.train.distributed import (
    BatchLayout,
    accumulation_for,
    check_relaunch,
    dead_ranks,
    fsdp_strategy,
)


def test_tokens_per_step_single_device() -> None:
    layout = BatchLayout(micro_batch=8, block_size=64, accumulate=2)
    assert layout.world_size == 1
    assert layout.sequences_per_step == 16
    assert layout.tokens_per_step == 1024  # 8 * 2 * 64


def test_tokens_per_step_two_nodes_of_eight_gpus() -> None:
    layout = BatchLayout(micro_batch=12, block_size=1024, accumulate=5, devices=8, num_nodes=2)
    assert layout.world_size == 16
    assert layout.sequences_per_step == 960  # 12 * 5 * 16
    assert layout.tokens_per_step == 983_040  # 960 * 1024
    assert layout.as_dict() == {
        "micro_batch": 12,
        "block_size": 1024,
        "accumulate": 5,
        "devices": 8,
        "num_nodes": 2,
        "world_size": 16,
        "sequences_per_step": 960,
        "tokens_per_step": 983_040,
    }
    assert layout.describe().endswith("= 983,040")


@pytest.mark.parametrize(
    ("global_tokens", "micro", "block", "world", "expected"),
    [
        (1024, 8, 64, 1, 2),  # one device: accumulate the two micro-batches
        (1024, 8, 64, 2, 1),  # two devices take one micro-batch each
        (491_520, 12, 1024, 8, 5),  # 12 * 1024 * 8 = 98,304 tokens per pass
        (524_288, 16, 1024, 32, 1),
    ],
)
def test_accumulation_for(global_tokens: int, micro: int, block: int, world: int, expected: int) -> None:
    assert accumulation_for(global_tokens, micro, block, world) == expected


def test_accumulation_round_trips_every_layout() -> None:
    for accumulate in (1, 3, 4):
        for devices, nodes in ((1, 1), (2, 1), (8, 2)):
            layout = BatchLayout(8, 32, accumulate, devices, nodes)
            assert accumulation_for(layout.tokens_per_step, 8, 32, devices * nodes) == accumulate


def test_accumulation_not_divisible_names_the_nearest_batches() -> None:
    with pytest.raises(MiniGPTError, match=r"1,000 is not a multiple .* 512 tokens; use 512 or 1,024"):
        accumulation_for(1000, 8, 64, 1)


def test_accumulation_smaller_than_one_pass() -> None:
    with pytest.raises(MiniGPTError, match=r"use 2,048"):
        accumulation_for(1024, 8, 64, 4)


@pytest.mark.parametrize("bad", [0, -8, 2.5, True, "8"])
def test_non_positive_or_non_int_values_are_rejected(bad: object) -> None:
    with pytest.raises(MiniGPTError, match="micro_batch"):
        BatchLayout(micro_batch=bad, block_size=64)  # type: ignore[arg-type]
    with pytest.raises(MiniGPTError, match="global_batch_tokens"):
        accumulation_for(bad, 8, 64, 1)  # type: ignore[arg-type]


def test_fsdp_strategy_wraps_blocks() -> None:
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from mini_gpt.model.gpt import Block

    plain = fsdp_strategy(sharding_strategy="SHARD_GRAD_OP")
    assert isinstance(plain, FSDPStrategy)
    policy = plain.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy)
    assert policy._module_classes == {Block}
    assert plain.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    assert plain._activation_checkpointing_kwargs == {}
    assert plain._state_dict_type == "full"

    checkpointed = fsdp_strategy(activation_checkpointing=True)
    ac_policy = checkpointed._activation_checkpointing_kwargs["auto_wrap_policy"]
    assert ac_policy._module_classes == {Block}
    assert checkpointed.sharding_strategy == ShardingStrategy.FULL_SHARD


@pytest.mark.parametrize("bad", ["mini_gpt.model.gpt.NoSuchBlock", "no_such_module.Block", "Block"])
def test_fsdp_strategy_bad_class_path(bad: str) -> None:
    with pytest.raises(MiniGPTError, match="cannot import the module class"):
        fsdp_strategy(wrap=[bad])


class _Proc:
    """A launcher child process as `subprocess.Popen` shows it: `poll()` is its exit code or None."""

    def __init__(self, pid: int, code: int | None) -> None:
        self.pid, self.code, self.killed = pid, code, False

    def poll(self) -> int | None:
        return self.code

    def kill(self) -> None:
        self.killed, self.code = True, -9


def _ddp_trainer(procs: list[_Proc], world_size: int = 3) -> Any:
    from types import SimpleNamespace

    launcher = SimpleNamespace(procs=procs)
    return SimpleNamespace(world_size=world_size, global_rank=0, strategy=SimpleNamespace(launcher=launcher))


def test_dead_ranks_names_the_dead_child_and_kills_the_survivors() -> None:
    survivor, dead = _Proc(11, None), _Proc(12, -9)
    error = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    trainer = _ddp_trainer([survivor, dead])
    assert dead_ranks(trainer, error) == "rank 2 (pid 12, killed by signal 9) died"
    assert survivor.killed  # nothing left behind
    # Lightning's observer thread watches this list and would SIGKILL rank 0 mid-exit: left empty
    assert trainer.strategy.launcher.procs == []
    assert dead_ranks(_ddp_trainer([_Proc(11, 3)], 2), error) == "rank 1 (pid 11, exit status 3) died"


def test_dead_ranks_without_launcher_children_goes_by_the_lost_connection() -> None:
    torchrun = _ddp_trainer([], world_size=2)
    lost = RuntimeError("[gloo] Read error [127.0.0.1]:43914: Connection reset by peer")
    assert dead_ranks(torchrun, lost) == "another rank died or lost its connection (this is rank 0)"
    assert (
        dead_ranks(torchrun, ValueError("a bug of our own")) is None
    )  # not a lost peer: the traceback stays
    assert dead_ranks(_ddp_trainer([_Proc(5, -9)], world_size=1), lost) is None  # one process: no peers


def test_a_ddp_run_the_mini_gpt_command_cannot_relaunch_is_one_line(monkeypatch, tmp_path) -> None:
    """Lightning's DDP re-runs `python argv[0] ...` (or `python -m <__main__'s module>`) for ranks 1..N-1."""
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    import __main__

    script = tmp_path / "train.py"
    script.write_text("")
    launcher = object.__new__(_SubprocessScriptLauncher)  # the class Lightning 2.6 uses for trainer=ddp
    cases = [  # (__main__'s spec name, argv[0], refused)
        (None, "mini-gpt train", True),  # the console script: mini_gpt.cli set argv[0] to the verb
        ("mini_gpt.cli.__main__", "/x/mini_gpt/cli/__main__.py", True),  # python -m mini_gpt.cli train
        (None, str(script), False),  # python train.py
        ("mini_gpt.cli.train", "/x/mini_gpt/cli/train.py", False),  # python -m mini_gpt.cli.train
    ]
    for name, argv0, refused in cases:
        spec = type("Spec", (), {"name": name})() if name else None
        monkeypatch.setattr(__main__, "__spec__", spec, raising=False)
        monkeypatch.setattr("sys.argv", [argv0, "trainer=ddp"])
        if refused:
            with pytest.raises(MiniGPTError, match=r"run `python -m mini_gpt.cli.train` with the same"):
                check_relaunch(launcher)
        else:
            check_relaunch(launcher)
        check_relaunch(object.__new__(_MultiProcessingLauncher))  # ddp_spawn / fork: nothing re-run
        check_relaunch(None)  # one device
