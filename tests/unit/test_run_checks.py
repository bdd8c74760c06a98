"""train()'s early checks of step counts: a resume with nothing left to train is one line, a run that
ends inside its warmup gets a note."""

from __future__ import annotations

import pytest

from mini_gpt.errors import MiniGPTError
from mini_gpt.train.run import check_steps


def test_resume_with_nothing_left_and_a_run_inside_its_warmup(capsys) -> None:
    with pytest.raises(MiniGPTError, match=r"at step 300 and trainer\.max_steps=200: nothing is left"):
        check_steps(200, 100, resumed_step=300)
    check_steps(50, 100, resumed_step=10)
    (note,) = capsys.readouterr().out.splitlines()
    assert note.startswith("note: trainer.max_steps=50 <= optim.warmup_steps=100: the learning rate is still")
    check_steps(500, 100, resumed_step=None)
    check_steps(-1, 100, resumed_step=None)  # no step limit
    assert capsys.readouterr().out == ""
