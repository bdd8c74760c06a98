"""train()'s early checks of step counts: one line for a non-number, a resume with nothing left to
train, and a note for a run that ends inside its warmup."""

from __future__ import annotations

import pytest

from mini_gpt.errors import MiniGPTError
from mini_gpt.train.optim import OptimConfig
from mini_gpt.train.run import check_steps, check_trainer_numbers


@pytest.mark.parametrize(("key", "value"), [("max_steps", "abc"), ("val_check_interval", True)])
def test_trainer_numbers_refuse_strings_and_booleans(key, value) -> None:
    with pytest.raises(MiniGPTError, match=rf"^trainer\.{key}={value!r} must be a number"):
        check_trainer_numbers({"max_steps": 10, key: value})
    check_trainer_numbers({"max_steps": 10, "limit_val_batches": 0.5, "gradient_clip_val": None})


def test_resume_with_nothing_left_and_a_run_inside_its_warmup(capsys) -> None:
    with pytest.raises(MiniGPTError, match=r"at step 300 and trainer\.max_steps=200: nothing is left"):
        check_steps(200, OptimConfig(warmup_steps=100), resumed_step=300)
    check_steps(50, OptimConfig(warmup_steps=100), resumed_step=10)
    (note,) = capsys.readouterr().out.splitlines()
    assert note.startswith("note: trainer.max_steps=50 <= optim.warmup_steps=100: the learning rate is still")
    check_steps(500, OptimConfig(warmup_steps=100), resumed_step=None)
    check_steps(-1, OptimConfig(warmup_steps=100), resumed_step=None)  # no step limit
    assert capsys.readouterr().out == ""
