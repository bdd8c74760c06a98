"""train.py end to end: Hydra compose API and subprocesses, tiny model, a few steps on tiny Shakespeare.

The data cache is a private tmp dir built from the repository's read-only corpus (never the network).
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import REPO

from mini_gpt.conf import CONF_DIR

SUMMARY_KEYS = {
    "best_val_loss",
    "final_val_loss",
    "steps",
    "tokens",
    "wall_seconds",
    "tokens_per_sec",
    "precision",
    "threads",
    "val_curve",
    "best_ckpt",
    "last_ckpt",
}


def _overrides(
    run_dir: Path, data_dir: Path, shakespeare: Path, *extra: str, model: str = "tiny"
) -> list[str]:
    return [
        f"model={model}",
        "logger=none",
        f"paths.run_dir={run_dir}",
        f"data.path={shakespeare}",
        f"data.data_dir={data_dir}",
        "loader.batch_size=8",
        "loader.val_windows=32",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1",
        "callbacks.sample_text.every_n_steps=0",
        "callbacks.sample_text.max_new_tokens=16",
        *extra,
    ]


def _fit(
    compose: Any, overrides: list[str], resume: bool = False, hydra_dir: Path | None = None
) -> tuple[dict[str, Any], Any]:
    """Run train() on a composed config (`resume`: as train.py does, the resumed run's own config plus
    `overrides`; `hydra_dir`: inside a Hydra job as train.py's, with that output directory); return
    (summary.json, train()'s RunResult)."""
    from hydra.core.hydra_config import HydraConfig

    from mini_gpt.train.run import train

    if hydra_dir is not None:  # what hydra.main sets up before it calls train.py's main
        (hydra_dir / ".hydra").mkdir(parents=True, exist_ok=True)
        job = compose([*overrides, f"hydra.runtime.output_dir={hydra_dir}"], hydra=True)
        HydraConfig.instance().set_config(job)
    try:
        cfg = compose(overrides)
        result = train(cfg, overrides=overrides if resume else None)
    finally:
        HydraConfig.instance().cfg = None
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert result.run_dir == Path(cfg.paths.run_dir).resolve() and result.summary == summary
    assert result.best_val_loss == summary["best_val_loss"]
    assert result.last_ckpt == (Path(summary["last_ckpt"]) if summary["last_ckpt"] else None)
    return summary, result


def test_compose_train_summary_and_loss_decreases(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    run_dir = tmp_path / "run"
    summary, run = _fit(
        compose,
        _overrides(
            run_dir,
            char_data_dir,
            shakespeare_path,
            "logger=csv",
            "trainer.max_steps=40",
            "trainer.val_check_interval=15",
            "optim.lr=1e-2",
            "optim.warmup_steps=5",
        ),
    )
    assert set(summary) >= SUMMARY_KEYS
    assert summary["steps"] == 40
    assert summary["tokens"] == 40 * 8 * 64
    assert summary["val_tokens"] == 32 * 64  # loader.val_windows=32
    assert summary["val_split_tokens"] == 111_540
    # evaluations at 15, 30 and the end (40), with wall times from process start, increasing
    assert [row[0] for row in summary["val_curve"]] == [15, 30, 40]
    times = [row[1] for row in summary["val_curve"]]
    assert times == sorted(times) and 0 < times[0] < summary["wall_seconds"]
    assert summary["final_val_loss"] == summary["val_curve"][-1][2]
    assert summary["best_val_loss"] == min(row[2] for row in summary["val_curve"])
    assert summary["tokens_per_sec"] > 0
    assert summary["precision"] == "32-true"  # auto: a 32-wide model stays float32 on any CPU
    # ln(65) = 4.17 for a uniform guess; 40 steps at lr 1e-2 must learn the character frequencies
    assert summary["val_curve"][0][2] < 4.0
    assert summary["final_val_loss"] < summary["val_curve"][0][2]
    first, last = run.record.train_curve[0][1], run.record.train_curve[-1][1]
    assert last < first - 0.5
    assert Path(summary["last_ckpt"]).is_file() and Path(summary["best_ckpt"]).is_file()
    assert Path(summary["last_ckpt"]).parent == run_dir / "checkpoints"
    # CSV logger got every metric the module promises
    header = (run_dir / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/loss", "val/loss", "val/ppl", "lr", "grad_norm", "tokens_per_sec", "mfu"} <= set(header)
    # ... and val/loss is stamped with the optimizer step it was measured at (as in summary.json)
    with (run_dir / "csv" / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["val/loss"]]
    assert [int(r["step"]) for r in rows] == [15, 30, 40]
    assert [float(r["val/loss"]) for r in rows] == pytest.approx([row[2] for row in summary["val_curve"]])


@pytest.mark.parametrize("native_bf16", [False, True])
def test_precision_auto_follows_the_cpus_bf16_support(
    compose: Any,
    tmp_path: Path,
    char_data_dir: Path,
    shakespeare_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    native_bf16: bool,
) -> None:
    # The CPU's answer forced both ways: a 256-wide model trains in bf16 autocast only where it says yes
    for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, check, lambda: native_bf16, raising=False)
    overrides = _overrides(
        tmp_path / "run", char_data_dir, shakespeare_path, "model.n_embd=256", "trainer.max_steps=2"
    )
    summary, run = _fit(compose, overrides)
    expected = "bf16-mixed" if native_bf16 else "32-true"
    assert summary["precision"] == expected
    assert f"precision: {expected} (auto: " in capsys.readouterr().out
    assert run.module.model.lm_head.weight.dtype == torch.float32  # mixed: the weights stay float32


def test_exact_resume_and_same_seed(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    k = 6
    common = ("trainer.val_check_interval=3", "optim.decay_steps=12", "optim.warmup_steps=2", "optim.lr=3e-3")
    common = (*common, "trainer.precision=32-true", "optim.name=muon")  # Muon + AdamW state both restored
    full, full_run = _fit(
        compose,
        _overrides(tmp_path / "full", char_data_dir, shakespeare_path, *common, f"trainer.max_steps={2 * k}"),
    )
    half, half_run = _fit(
        compose,
        _overrides(tmp_path / "half", char_data_dir, shakespeare_path, *common, f"trainer.max_steps={k}"),
    )
    # same seed, same config: identical losses step for step
    assert half_run.record.train_curve == full_run.record.train_curve[:k]
    resumed, resumed_run = _fit(
        compose,
        _overrides(
            tmp_path / "resumed",
            char_data_dir,
            shakespeare_path,
            *common,
            f"trainer.max_steps={2 * k}",
            f"ckpt_path={half['last_ckpt']}",
        ),
    )
    assert resumed_run.record.start_step == k
    assert resumed["start_step"] == k and full["start_step"] == 0  # summary.json: where a plot marks it
    assert resumed_run.record.train_curve == full_run.record.train_curve[k:]  # bit-identical
    assert resumed["final_val_loss"] == full["final_val_loss"]
    assert resumed["steps"] == 2 * k


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_preemption_at_a_random_step_saves_and_resumes_exactly(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path, signum: int
) -> None:
    """SIGTERM / SIGUSR1 at a random step: that step finishes, last.ckpt holds it, summary.json says
    preempted; resuming ends on the uninterrupted run's val loss."""
    from mini_gpt.train.stops import Preempted

    step = random.Random().randint(1, 11)
    common = ("trainer.max_steps=12", "trainer.val_check_interval=5", "optim.warmup_steps=2", "optim.lr=3e-3")
    whole, _ = _fit(compose, _overrides(tmp_path / "whole", char_data_dir, shakespeare_path, *common))
    hit = ("+callbacks.preempt._target_=helpers.signal_at_step", f"+callbacks.preempt.step={step}")
    hit_dir = tmp_path / "hit"
    with pytest.raises(Preempted, match=f"stopped after step {step}, last.ckpt saved"):
        _fit(
            compose,
            _overrides(
                hit_dir, char_data_dir, shakespeare_path, *common, *hit, f"+callbacks.preempt.signum={signum}"
            ),
        )
    summary = json.loads((hit_dir / "summary.json").read_text())
    assert (summary["status"], summary["steps"]) == ("preempted", step), f"signal at step {step}"
    last = hit_dir / "checkpoints" / "last.ckpt"
    assert summary["last_ckpt"] == str(last) and torch.load(last, weights_only=True)["global_step"] == step
    resumed, _ = _fit(
        compose,
        _overrides(tmp_path / "resumed", char_data_dir, shakespeare_path, *common, f"ckpt_path={last}"),
    )
    assert resumed["status"] == "completed" and resumed["start_step"] == step
    assert resumed["final_val_loss"] == whole["final_val_loss"], f"signal at step {step}"


def test_preemption_with_gradient_accumulation_stops_at_a_micro_batch_and_resumes_exactly(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    """4 micro-batches a step, dropout on. SIGTERM as micro-batch 2 of step 3 begins: the run stops after
    that micro-batch, not after the step; last.ckpt holds step 2 and the resumed run redoes step 3. SIGTERM
    in step 2's last micro-batch (an evaluation step): the run stops after step 2, before its evaluation.
    Each resumed run ends on the uninterrupted run's val loss, bit for bit."""
    from mini_gpt.train.stops import Preempted

    common = ("trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.accumulate_grad_batches=4")
    common = (*common, "model.dropout=0.1", "optim.warmup_steps=1", "optim.lr=3e-3")
    whole, _ = _fit(compose, _overrides(tmp_path / "whole", char_data_dir, shakespeare_path, *common))
    mid_step = "mid-step (micro-batch 2 of 4 of step 3, which a resume redoes), last.ckpt saved at step 2"
    for name, step, micro_batch, stopped in (
        ("mid-step", 3, 2, mid_step), ("after an evaluation step", 2, 4, "after step 2, last.ckpt saved")
    ):  # fmt: skip
        hit = ("+callbacks.preempt._target_=helpers.signal_at_step", f"+callbacks.preempt.step={step}")
        hit = (*hit, f"+callbacks.preempt.micro_batch={micro_batch}")
        hit_dir = tmp_path / name
        with pytest.raises(
            Preempted, match=re.escape(f"preempted by SIGTERM: stopped {stopped} (summary.json")
        ):
            _fit(compose, _overrides(hit_dir, char_data_dir, shakespeare_path, *common, *hit))
        summary = json.loads((hit_dir / "summary.json").read_text())
        assert (summary["status"], summary["steps"]) == ("preempted", 2)
        last = hit_dir / "checkpoints" / "last.ckpt"
        assert torch.load(last, weights_only=True)["global_step"] == 2
        resumed, _ = _fit(
            compose,
            _overrides(
                tmp_path / f"{name} resumed", char_data_dir, shakespeare_path, *common, f"ckpt_path={last}"
            ),
        )
        assert (resumed["status"], resumed["start_step"], resumed["steps"]) == ("completed", 2, 4), name
        assert resumed["final_val_loss"] == whole["final_val_loss"], name


@pytest.mark.parametrize("model", ["tiny", "char"])
def test_the_same_seed_gives_the_same_numbers_whatever_the_load(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path, model: str
) -> None:
    """One command three times: on two threads, on one, and with threads=auto beside a busy process (auto
    takes fewer threads on a busy CPU): the same val curve, bit for bit (the tiny model and the default)."""
    from helpers import busy_processes

    common = ("trainer.max_steps=12", "trainer.val_check_interval=4", "seed=7", "optim.warmup_steps=2")
    summaries = {}
    for name, threads, busy in (("two", "2", 0), ("one", "1", 0), ("busy", "auto", 1)):
        with busy_processes(busy):
            overrides = _overrides(tmp_path / name, char_data_dir, shakespeare_path, *common, model=model)
            summaries[name], _ = _fit(compose, [*overrides, f"threads={threads}"])
    assert (summaries["two"]["threads"], summaries["one"]["threads"]) == (2, 1)
    assert summaries["busy"]["threads_reason"].startswith("auto: ")
    curves = {name: [(step, val) for step, _, val in s["val_curve"]] for name, s in summaries.items()}
    assert len(curves["two"]) == 3
    assert curves["one"] == curves["two"] == curves["busy"], summaries["busy"]["threads_reason"]


def test_killed_again_and_again_under_changing_load_resumes_exactly(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    """`kill -9` three times, each restart on another thread count beside another number of busy
    processes (what threads=auto does when the load changes): the last resumed run ends on the
    uninterrupted run's val loss, bit for bit."""
    from helpers import busy_processes

    common = ("trainer.max_steps=12", "trainer.val_check_interval=2", "optim.warmup_steps=2", "optim.lr=3e-3")
    whole, _ = _fit(compose, _overrides(tmp_path / "whole", char_data_dir, shakespeare_path, *common))
    env = _env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(REPO / "tests")  # helpers.signal_at_step in the child
    last: Path | None = None
    # (the step at whose start the run kills itself, its threads, busy processes beside it); a last.ckpt
    # every 2 steps, so each restart redoes the steps the kill lost.
    for i, (kill_at, threads, busy) in enumerate(((4, "2", 0), (7, "1", 1), (10, "auto", 2), (None, "2", 1))):
        run_dir = tmp_path / f"part{i}"
        args = _overrides(run_dir, char_data_dir, shakespeare_path, *common, f"threads={threads}")
        args += ["callbacks.sample_text.at_end=false", f"hydra.run.dir={run_dir}"]
        args += [f"ckpt_path={last}"] if last else []
        # `++`: a resumed run restores its config, this callback included; step 0 never comes
        args += ["++callbacks.kill._target_=helpers.signal_at_step", f"++callbacks.kill.step={kill_at or 0}"]
        args += [f"++callbacks.kill.signum={int(signal.SIGKILL)}"]
        with busy_processes(busy):
            proc = subprocess.run(
                [sys.executable, str(REPO / "train.py"), *args],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
            )  # fmt: skip
        if kill_at:
            assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
            last = run_dir / "checkpoints" / "last.ckpt"
            saved = kill_at - 1 - (kill_at - 1) % 2  # the last evaluation before the kill
            assert torch.load(last, weights_only=True)["global_step"] == saved
    assert proc.returncode == 0, proc.stderr[-2000:]
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert (resumed["status"], resumed["start_step"], resumed["steps"]) == ("completed", 8, 12)
    assert resumed["final_val_loss"] == whole["final_val_loss"]


def test_ctrl_c_prints_the_summary_last(
    compose: Any,
    tmp_path: Path,
    char_data_dir: Path,
    shakespeare_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C saves and stops after the step (Lightning then exits with status 1): summary.json says
    interrupted, and its path is printed last, as after a completed run."""
    common = ("trainer.max_steps=8", "trainer.val_check_interval=4", "optim.warmup_steps=1")
    ctrl_c = ("+callbacks.ctrl_c._target_=helpers.signal_at_step", "+callbacks.ctrl_c.step=3")
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):
            _fit(compose, _overrides(tmp_path, char_data_dir, shakespeare_path, *common, *ctrl_c,
                                     f"+callbacks.ctrl_c.signum={int(signal.SIGINT)}"))  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)  # Lightning leaves SIGINT ignored after an interrupt
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["steps"]) == ("interrupted", 3)
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-3] == f"summary: {tmp_path / 'summary.json'}", out[-6:]


def test_resume_restores_the_run_config_and_prints_what_changes(
    compose: Any,
    tmp_path: Path,
    char_data_dir: Path,
    shakespeare_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import warnings

    first = ("trainer.max_steps=4", "trainer.val_check_interval=2", "optim.lr=7e-3", "optim.warmup_steps=1")
    first_overrides = _overrides(tmp_path / "first", char_data_dir, shakespeare_path, *first)
    summary, _ = _fit(compose, first_overrides, hydra_dir=tmp_path / "first")
    capsys.readouterr()
    # The command names only the checkpoint, a new directory and a longer run: the rest is the run's own.
    again = [
        f"paths.run_dir={tmp_path / 'second'}",
        f"ckpt_path={summary['last_ckpt']}",
        "trainer.max_steps=6",
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, run = _fit(compose, again, resume=True, hydra_dir=tmp_path / "second")
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        f"resuming {summary['last_ckpt']} with its run's overrides and the command line's; changes from the "
        "run's config:",
        "  trainer.max_steps: 4 -> 6",
    ]
    assert run.module.optim_config.lr == 7e-3 != compose([]).optim.lr  # the run's lr, not the default
    assert run.record.start_step == 4 and resumed["steps"] == 6
    assert [row[0] for row in resumed["val_curve"]] == [6]  # the run's val_check_interval=2 kept
    assert not [w for w in caught if "dirpath" in str(w.message)], [str(w.message) for w in caught]
    assert Path(resumed["last_ckpt"]).parent == tmp_path / "second" / "checkpoints"
    ckpt = torch.load(resumed["last_ckpt"], map_location="cpu", weights_only=True)
    assert ckpt["run_config"]["trainer"]["max_steps"] == 6 and ckpt["run_config"]["optim"]["lr"] == 7e-3
    # the overrides that compose it, for the next resume: the first run's (its run dir aside), then these
    kept = [o for o in first_overrides if not o.startswith("paths.run_dir=")]
    assert ckpt["run_overrides"] == [*kept, *again]
    assert (tmp_path / "second" / ".hydra" / "config.yaml").is_file()  # the config that ran


def test_a_recipes_budget_yields_to_max_steps_and_a_stopped_run_resumes_as_printed(
    compose: Any,
    tmp_path: Path,
    char_data_dir: Path,
    shakespeare_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The recipe's trainer.budget_s (600 s) yields to trainer.max_steps=6; stopped
    at step 4, the run resumes with the printed command's arguments alone and ends at step 6."""
    from omegaconf import OmegaConf

    from mini_gpt.train.stops import Preempted

    recipe = (
        "model.block_size=64",
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "optim.warmup_steps=2",
    )
    stop = ("+callbacks.preempt._target_=helpers.signal_at_step", "+callbacks.preempt.step=4")
    first = [
        "experiment=shakespeare_char_10min",
        *_overrides(tmp_path / "first", char_data_dir, shakespeare_path, *recipe, *stop),
    ]
    with pytest.raises(Preempted):
        _fit(compose, first, hydra_dir=tmp_path / "first")
    out, err = capsys.readouterr()
    dropped = "trainer.max_steps=6 given: it replaces trainer.budget_s=600 (the budget, now null)"
    assert dropped in out.splitlines()
    assert OmegaConf.load(tmp_path / "first" / ".hydra" / "config.yaml").trainer.budget_s is None  # compare's
    printed = next(line for line in err.splitlines() if line.startswith("resume with: "))
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    assert shlex.split(printed.removeprefix("resume with: "))[2:] == [f"ckpt_path={last}"]
    again = [f"ckpt_path={last}", f"paths.run_dir={tmp_path / 'second'}"]  # (the run directory: the test's)
    resumed, _ = _fit(compose, again, resume=True, hydra_dir=tmp_path / "second")
    assert (resumed["status"], resumed["start_step"], resumed["steps"]) == ("completed", 4, 6)


def test_a_budget_given_up_is_said_once_over_the_runs_resumes(
    compose: Any,
    tmp_path: Path,
    char_data_dir: Path,
    shakespeare_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run on the recipe's budget stopped at step 2 and resumed with trainer.max_steps=4 says the budget
    yields (news: the run had it); resumed again with trainer.max_steps=6 (the saved overrides set
    trainer.max_steps after the recipe too), it does not say it again: the run gave the budget up already."""
    from mini_gpt.train.stops import Preempted

    line = "given: it replaces trainer.budget_s=600 (the budget, now null)"
    small = ("model.block_size=64", "trainer.val_check_interval=2", "optim.warmup_steps=1")
    stop = ("+callbacks.preempt._target_=helpers.signal_at_step", "+callbacks.preempt.step=2")
    first = [
        "experiment=shakespeare_char_10min",
        *_overrides(tmp_path / "first", char_data_dir, shakespeare_path, *small, *stop),
    ]
    with pytest.raises(Preempted):
        _fit(compose, first, hydra_dir=tmp_path / "first")
    assert line not in capsys.readouterr().out  # the budget's 600 s: nothing yields
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    again = [f"ckpt_path={last}", f"paths.run_dir={tmp_path / 'second'}", "trainer.max_steps=4"]
    _fit(compose, again, resume=True, hydra_dir=tmp_path / "second")
    assert capsys.readouterr().out.count(f"trainer.max_steps=4 {line}") == 1
    last = tmp_path / "second" / "checkpoints" / "last.ckpt"
    third = [f"ckpt_path={last}", f"paths.run_dir={tmp_path / 'third'}", "trainer.max_steps=6"]
    resumed, _ = _fit(compose, third, resume=True, hydra_dir=tmp_path / "third")
    assert resumed["steps"] == 6 and line not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("threads", "chosen", "line"),
    [
        ("auto", 1, "threads: 1 (auto: other processes keep 1.2 of this machine's 2 CPU cores busy)"),
        ("2", 2, "threads: 2 (as set)"),
    ],
)
def test_threads_auto_takes_the_free_cores_and_threads_n_forces(
    compose: Any,
    tmp_path: Path,
    char_data_dir: Path,
    shakespeare_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    threads: str,
    chosen: int,
    line: str,
) -> None:
    from mini_gpt import machine
    from mini_gpt.train import run

    class BusySetUp:  # the load meter's verdict on the set-up: others kept 1.2 cores busy (no timing)
        other_load = 1.2

        def __init__(self, *_: Any) -> None:
            pass

        def start(self) -> BusySetUp:
            return self

        def stop(self) -> BusySetUp:
            return self

    monkeypatch.setattr(run, "LoadMeter", BusySetUp)
    monkeypatch.setattr(machine, "machine_cores", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # torch's default on two cores
    try:
        extra = ("debug=fast_dev_run", f"threads={threads}")
        summary, _ = _fit(compose, _overrides(tmp_path, char_data_dir, shakespeare_path, *extra))
        assert summary["threads"] == chosen and torch.get_num_threads() == 2  # the run's choice, given back
    finally:
        torch.set_num_threads(before)
    assert line in capsys.readouterr().out.splitlines()


def test_overfit_one_batch(compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path) -> None:
    _, run = _fit(
        compose,
        _overrides(
            tmp_path / "overfit",
            char_data_dir,
            shakespeare_path,
            "debug=overfit_batch",
            "loader.batch_size=2",
            "trainer.max_steps=150",
            "trainer.val_check_interval=150",
            "optim.lr=2e-2",
            "optim.min_lr_ratio=1.0",
            "model.n_embd=64",
        ),
    )
    assert run.record.train_curve[0][1] > 3.5
    assert run.record.train_curve[-1][1] < 0.2, run.record.train_curve[-5:]


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["NETRC"] = str(home / "no-netrc")  # no credentials: W&B must go offline by itself, no prompt
    env["PYTHONPATH"] = str(REPO)
    return env


def test_fast_dev_run_writes_no_checkpoint_and_starts_no_logger(
    compose: Any,
    tmp_path: Path,
    char_data_dir: Path,
    shakespeare_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # a W&B run would leave wandb/offline-run-* behind
    run_dir = tmp_path / "run"
    overrides = [
        o for o in _overrides(run_dir, char_data_dir, shakespeare_path) if not o.startswith("logger=")
    ]
    summary, _ = _fit(compose, [*overrides, "debug=fast_dev_run", "logger=wandb"])
    assert summary["steps"] == 1
    assert summary["last_ckpt"] is None and summary["best_ckpt"] is None
    assert not list(run_dir.rglob("*.ckpt"))
    assert not (run_dir / "wandb").exists()
    # what conf/debug/fast_dev_run.yaml promises
    assert "checkpoints and loggers" in (CONF_DIR / "debug" / "fast_dev_run.yaml").read_text()


def test_subprocess_default_wandb_offline_from_other_cwd(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = [a for a in _overrides(run_dir, char_data_dir, shakespeare_path) if not a.startswith("logger=")]
    args = [a for a in args if not a.startswith(("paths.run_dir", "trainer.enable_progress_bar"))]
    args += [f"hydra.run.dir={run_dir}", "trainer.max_steps=4", "trainer.val_check_interval=2"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=tmp_path,
        env={**_env(tmp_path), "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1 and any(offline_runs[0].glob("*.wandb"))
    # W&B: no deprecation noise, and the way to upload said once, with the login step
    assert "anonymous" not in console
    assert console.count("wandb sync") == 1
    hint = next(line for line in proc.stdout.splitlines() if "wandb sync" in line)
    assert "wandb login" in hint and hint.endswith(f"wandb sync {offline_runs[0]}")
    assert "IterableDataset" not in proc.stdout + proc.stderr  # Lightning's false alarm is filtered
    # the summary's path and headline numbers are printed last
    tail = proc.stdout.strip().splitlines()[-3:]
    assert tail[0] == f"summary: {run_dir / 'summary.json'}"
    assert "best_val_loss=" in tail[1] and "tokens/s=" in tail[1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["last_ckpt"] == str(run_dir / "checkpoints" / "last.ckpt")
    # losses to 4 decimals on the console (summary.json keeps every digit)
    assert f"best_val_loss={summary['best_val_loss']:.4f} final_val_loss=" in tail[1]
    # the progress bar's final line fits 80 columns and shows the summary's tokens/s
    bar = [line for line in proc.stdout.splitlines() if line.startswith("train ") and "tok/s" in line]
    assert len(bar) == 1 and len(bar[0].rstrip()) <= 80, bar
    assert f" {summary['tokens_per_sec']:,.0f} tok/s" in bar[0]
    assert f"tokens/s={summary['tokens_per_sec']:,.0f}" in tail[1]
    # train.log holds what the console showed (stdout and stderr)
    log = (run_dir / "train.log").read_text().splitlines()
    shown = [line.rstrip() for line in console.splitlines() if line.strip()]
    assert shown and [line for line in shown if line not in log] == []
    assert (run_dir / ".hydra" / "config.yaml").is_file()  # resolved config saved by Hydra
    assert not (tmp_path / "outputs").exists()  # nothing written relative to the cwd


def _two_job_multirun(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path, *overrides: str
) -> subprocess.CompletedProcess:
    """`train.py -m` of two 2-step tiny jobs (the sweep `overrides` give two) into tmp_path/sweep."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", "model=tiny", *overrides,
         "trainer.max_steps=2", "trainer.val_check_interval=2", "optim.warmup_steps=1",
         "loader.val_windows=4", "trainer.enable_checkpointing=false", "callbacks.sample_text=null",
         f"data.path={shakespeare_path}", f"data.data_dir={char_data_dir}",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=240,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_every_trial_of_a_multirun_is_quiet_on_wandb_offline(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    """W&B offline says one line per run (how to upload it), for the second trial too: no `wandb:` banner,
    history or footer (wandb 0.31 honoured the run's silent setting for the process's first run only)."""
    sweep = tmp_path / "sweep"
    proc = _two_job_multirun(tmp_path, char_data_dir, shakespeare_path, "optim.lr=1e-3,2e-3")
    console = (proc.stdout + proc.stderr).splitlines()
    assert [line for line in console if line.startswith("wandb:")] == []
    hints = [line for line in console if line.startswith("W&B run saved offline in ")]
    assert len(hints) == 2 and all(f"{sweep / str(n) / 'wandb'}" in hint for n, hint in enumerate(hints))


def test_a_multiruns_later_jobs_say_their_clock_leaves_out_the_start_up(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    """`-m seed=1,2` runs both jobs in one process: the first job's wall_seconds count from the process's
    start (imports included, as docs/records.md's rules want), the second's from its own start; summary.json
    (`wall_from`) and the printed summary say which."""
    sweep = tmp_path / "sweep"
    proc = _two_job_multirun(tmp_path, char_data_dir, shakespeare_path, "seed=1,2", "logger=none")
    first, second = (json.loads((sweep / job / "summary.json").read_text()) for job in ("0", "1"))
    assert (first["wall_from"], second["wall_from"]) == ("process start", "run start")
    walls = [line for line in proc.stdout.splitlines() if " wall=" in line]
    later = "s from this run's start (start-up not counted: an earlier run in this process paid it)"
    assert len(walls) == 2 and walls[0].endswith("s") and walls[1].endswith(later), walls
    assert later not in walls[0]


def test_run_directory_records_the_console_and_drops_runs_that_never_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mini_gpt.errors import MiniGPTError
    from mini_gpt.train.console_log import run_directory

    outputs = tmp_path / "outputs"

    def run(name: str, started: bool, error: BaseException | None, keep: bool = False) -> Path:
        run_dir = outputs / "train" / "runs" / name / "12-00-00"
        (run_dir / ".hydra").mkdir(parents=True)  # as Hydra leaves it before the run
        (run_dir / ".hydra" / "config.yaml").write_text("seed: 1\n")
        try:
            with run_directory(run_dir, keep_unstarted=keep, output_dir=outputs):
                print(f"run {name}")
                if started:
                    (run_dir / "summary.json").write_text("{}")
                if error is not None:
                    raise error
        except (MiniGPTError, RuntimeError, SystemExit):
            pass
        return run_dir

    ok = run("ok", started=True, error=None)
    assert (ok / "train.log").read_text() == "run ok\n"
    # failed before training: no run folder, no emptied date folder; outputs/ itself stays
    early = run("early", started=False, error=SystemExit(2))
    assert not early.exists() and not early.parent.exists() and outputs.is_dir()
    crashed = run("crashed", started=False, error=RuntimeError("bug"))
    assert not crashed.parent.exists()
    # failed while training: the folder stays, and its log says why (here a traceback)
    late = run("late", started=True, error=RuntimeError("out of memory at step 7"))
    assert (late / "train.log").read_text().splitlines()[-1] == "RuntimeError: out of memory at step 7"
    # a sweep trial keeps its folder even when it failed before training
    trial = run("trial", started=False, error=MiniGPTError("bad"), keep=True)
    assert (trial / "train.log").read_text().startswith("run trial\n")
    assert "run early" in capsys.readouterr().out  # the console got everything too
    # a reused paths.run_dir whose earlier run left checkpoints (and no summary: killed): they stay
    reused = outputs / "reused"
    (reused / "checkpoints").mkdir(parents=True)
    (reused / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    with pytest.raises(MiniGPTError), run_directory(reused, output_dir=outputs):
        raise MiniGPTError("bad value")
    assert (reused / "checkpoints" / "last.ckpt").read_bytes() == b"weights"
    assert sorted(p.name for p in reused.iterdir()) == ["checkpoints"]  # this run's train.log is gone


def test_cli_errors_are_short(tmp_path: Path) -> None:
    typo = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "trainer.max_stepz=3"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert typo.returncode != 0
    assert "max_stepz" in typo.stderr
    missing = tmp_path / "nope" / "last.ckpt"
    bad_ckpt = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"ckpt_path={missing}", f"hydra.run.dir={tmp_path / 'r'}"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad_ckpt.returncode == 2
    assert bad_ckpt.stderr.strip().splitlines() == [
        f"error: ckpt_path={missing} does not exist; pass an existing .ckpt to resume"
    ]
    assert not (tmp_path / "r").exists()  # a run that never started leaves no folder
    gpu_recipe = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "experiment=shakespeare_char_gpu",
            f"hydra.run.dir={tmp_path / 'g'}",
        ],
        cwd=tmp_path,
        env={**_env(tmp_path), "CUDA_VISIBLE_DEVICES": ""},  # no GPU, on any machine
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert gpu_recipe.returncode == 2
    assert gpu_recipe.stderr.strip().splitlines() == [
        "error: experiment=shakespeare_char_gpu is a GPU recipe (trainer.accelerator=gpu) and torch finds no "
        "CUDA GPU on this machine; on the CPU run experiment=shakespeare_char_cpu instead"
    ]
    assert not (tmp_path / "g").exists()


def test_train_on_shards_resumes_exactly(compose: Any, tmp_path: Path, gpt2_bpe_file: Path) -> None:
    """data=hf end to end: local parquet -> shards -> training; a resumed run continues bit for bit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    words = ["the", "little", "dog", "saw", "a", "big", "red", "ball", "and", "was", "happy", "."]
    rng = __import__("random").Random(0)
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 80))) for _ in range(1500)]
    pq.write_table(pa.table({"text": docs}), tmp_path / "stories.parquet")
    common = [
        "model=tiny",
        "logger=none",
        "data=hf",
        f"data.dataset={tmp_path / 'stories.parquet'}",
        f"data.data_dir={tmp_path / 'cache'}",
        f"data.bpe_file={gpt2_bpe_file}",
        "data.shard_tokens=4000",
        "data.val_fraction=0.05",
        "data.num_proc=1",
        "loader.batch_size=4",
        "loader.val_windows=8",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1",
        "trainer.val_check_interval=3",
        "callbacks.sample_text.every_n_steps=0",
        "callbacks.sample_text.max_new_tokens=4",
    ]
    full, full_run = _fit(compose, [*common, f"paths.run_dir={tmp_path / 'full'}", "trainer.max_steps=6"])
    half, _ = _fit(compose, [*common, f"paths.run_dir={tmp_path / 'half'}", "trainer.max_steps=3"])
    resumed, resumed_run = _fit(
        compose,
        [
            *common,
            f"paths.run_dir={tmp_path / 'resumed'}",
            "trainer.max_steps=6",
            f"ckpt_path={half['last_ckpt']}",
        ],
    )
    assert full_run.module.tokenizer.eot_id == 50256 and full["steps"] == 6
    assert resumed_run.record.train_curve == full_run.record.train_curve[3:]
    assert resumed["final_val_loss"] == full["final_val_loss"]


# ---- resuming: every mismatch or broken file is one line, checked before any state is loaded ---------
@pytest.fixture(scope="module")
def tiny_ckpt(
    compose: Any, tmp_path_factory: pytest.TempPathFactory, char_data_dir, shakespeare_path
) -> Path:
    run_dir = tmp_path_factory.mktemp("tiny_run")
    summary, _ = _fit(
        compose,
        _overrides(
            run_dir, char_data_dir, shakespeare_path, "trainer.max_steps=2", "trainer.val_check_interval=2"
        ),
        hydra_dir=run_dir,  # as train.py writes it: with its overrides
    )
    return Path(summary["last_ckpt"])


def _resume_error(compose: Any, run_dir: Path, overrides: list[str]) -> str:
    from mini_gpt.errors import MiniGPTError
    from mini_gpt.train.run import train

    with pytest.raises(MiniGPTError) as info:  # one step past the checkpoint, were it to train
        train(compose([*overrides, "trainer.max_steps=3", "trainer.val_check_interval=3"]))
    msg = str(info.value)
    assert "\n" not in msg
    assert not (run_dir / "checkpoints").exists()  # stopped before training wrote anything
    return msg


def test_resume_with_another_model_config_names_the_keys(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path, tiny_ckpt: Path
) -> None:
    run_dir = tmp_path / "run"
    overrides = _overrides(
        run_dir, char_data_dir, shakespeare_path, f"ckpt_path={tiny_ckpt}", "model.n_layer=3"
    )
    msg = _resume_error(compose, run_dir, overrides)
    assert msg.startswith(f"cannot resume {tiny_ckpt}: the model differs from the checkpoint's in n_layer ")
    assert "model.n_layer=2" in msg and "model.n_layer=3" in msg


@pytest.mark.parametrize("edit", ["fewer_chars", "other_chars"])
def test_resume_on_another_character_vocabulary(
    compose: Any, tmp_path: Path, shakespeare_path: Path, tiny_ckpt: Path, edit: str
) -> None:
    text = shakespeare_path.read_text()
    # fewer_chars: 64 characters (vocab size differs: a size mismatch); other_chars: still 65, but 'Z'
    # became '#', so every id after '#' would silently mean another character.
    text = text.replace("Z", "z") if edit == "fewer_chars" else text.replace("Z", "#")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    run_dir = tmp_path / "run"
    overrides = _overrides(run_dir, tmp_path / "data", corpus, f"ckpt_path={tiny_ckpt}")
    overrides = [o for o in overrides if not o.startswith("data.path")]
    overrides += ["data=text", f"data.path={corpus}", "data.tokenizer=char"]
    msg = _resume_error(compose, run_dir, overrides)
    assert msg.startswith(
        f"cannot resume {tiny_ckpt}: character vocabulary differs (65 characters in the checkpoint"
    )
    assert "only in the checkpoint: 'Z'" in msg
    assert (
        ("64 in this run's corpus" in msg) if edit == "fewer_chars" else ("only in this corpus: '#'" in msg)
    )


def test_resume_from_a_truncated_checkpoint(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path, tiny_ckpt: Path
) -> None:
    broken = tmp_path / "last.ckpt"
    broken.write_bytes(tiny_ckpt.read_bytes()[: tiny_ckpt.stat().st_size // 2])
    run_dir = tmp_path / "run"
    msg = _resume_error(
        compose, run_dir, _overrides(run_dir, char_data_dir, shakespeare_path, f"ckpt_path={broken}")
    )
    assert msg.startswith(f"cannot read checkpoint {broken}: corrupt, truncated or not a torch checkpoint")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("seed=abc", "seed='abc' must be an integer"),
        ("compile=maybe", "compile='maybe' must be true or false"),
        (
            "float32_matmul_precision=max",
            "float32_matmul_precision='max' must be one of highest, high, medium",
        ),
        ("optim.lr=fast", "optim.lr='fast' must be a number"),
        ("model.dropout=abc", "model.dropout='abc' must be a number"),
        ("trainer.max_steps=abc", "trainer.max_steps='abc' must be an integer"),
        (
            "callbacks.sample_text.every_n_steps=often",
            "callbacks.sample_text.every_n_steps='often' must be an",
        ),
        ("callbacks.throughput.peak_flops=lots", "callbacks.throughput.peak_flops='lots' must be a number"),
        ("callbacks.sample_text.max_new_tokns=5", "train: unknown key 'callbacks.sample_text.max_new_tokns'"),
    ],
)
def test_wrong_typed_config_values_are_one_line(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path, override: str, expected: str
) -> None:
    """Refused when the command line is composed (the schema) or when train() reads a section: one line."""
    from mini_gpt.conf import compose_command_line
    from mini_gpt.errors import MiniGPTError
    from mini_gpt.train.run import train

    overrides = _overrides(tmp_path / "run", char_data_dir, shakespeare_path, "trainer.max_steps=1", override)
    with pytest.raises(MiniGPTError) as info:
        train(compose_command_line("train", overrides))
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


def test_cli_resume_mismatch_and_bad_types_are_one_line(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path, tiny_ckpt: Path
) -> None:
    def start(name: str, *overrides: str) -> subprocess.Popen:
        run_dir = tmp_path / name
        replaced = {"paths.run_dir", *(o.split("=")[0] for o in overrides)}  # e.g. logger=none by =wandb
        args = [
            a for a in _overrides(run_dir, char_data_dir, shakespeare_path) if a.split("=")[0] not in replaced
        ]
        return subprocess.Popen(
            [sys.executable, str(REPO / "train.py"), *args, f"hydra.run.dir={run_dir}", *overrides],
            cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    # Four commands that each fail in their first seconds (mostly imports): started together.
    runs = {
        # with a W&B logger (offline: no credentials), which a refused resume must not start
        "mismatch": start(
            "m", f"ckpt_path={tiny_ckpt}", "model.n_layer=3", "trainer.max_steps=4", "logger=wandb"
        ),
        "seed": start("s", "seed=abc"),
        "steps": start("t", "trainer.max_steps=abc"),
        "done": start("d", f"ckpt_path={tiny_ckpt}", "trainer.max_steps=2"),  # the checkpoint is at step 2
    }
    errors, outputs = {}, {}
    for name, proc in runs.items():
        outputs[name], stderr = proc.communicate(timeout=240)
        assert proc.returncode == 2, (name, stderr[-2000:])
        errors[name] = stderr.strip().splitlines()
    assert "W&B run saved offline" not in outputs["mismatch"]  # refused before the logger: no run to sync
    assert not (tmp_path / "m").exists()
    assert errors["mismatch"] == [
        f"error: cannot resume {tiny_ckpt}: the model differs from the checkpoint's in n_layer (this run: "
        "model.n_layer=3); resume with the checkpoint's settings (model.n_layer=2) or drop ckpt_path to "
        "start a new run"
    ]
    assert errors["seed"] == [
        "error: seed='abc' must be an integer; fix it on the command line or in the config"
    ]
    assert errors["steps"] == [
        "error: trainer.max_steps='abc' must be an integer; fix it on the command line or in the config"
    ]
    assert errors["done"] == [
        "error: ckpt_path is at step 2 and trainer.max_steps=2: nothing is left to train; raise "
        "trainer.max_steps above 2"
    ]


SLOW_PREPARE = """
import runpy, signal, sys, time
import mini_gpt.data.text as data
# Ctrl-C raises KeyboardInterrupt even where pytest itself was started in the background (which ignores it)
signal.signal(signal.SIGINT, signal.default_int_handler)
real = data.encoder
def slow(tok, dtype):
    enc = real(tok, dtype)
    def encode(text):
        time.sleep(0.2)
        return enc(text)
    return encode
data.encoder = slow
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_ctrl_c_during_preparation_is_one_line_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    import signal
    import time

    data_dir = tmp_path / "data"
    args = [
        str(REPO / "train.py"),
        "model=tiny",
        "logger=none",
        f"data.data_dir={data_dir}",
        "data.num_threads=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_PREPARE, *args],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out_dir = data_dir / "shakespeare_char"
        deadline = time.monotonic() + 240
        while not list(out_dir.glob(".train.bin.*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert list(out_dir.glob(".train.bin.*.tmp")), "preparation never started"
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 130, stderr[-2000:]
    assert stderr.strip().splitlines()[-1:] == [
        "interrupted (Ctrl-C) before training started; nothing half-written was kept, run again to continue"
    ]
    assert "Traceback" not in stderr
    assert not out_dir.exists()  # nothing to resume from: no bins, no meta.json, no empty folder


def test_a_bad_input_found_inside_the_fit_leaves_no_run_directory(
    tmp_path: Path, gpt2_bpe_file: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": [f"document number {i} is short." for i in range(400)]}), docs)
    proc = subprocess.run(
        [
            sys.executable, str(REPO / "train.py"), "model=tiny", "logger=wandb", "data=hf",
            f"data.dataset={docs}", f"data.bpe_file={gpt2_bpe_file}", "data.val_fraction=0.01",
            f"data.data_dir={tmp_path / 'data'}", f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    # the validation split is found too short by the datamodule's setup, inside Lightning's fit
    assert proc.stderr.strip().splitlines()[-1].startswith("error: the validation split has ")
    assert not (tmp_path / "run").exists()  # no summary.json with status failed, no train.log
    assert "W&B run saved offline" not in proc.stdout  # W&B (offline) had started: no hint for a removed run


def test_sigterm_from_outside_saves_and_exits_75_with_the_resume_command(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    """`kill <pid>` (docker stop, SLURM preemption): no traceback, last.ckpt at the step it stopped after,
    summary.json `preempted`, status 75."""
    import signal
    import time

    run_dir = tmp_path / "run"
    args = _overrides(run_dir, char_data_dir, shakespeare_path, "trainer.max_steps=100000")
    args += ["trainer.val_check_interval=2", "callbacks.sample_text.at_end=false", f"hydra.run.dir={run_dir}"]
    child = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        last = run_dir / "checkpoints" / "last.ckpt"
        deadline = time.monotonic() + 120
        while not last.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert last.exists(), "training never saved its first checkpoint"
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 75, stderr[-2000:]
    assert "Traceback" not in stderr and "Error executing job" not in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    step = summary["steps"]
    assert summary["status"] == "preempted" and step >= 2
    assert torch.load(last, weights_only=True)["global_step"] == step
    lines = stderr.strip().splitlines()
    assert f"preempted (SIGTERM) at step {step}: saved {last}" in lines
    assert lines[lines.index(f"preempted (SIGTERM) at step {step}: saved {last}") + 1].endswith(
        f"ckpt_path={last}"
    )
    assert lines[-1] == (
        f"preempted by SIGTERM: stopped after step {step}, last.ckpt saved (summary.json status preempted, "
        "exit status 75)"
    )


def test_summary_judges_the_run_against_its_recipes_reference_band(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two seeds make a tiny recipe's band; a rerun of one of them lands within it (its gap is at most
    std / sqrt(2) from a mean of two), a run whose lr is too small to learn above it, and `mini-gpt plot`
    draws the band behind the run."""
    from omegaconf import OmegaConf

    from mini_gpt.eval import reference
    from mini_gpt.viz.plot import plot_curves, reference_band

    recipe = ["optim=adamw", "optim.lr=1e-2", "optim.warmup_steps=5", "trainer.max_steps=20"]
    recipe += ["trainer.val_check_interval=5", "callbacks.sample_text.at_end=false"]

    def run(name: str, *extra: str) -> tuple[Path, dict[str, Any]]:
        overrides = _overrides(tmp_path / name, char_data_dir, shakespeare_path, *recipe, *extra)
        summary, _ = _fit(compose, overrides)
        (tmp_path / name / ".hydra").mkdir()  # what Hydra keeps beside a run
        OmegaConf.save(compose(overrides), tmp_path / name / ".hydra" / "config.yaml")
        return tmp_path / name, summary

    seeds = [run(f"seed{s}", f"seed={s}")[0] for s in (1, 2)]
    refs = tmp_path / "references"
    refs.mkdir()
    (refs / "tiny.json").write_text(json.dumps(reference.build_reference(seeds, "test")))
    monkeypatch.setattr(reference, "REFERENCE_DIR", refs)
    band = json.loads((refs / "tiny.json").read_text())
    mean, half = band["mean"][-1], max(2 * band["std"][-1], reference.MIN_HALF_WIDTH)

    same_dir, same = run("again", "seed=1")
    assert same["reference"] == "tiny"
    assert same["vs_reference_gap"] == pytest.approx(same["final_val_loss"] - mean)
    assert same["vs_reference"] == "within" and abs(same["final_val_loss"] - mean) <= half
    _, slow = run("slow", "seed=1", "optim.lr=1e-5")  # the optimizer may differ: it is what is judged
    assert slow["reference"] == "tiny" and slow["vs_reference"] == "above"
    assert slow["final_val_loss"] > mean + half

    steps, lower_upper = reference_band(same_dir)[0], reference_band(same_dir)
    _, drawn = plot_curves({"val_loss": {20: same["final_val_loss"]}}, band=lower_upper)
    assert steps == [5.0, 10.0, 15.0, 20.0]
    assert drawn["band"][1][-1] == pytest.approx(mean - half) and drawn["band"][2][-1] == pytest.approx(
        mean + half
    )


def test_a_time_budget_ends_the_run_decayed_and_validated_inside_it_and_a_resume_continues_it(
    compose: Any,
    tmp_path: Path,
    char_data_dir: Path,
    shakespeare_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """trainer.budget_s=20 in a fresh process: the plan line, a final validation at the step it stopped
    after, the lr decayed to its floor, and summary.json's seconds within the budget plus 1.5 s (the
    estimate of the final validation and the end is a guess the first time; the process's own exit after
    summary.json is not counted, as in the records' rules). Resumed with trainer.budget_s=28, the run
    continues from the seconds its checkpoint used."""
    run_dir = tmp_path / "run"
    args = _overrides(
        run_dir, char_data_dir, shakespeare_path, "logger=csv", "trainer.budget_s=20",
        "trainer.val_check_interval=200", "trainer.log_every_n_steps=10", "optim.warmup_steps=10",
        "optim.lr=1e-2", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = summary["steps"]
    assert summary["status"] == "completed" and steps > 50
    assert summary["budget_s"] == 20 and summary["budget_used_s"] == pytest.approx(summary["wall_seconds"])
    assert 15 < summary["wall_seconds"] <= 20 + 1.5, summary["wall_seconds"]
    assert summary["val_curve"][-1][0] == steps  # validated once at the step it stopped after
    plan = re.search(r"^budget 20 s: ~([\d,]+) steps expected at ([\d,]+) tokens/s", proc.stdout, re.M)
    assert plan, proc.stdout[-2000:]
    with (run_dir / "csv" / "metrics.csv").open() as f:
        lrs = [(int(r["step"]), float(r["lr"])) for r in csv.DictReader(f) if r["lr"]]
    assert lrs[0] == (10, pytest.approx(1e-2))  # warmup (10 steps) done: the peak
    assert lrs[-1][0] > steps - 10 and lrs[-1][1] < 1e-3 * (1 + 0.05 * 9)  # within 5% of the floor, 1e-3

    # Resumed in this process, its clock starting now: 20 s of the budget are in the checkpoint.
    monkeypatch.setattr("mini_gpt.train.summary._runs_in_process", 1)  # this run's clock: from now
    last = run_dir / "checkpoints" / "last.ckpt"
    used = torch.load(last, weights_only=False)["mini_gpt"]["budget_used_s"]
    assert summary["val_curve"][-1][1] < used <= summary["wall_seconds"]
    again = [f"ckpt_path={last}", f"paths.run_dir={tmp_path / 'resumed'}", "trainer.budget_s=28"]
    resumed, _ = _fit(compose, again, resume=True)
    out = capsys.readouterr().out
    assert f"{used:.1f} s used by the runs this one resumes" in out
    assert resumed["status"] == "completed" and resumed["start_step"] == steps < resumed["steps"]
    assert used + resumed["wall_seconds"] == pytest.approx(resumed["budget_used_s"])
    assert resumed["budget_used_s"] <= 28 + 1.5
