"""The evaluation tasks for `mini-gpt evaluate` and `callbacks.evaluate`: every input is read first (a wrong
path fails in a second, not after an hour of scoring); each device scores a share, and the counts add up."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from mini_gpt.data.config import data_root
from mini_gpt.eval.bpb import BpbResult, BpbWindows, bpb_windows, score_bpb
from mini_gpt.eval.hellaswag import HellaSwagItem, HellaSwagResult, evaluate_hellaswag, load_hellaswag
from mini_gpt.infer.sampling import eval_no_grad
from mini_gpt.tokenizer import Tokenizer


@dataclass
class TaskInputs:
    bpb: BpbWindows | None = None
    hellaswag: list[HellaSwagItem] | None = None

    def share(self, rank: int, world: int) -> TaskInputs:
        """Device `rank`'s windows and items (rank, rank + world, ...); bpb's `bytes` stays the total."""
        bpb = None if self.bpb is None else replace(self.bpb, windows=self.bpb.windows[rank::world])
        return TaskInputs(bpb, None if self.hellaswag is None else self.hellaswag[rank::world])


def read_inputs(
    tasks: Sequence[str], tokenizer: Tokenizer, block_size: int,
    documents: Callable[[], tuple[list[str], str]], *, stride: int | None = None,
    hellaswag_path: str | None = None, hellaswag_limit: int | None = None,
    hellaswag_key: str = "hellaswag.path", data_dir: str | None = None,
) -> TaskInputs:  # fmt: skip
    """The inputs of `tasks`; `documents()` gives bpb's documents and where they came from; `hellaswag_key`
    names the HellaSwag path's setting in error lines."""
    inputs = TaskInputs()
    if "bpb" in tasks:
        docs, source = documents()
        inputs.bpb = bpb_windows(tokenizer, docs, block_size, stride, source)
    if "hellaswag" in tasks:
        cache = data_root(data_dir) / "hellaswag"
        inputs.hellaswag = load_hellaswag(hellaswag_path, cache, hellaswag_limit, hellaswag_key)
    return inputs


@dataclass
class TaskScores:
    """The tasks' results (None: not run), as counts that add up over devices' shares."""

    bpb: BpbResult | None = None
    hellaswag: HellaSwagResult | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # per task
    source: str = ""  # where bpb's text came from

    def add_up(self, reduce: Callable[[list[float]], list[float]]) -> TaskScores:
        """`reduce` sums a list of numbers over devices (identity on one process); call it on every one."""
        bpb, hellaswag = self.bpb, self.hellaswag
        if bpb is not None:
            nll, tokens = reduce([bpb.nll, bpb.tokens])
            bpb = replace(bpb, nll=nll, tokens=int(tokens))
        if hellaswag is not None:
            correct, correct_norm, n = reduce([hellaswag.correct, hellaswag.correct_norm, hellaswag.n])
            hellaswag = HellaSwagResult(int(correct), int(correct_norm), int(n))
        return replace(self, bpb=bpb, hellaswag=hellaswag)

    def curves(self) -> dict[str, float]:
        out = {}
        if self.bpb is not None:
            out.update({"bpb/bits_per_byte": self.bpb.bits_per_byte, "bpb/loss": self.bpb.loss})
        if self.hellaswag is not None:
            out.update({"hellaswag/acc": self.hellaswag.acc, "hellaswag/acc_norm": self.hellaswag.acc_norm})
        return out

    def to_dict(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        if self.bpb is not None:
            out["bpb"] = {**self.bpb.to_dict(), "text": self.source}
        if self.hellaswag is not None:
            out["hellaswag"] = self.hellaswag.to_dict()
        return {task: {**metrics, "seconds": round(self.seconds[task], 2)} for task, metrics in out.items()}


@eval_no_grad
def score_tasks(
    model: nn.Module, tokenizer: Tokenizer, inputs: TaskInputs, bpb_batch_size: int = 16,
    hellaswag_batch_size: int = 4, progress: bool | None = None,
) -> TaskScores:  # fmt: skip
    """Score `inputs` in eval mode (the model's modes are put back); `progress` None: a bar on a terminal."""
    scores = TaskScores(source="" if inputs.bpb is None else inputs.bpb.source)
    if inputs.bpb is not None:
        t0 = time.perf_counter()
        scores.bpb = score_bpb(model, inputs.bpb, bpb_batch_size)
        scores.seconds["bpb"] = time.perf_counter() - t0
    if inputs.hellaswag is not None:
        t0 = time.perf_counter()
        scores.hellaswag = evaluate_hellaswag(
            model, tokenizer, inputs.hellaswag, hellaswag_batch_size, progress
        )
        scores.seconds["hellaswag"] = time.perf_counter() - t0
    return scores
