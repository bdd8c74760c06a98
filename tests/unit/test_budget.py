"""trainer.budget_s: a time budget driven by a fake clock. The lr follows the elapsed fraction of the
budget (checked against the cosine formula written out here), a resumed run continues the fraction,
validations do not count as step time, and the run stops at the last step that leaves the reserve."""

from __future__ import annotations

import math

import pytest
import torch

from mini_gpt.conf.train import OptimConfig, TrainerConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.train.budget import END_FRACTION, END_S, BudgetReading, TimeBudget
from mini_gpt.train.optim import build_scheduler, lr_multiplier


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def cosine(fraction: float, floor: float = 0.1) -> float:
    """The decay written out: from 1 at fraction 0 to `floor` at fraction 1."""
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * fraction))


def _run(budget: TimeBudget, clock: FakeClock, steps: int, step_s: float, start: int = 0) -> None:
    """Steps of `step_s` seconds; rank 0's reading after the first step and every 10th, as the module does."""
    budget.adopt(budget.start(start))
    for step in range(start + 1, start + steps + 1):
        clock.now += step_s
        if step == start + 1 or step % 10 == 0:
            budget.adopt(budget.read(step, val_batches=0, accumulate=1))


def seconds_for(span: float) -> float:
    """The budget whose decay spans `span` seconds once the end's reserve (no validation) is kept."""
    return (span + END_S) / (1 - END_FRACTION)


def test_the_lr_follows_the_elapsed_fraction_of_the_budget() -> None:
    """A budget whose decay spans 100.5 s; no start-up; steps of exactly 1 s. The lr at 0%, 50% and 100% of
    the budget is the cosine's at 0, 0.5 and 1 (the warmup, in steps, comes first)."""
    clock, span = FakeClock(), 100.5
    budget = TimeBudget(seconds_for(span), started=clock.now, clock=clock)
    multiplier = lr_multiplier(OptimConfig(warmup_steps=5, min_lr_ratio=0.1), -1, budget.fraction)
    budget.adopt(budget.start(0))
    lrs = {0: multiplier(0)}  # lrs[k]: the lr of step k (0-based) as the scheduler sets it after step k-1
    for done in range(1, 200):
        clock.now += 1.0
        if done == 1 or done % 10 == 0:
            budget.adopt(budget.read(done, val_batches=0, accumulate=1))
        lrs[done] = multiplier(done)
        if done >= budget.last_step:
            break
    assert lrs[2] == pytest.approx(3 / 5)  # warmup: by steps, whatever the clock
    assert lrs[5] == pytest.approx(cosine(5 / span))  # 0%: step 5 starts 5 s in
    assert lrs[50] == pytest.approx(cosine(50 / span))  # 50%
    # 100%: the 100th step (index 99) ends at 100 s; a 101st would end past the 100.5 s the decay spans
    assert done == budget.last_step == 100
    assert lrs[99] == pytest.approx(cosine(99 / span))
    assert multiplier(101) == pytest.approx(cosine(1.0)) == pytest.approx(0.1)  # the budget's end: the floor


def test_an_lr_scheduler_on_the_budget_decays_by_time_not_steps() -> None:
    """Half the steps at 1 s, then steps of 3 s: at equal elapsed time the lr is equal, so the schedule
    slows with the steps (a step count would keep falling at the same pace)."""
    clock = FakeClock()
    budget = TimeBudget(seconds_for(100.0), started=clock.now, clock=clock)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = build_scheduler(optimizer, OptimConfig(warmup_steps=0, min_lr_ratio=0.0), -1, budget.fraction)
    budget.adopt(budget.start(0))
    lrs = {}
    for step in range(1, 41):
        clock.now += 1.0 if step <= 20 else 3.0
        if step == 1 or step % 10 == 0:
            budget.adopt(budget.read(step, val_batches=0, accumulate=1))
        optimizer.step()
        scheduler.step()
        lrs[step] = optimizer.param_groups[0]["lr"]
    # after step 40 the clock says 20 + 60 = 80 s; the reading at step 40 gives 3 s per step
    assert budget.fraction(40) == pytest.approx(0.8, rel=1e-6)
    assert lrs[40] == pytest.approx(2.0 * cosine(0.8, floor=0.0))
    # a schedule by steps over the same 40 steps would be at its floor here
    assert lrs[40] > 0.1


