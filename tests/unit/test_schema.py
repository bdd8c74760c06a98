"""conf.schema: OmegaConf checks a config section against its dataclass; refusals are one line."""

from __future__ import annotations

import pytest

from mini_gpt.conf.schema import checked_config
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPTConfig
from mini_gpt.train.optim import OptimConfig


@pytest.mark.parametrize(
    "section, cls, d, line",
    [
        ("model", GPTConfig, {"n_layer": "abc"}, "model.n_layer='abc' must be an integer; fix it"),
        ("model", GPTConfig, {"n_layer": 2.5}, "model.n_layer=2.5 must be an integer"),
        ("model", GPTConfig, {"bias": "maybe"}, "model.bias='maybe' must be true or false"),
        ("optim", OptimConfig, {"lr": "fast"}, "optim.lr='fast' must be a number"),
        ("optim", OptimConfig, {"decay_steps": "x"}, "optim.decay_steps='x' must be an integer or null"),
        ("optim", OptimConfig, {"betas": ["a", 0.9]}, "optim.betas[0]='a' must be a number"),
        ("model", GPTConfig, {"n_embed": 3, "x": 1}, "model: unknown key(s) ['n_embed', 'x']; the keys are"),
    ],
)
def test_refusals_are_one_line(section: str, cls: type, d: dict, line: str) -> None:
    with pytest.raises(MiniGPTError) as info:
        checked_config(cls, d, section)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


def test_values_are_converted_to_the_field_types() -> None:
    config = checked_config(OptimConfig, {"lr": 1, "warmup_steps": "7", "decay_steps": None}, "optim")
    assert (config.lr, config.warmup_steps, config.decay_steps) == (1.0, 7, None)
    assert isinstance(config.lr, float) and config.betas == (0.9, 0.99)
    # the dataclass still checks the ranges
    with pytest.raises(MiniGPTError, match=r"optim\.lr=-1\.0 must be > 0"):
        checked_config(OptimConfig, {"lr": -1}, "optim")


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
