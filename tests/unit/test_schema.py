"""The configs' schemas: Hydra checks every key and type of a composed config against the verb's dataclass,
`checked_config` checks a section read later the same way, and `checked_arguments` a `_target_` node
against its class's signature; every refusal is one line naming the key and what it must be."""

from __future__ import annotations

from typing import Any

import pytest

from mini_gpt.conf import checked_arguments, checked_config, compose_command_line, typed_config
from mini_gpt.conf.tools import EvaluateConfig, GenerateConfig, InspectConfig, ServeConfig
from mini_gpt.conf.train import OptimConfig, TrainConfig
from mini_gpt.data.config import DataConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPTConfig


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["model.n_layer=abc"], "model.n_layer='abc' must be an integer; fix it on the command line or"),
        (["model.n_layer=2.5"], "model.n_layer=2.5 must be an integer"),
        (["model.bias=maybe"], "model.bias='maybe' must be true or false"),
        (["optim.lr=fast"], "optim.lr='fast' must be a number"),
        (["optim.decay_steps=x"], "optim.decay_steps='x' must be an integer or null"),
        (["optim.betas=[a,0.9]"], "optim.betas[0]='a' must be a number"),
        (["trainer.max_steps=abc"], "trainer.max_steps='abc' must be an integer"),
        (["trainer.val_check_interval=true"], "trainer.val_check_interval=True must be an integer"),
        (["trainer.max_flops=lots"], "trainer.max_flops='lots' must be a number or null"),
        (["seed=1.5"], "seed=1.5 must be an integer"),
        (
            ["model.n_embed=3"],
            "train: unknown key 'model.n_embed'; the keys of model are vocab_size, block_size",
        ),
        (
            ["optim.min_lr=1e-4"],
            "train: unknown key 'optim.min_lr'; the keys of optim are name, lr, min_lr_ratio",
        ),
        (["tags=a,b"], "train: tags=a,b is ambiguous: write a list in brackets, tags=[a,b]"),
    ],
)
def test_a_refused_override_is_one_line(overrides: list[str], line: str) -> None:
    with pytest.raises(MiniGPTError) as info:
        compose_command_line("train", overrides)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


def test_composed_values_have_the_schema_types(compose: Any) -> None:
    cfg = compose(["optim.lr=1", "optim.warmup_steps=7", "trainer.max_flops=1e12"])
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.trainer.max_flops) == (1.0, 7, 1e12)
    assert isinstance(cfg.optim.lr, float) and isinstance(cfg.trainer.max_flops, float)


@pytest.mark.parametrize(
    ("verb", "schema"),
    [
        ("train", TrainConfig),
        ("generate", GenerateConfig),
        ("evaluate", EvaluateConfig),
        ("serve", ServeConfig),
        ("inspect", InspectConfig),
    ],
)
def test_threads_are_auto_unless_a_number_is_given(verb: str, schema: type) -> None:
    assert compose_command_line(verb, []).threads == "auto"  # the YAML's default
    assert compose_command_line(verb, ["threads=2"]).threads == 2
    assert schema(threads=2).threads == 2
    assert schema(threads=None).threads == "auto"  # what configs saved before `auto` hold
    for value in "many", 0, 2.5, True:
        with pytest.raises(MiniGPTError) as info:
            schema(threads=value)
        assert str(info.value) == f"threads={value!r} must be auto or a positive integer"


@pytest.mark.parametrize(
    ("cls", "section", "d", "line"),
    [
        (DataConfig, "data", {"val_fraction": "lots"}, "data.val_fraction='lots' must be a number; fix it"),
        (DataConfig, "data", {"pth": "x.txt"}, "data: unknown key 'pth'; the keys are name, path, tokenizer"),
        (OptimConfig, "optim", {"lr": -1}, "optim.lr=-1.0 must be > 0"),  # the dataclass's own range check
    ],
)
def test_a_section_read_later_is_checked_the_same_way(cls: type, section: str, d: dict, line: str) -> None:
    with pytest.raises(MiniGPTError) as info:
        checked_config(cls, d, section)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)
    assert checked_config(OptimConfig, {"lr": 1, "warmup_steps": "7"}, "optim").warmup_steps == 7


def test_a_target_nodes_arguments_are_checked_against_its_signature() -> None:
    node = {"_target_": "mini_gpt.train.callbacks.SampleText", "max_new_tokens": "12", "top_k": None}
    assert checked_arguments(node, "callbacks.sample_text") == {**node, "max_new_tokens": 12}
    with pytest.raises(
        MiniGPTError, match=r"^callbacks\.sample_text\.max_new_tokens='abc' must be an integer"
    ):
        checked_arguments({**node, "max_new_tokens": "abc"}, "callbacks.sample_text")
    with pytest.raises(
        MiniGPTError, match=r"^callbacks\.throughput: unknown key 'peak'; the keys are peak_flops"
    ):
        checked_arguments(
            {"_target_": "mini_gpt.train.callbacks.Throughput", "peak": 1}, "callbacks.throughput"
        )


def test_the_train_schema_is_the_dataclass_every_section_becomes() -> None:
    hints = TrainConfig.__dataclass_fields__
    assert hints["model"].default_factory is GPTConfig and hints["optim"].default_factory is OptimConfig


def test_the_model_configs_own_checks_are_one_line_too() -> None:
    """GPTConfig raises plain ValueErrors (the model imports nothing of mini_gpt's); building it from a
    config section turns them into the same one-line MiniGPTError."""
    with pytest.raises(ValueError, match="n_embd=100 is not divisible") as plain:
        GPTConfig(n_embd=100, n_head=3)
    assert not isinstance(plain.value, MiniGPTError)
    with pytest.raises(MiniGPTError, match=r"^GPTConfig: n_embd=100 is not divisible by n_head=3; set model"):
        checked_config(GPTConfig, {"n_embd": 100, "n_head": 3}, "model")
    with pytest.raises(MiniGPTError, match=r"^GPTConfig\.norm='batchnorm' must be one of"):
        checked_config(GPTConfig, {"norm": "batchnorm"}, "model")
    cfg = compose_command_line("train", ["model.n_embd=100", "model.n_head=3"])  # types fine, ranges not
    with pytest.raises(MiniGPTError, match=r"^GPTConfig: n_embd=100 is not divisible by n_head=3"):
        typed_config(cfg, "train")