def test_a_resumed_run_continues_the_budget() -> None:
    """A run stopped after 30 s of a 100 s budget and resumed: the fraction goes on from 30 s (plus the
    new process's start-up), so its lr is the uninterrupted run's at the same seconds used."""
    clock = FakeClock()
    whole = TimeBudget(100.0, started=clock.now, clock=clock)
    _run(whole, clock, steps=30, step_s=1.0)
    resumed_clock = FakeClock(5000.0)
    startup = 2.0
    resumed = TimeBudget(100.0, started=resumed_clock.now - startup, used_before=30.0, clock=resumed_clock)
    assert resumed.used() == pytest.approx(32.0)
    _run(resumed, resumed_clock, steps=10, step_s=1.0, start=30)
    clock.now += startup  # the uninterrupted run idles as long as the new process started
    for step in range(31, 41):
        clock.now += 1.0
        if step % 10 == 0:
            whole.adopt(whole.read(step, val_batches=0, accumulate=1))
    assert resumed.used() == pytest.approx(whole.used())
    assert resumed.fraction(40) == pytest.approx(whole.fraction(40))
    assert resumed.last_step == 40 + math.floor(100 - (END_S + END_FRACTION * 100) - 42)


def test_validations_are_not_step_time_and_the_longest_is_kept_for_the_end() -> None:
    clock = FakeClock()
    budget = TimeBudget(100.0, started=clock.now, clock=clock)
    budget.adopt(budget.start(0))
    clock.now += 2.0
    budget.adopt(budget.read(1, val_batches=10, accumulate=2))
    # before any validation: 10 val batches as half a micro-batch each (step 2 s / 2 micro-batches)
    assert budget.reading.reserve == pytest.approx(10 * 1.0 * 0.5 + END_S + END_FRACTION * 100)
    for _ in range(9):  # steps 2..10 at 0.5 s, and a validation of 4 s inside them
        clock.now += 0.5
    budget.validation_started()
    clock.now += 4.0
    budget.validation_ended()
    reading = budget.read(10, val_batches=10, accumulate=2)
    assert reading.step_s == pytest.approx(0.5)  # (4.5 s - 4 s of validation) over 9 steps
    assert reading.reserve == pytest.approx(4.0 + END_S + END_FRACTION * 100)
    assert reading.used == pytest.approx(10.5)


def test_a_budget_spent_before_the_first_step_is_one_line() -> None:
    clock = FakeClock()
    budget = TimeBudget(5.0, started=clock.now - 7.9, clock=clock)  # start-up took 7.9 s
    with pytest.raises(MiniGPTError, match=r"^trainer.budget_s=5 is spent before the first step \(this "
                       r"run's start-up took 7.9 s\); raise trainer.budget_s$"):  # fmt: skip
        budget.adopt(budget.start(0))
    resumed = TimeBudget(20.0, started=clock.now - 3.0, used_before=18.0, clock=clock)
    with pytest.raises(MiniGPTError, match=r"the runs this one resumes used 18.0 s and this run's start-up "
                       r"took 3.0 s"):  # fmt: skip
        resumed.adopt(resumed.start(40))


def test_every_rank_stops_at_the_step_of_rank_0s_reading() -> None:
    """Other ranks adopt the broadcast reading: their own clocks (here far off) decide nothing."""
    reading = BudgetReading(step=100, used=50.0, step_s=0.5, reserve=10.0)
    ranks = [TimeBudget(100.0, started=t, clock=FakeClock(t + 999.0)) for t in (0.0, 123.0)]
    for budget in ranks:
        budget.adopt(BudgetReading(*reading.as_list()))
    assert [b.last_step for b in ranks] == [100 + 80, 100 + 80]  # (100 - 10 - 50) / 0.5 steps more
    assert ranks[0].fraction(150) == ranks[1].fraction(150) == pytest.approx((50 + 25) / 90)


def test_budget_settings_are_checked() -> None:
    with pytest.raises(MiniGPTError, match=r"trainer.budget_s=0 must be a positive number of seconds"):
        TrainerConfig(budget_s=0)
    with pytest.raises(MiniGPTError, match="are two budgets; set one of them to null"):
        TrainerConfig(budget_s=600, max_flops=1e13)
    with pytest.raises(MiniGPTError, match=r"optim.decay_steps=100 counts steps"):
        lr_multiplier(OptimConfig(decay_steps=100), -1, lambda step: 0.0)
