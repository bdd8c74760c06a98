"""A wall-clock budget, `trainer.budget_s`: seconds from process start (summed over a run's resumes) in
which the run trains, validates once more and writes its summary. The lr decays by the elapsed fraction of
the budget (warmup stays in steps), so a run ends fully decayed whatever the machine's speed.

Rank 0 reads the clock every `log_every_n_steps` optimizer steps; every rank adopts that reading (one
broadcast), and between two readings the fraction advances by the measured seconds per step. So the ranks
agree on every step's lr and on the step they stop at, and only log steps read the clock (and sync ranks)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from mini_gpt.errors import MiniGPTError

# The final validation's cost before one is measured: a val batch as half a training micro-batch (a forward
# is ~1/3 of a forward and backward, and a step also pays the optimizer), and what comes after it (the last
# checkpoint, the end-of-run sample, summary.json): a second plus 1% of the budget.
VAL_BATCH_COST = 0.5
END_S, END_FRACTION = 1.0, 0.01


@dataclass(frozen=True)
class BudgetReading:
    """The clock as rank 0 read it after optimizer step `step` (what every rank adopts)."""

    step: int  # optimizer steps done
    used: float  # seconds of the budget used by then
    step_s: float  # seconds per optimizer step, validations left out (0: not measured yet)
    reserve: float  # seconds kept after the last step: the final validation and the end of the run

    def as_list(self) -> list[float]:
        return [self.step, self.used, self.step_s, self.reserve]


class TimeBudget:
    """`seconds` of wall clock counted from `started` (time.time() at process start) plus `used_before`
    (the seconds the runs this one resumes spent, from their checkpoint); `clock`: time.time (a test's)."""

    def __init__(
        self, seconds: float, started: float, used_before: float = 0.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.seconds, self.started, self.used_before, self.clock = seconds, started, used_before, clock
        self.reading: BudgetReading | None = None
        self.last_step = math.inf  # the step the run stops after (every rank: from the reading)
        self._mark: tuple[int, float] | None = None  # (step, seconds used) where the step timing restarts
        self._val_since_mark = 0.0  # validation seconds since the mark (not training time)
        self._val_started: float | None = None
        self._longest_val: float | None = None  # the longest validation measured (the final one's estimate)

    def used(self) -> float:
        """Seconds of the budget used so far (this process's since its start, plus the earlier runs')."""
        return self.used_before + self.clock() - self.started

    def start(self, step: int) -> BudgetReading:
        """Rank 0, as the fit starts (`step`: the steps a resumed run has done): the step timing starts."""
        used = self.used()
        self._mark = (step, used)
        return BudgetReading(step, used, 0.0, self._end_s())

    def validation_started(self) -> None:
        self._val_started = self.clock()

    def validation_ended(self) -> None:
        if self._val_started is not None and self._mark is not None:
            took = self.clock() - self._val_started
            self._val_since_mark += took
            self._longest_val = max(took, self._longest_val or 0.0)
        self._val_started = None

    def read(self, step: int, val_batches: int, accumulate: int) -> BudgetReading:
        """Rank 0, after optimizer step `step`: seconds used, per step (since the last reading, validations
        left out) and kept for the end (`val_batches` per validation, `accumulate` micro-batches a step)."""
        assert self._mark is not None, "start() comes first"  # (rank 0 only)
        used = self.used()
        mark_step, mark_used = self._mark
        step_s = max(used - mark_used - self._val_since_mark, 0.0) / max(step - mark_step, 1)
        self._mark, self._val_since_mark = (step, used), 0.0
        val_s = self._longest_val
        if val_s is None:  # before the first validation: from the step time
            val_s = val_batches * step_s / accumulate * VAL_BATCH_COST
        return BudgetReading(step, used, step_s, val_s + self._end_s())

    def adopt(self, reading: BudgetReading) -> None:
        """Every rank: the reading decides the lr of the steps to come and the step the run stops after; a
        budget spent before the first step (start-up, or the runs this one resumes) is one line."""
        if not reading.step_s and reading.used >= self.seconds:
            before = self.used_before
            spent = f"the runs this one resumes used {before:.1f} s and " if before else ""
            raise MiniGPTError(
                f"trainer.budget_s={self.seconds:g} is spent before the first step ({spent}this run's "
                f"start-up took {reading.used - before:.1f} s); raise trainer.budget_s"
            )
        self.reading = reading
        left = self.seconds - reading.reserve - reading.used
        # the next step must end before the reserve; at least the step just done when none fits
        self.last_step = math.inf
        if reading.step_s:
            self.last_step = reading.step + max(math.floor(left / reading.step_s), 0)

    def fraction(self, step: int) -> float:
        """The budget's elapsed fraction (0 -> 1) when optimizer step `step` (0-based) starts, the reserve
        left out: 1 at the last step that fits."""
        if self.reading is None:
            return 0.0
        r = self.reading
        at = r.used + max(step - r.step, 0) * r.step_s
        return min(max(at / max(self.seconds - r.reserve, 1e-9), 0.0), 1.0)

    def plan_line(self, tokens_per_step: int) -> str:
        """What the reading expects: steps, tokens/s, what was used before training and what is kept."""
        r = self.reading
        assert r is not None and r.step_s, "a reading with a step time"
        steps = f"~{self.last_step:,} steps" if math.isfinite(self.last_step) else "steps unknown"
        rate = f" at {tokens_per_step / r.step_s:,.0f} tokens/s" if tokens_per_step else ""
        return (
            f"budget {self.seconds:g} s: {steps} expected{rate} ({r.step_s * 1000:.0f} ms/step measured "
            f"to step {r.step}; {r.used:.1f} s used, {r.reserve:.1f} s kept for the final validation and the "
            "end)"
        )

    def _end_s(self) -> float:
        return END_S + END_FRACTION * self.seconds
