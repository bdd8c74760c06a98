"""mini_gpt.train.distributed: batch arithmetic (hand-computed references) and the FSDP strategy factory."""

from __future__ import annotations

import pytest

from mini_gpt.errors import MiniGPTError
from mini_gpt.train.distributed import BatchLayout, accumulation_for, fsdp_strategy


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
