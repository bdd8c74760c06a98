"""Callbacks: the loss guard keeps the last good checkpoint, Ctrl-C and SIGUSR1 save one, throughput/MFU,
samples, the progress bar, and the run summary train() writes from the module and callback_metrics."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from helpers import quiet_trainer

from mini_gpt.conf.train import OptimConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPTConfig
from mini_gpt.train.callbacks import (
    LossGuard,
    ProgressBar,
    Recorder,
    SampleText,
    StopOnSignal,
    Throughput,
    measure_cpu_matmul_flops,
    peak_flops,
)
from mini_gpt.train.stops import DivergedError, NonFiniteLossError, Preempted
from mini_gpt.train.summary import run_status, write_summary

BLOCK = 32


@pytest.fixture
def dm(char_data_dir: Path, shakespeare_path: Path) -> Any:
    from mini_gpt.data import DataConfig
    from mini_gpt.data.datamodule import GPTDataModule

    cfg = DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(char_data_dir))
    return GPTDataModule(cfg, block_size=BLOCK, batch_size=4, seed=3, val_windows=4)


def _module(dm: Any, nan_from_step: int | None = None) -> Any:
    from mini_gpt.train.module import GPTLitModule

    class Module(GPTLitModule):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            if nan_from_step is not None and self.global_step + 1 >= nan_from_step:
                return loss * float("nan")  # injected: from this step (counted from 1) on, loss is NaN
            return loss

    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=dm.vocab_size, block_size=BLOCK)
    return Module(config, OptimConfig(lr=1e-3), tokenizer=dm.tokenizer, max_steps=50)


def _trainer(tmp_path: Path, callbacks: list[Any], **kwargs: Any) -> Any:
    from mini_gpt.train.callbacks import EvalCheckpoint

    ckpt = EvalCheckpoint(dirpath=tmp_path / "ckpt", filename="best", monitor="val/loss", save_last=True)
    callbacks = [Recorder(), *callbacks, ckpt]  # the recorder first, as train() lists it
    return quiet_trainer(
        tmp_path, **{"max_steps": 8, "val_check_interval": 2, "callbacks": callbacks, **kwargs}
    )


def _recorder(trainer: Any) -> Recorder:
    return next(cb for cb in trainer.callbacks if isinstance(cb, Recorder))


def _fit_with_summary(trainer: Any, module: Any, dm: Any, path: Path) -> dict[str, Any]:
    """Fit as train() does: summary.json written whatever ends the fit; returns what it holds."""
    error = None
    try:
        trainer.fit(module, datamodule=dm)
    except BaseException as err:
        error = err
        raise
    finally:
        status = run_status(error, trainer.global_step, 0)
        summary = write_summary(path, status, START, trainer, module, _recorder(trainer).record)
    return summary


START = __import__("psutil").Process().create_time()  # the run's clock: process start, as train()'s


def _ckpt_step(path: Path) -> int:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
    return ckpt["global_step"]


def test_nan_guard_stops_at_log_interval_and_keeps_last_good(tmp_path: Path, dm: Any) -> None:
    trainer = _trainer(tmp_path, [LossGuard()])
    with pytest.raises(NonFiniteLossError, match="NaN/inf by step 5") as err:
        trainer.fit(_module(dm, nan_from_step=5), datamodule=dm)
    assert str(tmp_path / "ckpt" / "last.ckpt") in str(err.value)
    assert "\n" not in str(err.value)
    assert _ckpt_step(tmp_path / "ckpt" / "last.ckpt") == 4


def test_summary_written_when_the_run_stops_and_when_it_ends(tmp_path: Path, dm: Any) -> None:
    import json

    path = tmp_path / "summary.json"
    trainer = _trainer(tmp_path, [LossGuard()])
    with pytest.raises(NonFiniteLossError):
        _fit_with_summary(trainer, _module(dm, nan_from_step=5), dm, path)
    stopped = json.loads(path.read_text())
    assert (stopped["status"], stopped["steps"]) == ("nonfinite", 5)
    assert [row[0] for row in stopped["val_curve"]] == [2, 4]  # evaluations before the NaN
    assert stopped["last_ckpt"] == str(tmp_path / "ckpt" / "last.ckpt")
    assert _ckpt_step(Path(stopped["last_ckpt"])) == 4

    module = _module(dm)
    module.tokens_per_step = 4 * BLOCK
    throughput = Throughput(peak_flops=1e10)
    trainer = _trainer(tmp_path / "ok", [throughput], max_steps=4)
    done = _fit_with_summary(trainer, module, dm, path)
    assert done == json.loads(path.read_text())
    assert (done["status"], done["steps"], done["tokens"]) == ("completed", 4, 4 * 4 * BLOCK)
    # the run's whole average (Throughput's totals), read from callback_metrics
    assert done["tokens_per_sec"] == pytest.approx(throughput.total_tokens / throughput.total_seconds)
    assert throughput.total_tokens == 4 * 4 * BLOCK and done["tokens_per_sec"] > 0
    vals = [row[2] for row in done["val_curve"]]
    assert (done["best_val_loss"], done["final_val_loss"]) == (min(vals), vals[-1])
    assert 0 < done["val_curve"][0][1] < done["wall_seconds"]  # seconds since the process started
    assert list(tmp_path.glob(".summary.json*")) == []  # written atomically: no temporary left


def test_nan_guard_runs_before_checkpointing_at_validation(tmp_path: Path, dm: Any) -> None:
    # Logging (and so the interval check) only every 50 steps: validation at step 4 must catch it.
    trainer = _trainer(tmp_path, [LossGuard()], log_every_n_steps=50)
    with pytest.raises(NonFiniteLossError, match="by step 4"):
        trainer.fit(_module(dm, nan_from_step=3), datamodule=dm)
    assert _ckpt_step(tmp_path / "ckpt" / "last.ckpt") == 2  # the NaN state of step 4 was not saved


def test_last_checkpoint_refreshed_at_every_evaluation(tmp_path: Path, dm: Any) -> None:
    """Even when val/loss gets worse (lr far too high), last.ckpt follows the latest evaluation."""
    from mini_gpt.train.module import GPTLitModule

    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=dm.vocab_size, block_size=BLOCK)
    module = GPTLitModule(config, OptimConfig(lr=5.0, min_lr_ratio=1.0, warmup_steps=0, weight_decay=0.0))
    trainer = _trainer(tmp_path, [], max_steps=6, gradient_clip_val=None)
    trainer.fit(module, datamodule=dm)
    losses = [v for _, _, v in _recorder(trainer).record.val_curve]
    assert min(losses) < losses[-1]  # val got worse at the end: no new best
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["global_step"] == 6


def test_without_guard_nan_would_be_checkpointed(tmp_path: Path, dm: Any) -> None:
    """Control for the two tests above: the injected NaN really reaches the checkpoint otherwise."""
    trainer = _trainer(tmp_path, [], max_steps=4, log_every_n_steps=50)
    trainer.fit(_module(dm, nan_from_step=3), datamodule=dm)
    ckpt = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 4
    assert not all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())


def test_a_finite_explosion_stops_as_diverged_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, dm: Any
) -> None:
    """Muon warming up to lr=1e2 explodes to a huge but finite loss (the NaN check sees nothing): the run
    stops with one line, summary.json says diverged, and last.ckpt is the last good evaluation's."""
    module = _module(dm)
    # warming up towards lr=100: healthy for a few steps, then a loss in the hundreds, never NaN
    module.optim_config = OptimConfig(name="muon", lr=1e2, warmup_steps=1000)
    trainer = _trainer(tmp_path, [LossGuard(check_every_n_steps=1)], max_steps=40)
    with pytest.raises(DivergedError) as info:
        _fit_with_summary(trainer, module, dm, tmp_path / "summary.json")
    msg = str(info.value)
    limit = 3 * math.log(65)
    assert "\n" not in msg and msg.startswith("training diverged by step ")
    assert f"> 3 x ln(vocab) = {limit:.2f}" in msg and "lower optim.lr" in msg
    assert f"last good checkpoint: {tmp_path / 'ckpt' / 'last.ckpt'}" in msg
    curve = _recorder(trainer).record.train_curve
    losses = [loss for _, loss in curve]
    assert all(math.isfinite(x) for x in losses) and max(losses) > limit  # the NaN check saw nothing
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"
    saved, logged = _ckpt_step(tmp_path / "ckpt" / "last.ckpt"), dict(curve)
    assert 2 <= saved < trainer.global_step and logged[saved] <= limit  # the last good state, not this one


def test_divergence_rule() -> None:
    limit = 3 * math.log(65)
    module = SimpleNamespace(tokenizer=SimpleNamespace(vocab_size=65))
    trainer = SimpleNamespace(
        global_step=0,
        max_steps=100,
        gradient_clip_val=1.0,
        checkpoint_callback=None,
        sanity_checking=False,
        log_every_n_steps=1,
        callback_metrics={},
    )

    def guard_after(losses: list[float]) -> LossGuard:
        """A guard that saw these train/loss values logged at steps 1, 2, ... (as Lightning hands them)."""
        guard = LossGuard(factor=3.0, patience=3)
        for step, loss in enumerate(losses, 1):
            trainer.global_step, trainer.callback_metrics = (
                step,
                {"train/loss": torch.tensor(loss, dtype=torch.float64)},
            )
            guard.on_optimizer_step(trainer, module)  # type: ignore[arg-type]
        return guard

    guard_after([4.2, 50.0, 3.9])  # one spike
    guard_after([99.0, 99.0])  # too few
    guard_after([1e9, limit, 1e9])  # one at the limit: healthy
    guard_after([4.2, 50.0, 3.9]).on_validation_end(trainer, module)  # type: ignore[arg-type]
    with pytest.raises(DivergedError, match=r"train loss 12.53, 6e\+07, 1000 at 3 log steps in a row"):
        guard_after([4.0, limit + 0.01, 6e7, 1e3])
    guard = guard_after([4.0, 50.0])  # one spike, but a checkpoint is about to be written
    with pytest.raises(DivergedError, match="train loss 50 at step 2, before a checkpoint"):
        guard.on_validation_end(trainer, module)  # type: ignore[arg-type]
    trainer.log_every_n_steps = 10  # steps that do not log are not read
    guard_after([99.0, 99.0, 99.0])
    with pytest.raises(MiniGPTError, match="factor"):
        LossGuard(factor=1.0)


def test_sigint_saves_last_checkpoint_between_steps(
    tmp_path: Path, dm: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import lightning as L

    class CtrlC(L.Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 2:  # the signal arrives during step 3
                os.kill(os.getpid(), signal.SIGINT)

    trainer = _trainer(tmp_path, [CtrlC(), StopOnSignal()], val_check_interval=100)
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning's graceful shutdown after KeyboardInterrupt
            trainer.fit(_module(dm), datamodule=dm)
    finally:
        signal.signal(signal.SIGINT, previous)  # Lightning leaves SIGINT ignored after an interrupt
    saved = tmp_path / "ckpt" / "last.ckpt"
    assert _ckpt_step(saved) == 3  # step 3 finished, then saved
    # the exact command that resumes: this script with the checkpoint (the rest comes from the checkpoint)
    err = capsys.readouterr().err.splitlines()
    assert f"interrupted at step 3: saved {saved}" in err
    python = (
        "python"
        if shutil.which("python") and Path(shutil.which("python")).resolve() == Path(sys.executable).resolve()
        else sys.executable
    )
    expected = shlex.join([python, sys.argv[0], f"ckpt_path={saved}"])
    assert err[err.index(f"interrupted at step 3: saved {saved}") + 1] == f"resume with: {expected}"


def test_sigusr1_under_slurm_saves_at_a_step_and_requeues(
    tmp_path: Path, dm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SLURM's warning signal: the step finishes, last.ckpt and Lightning's hpc checkpoint (what the
    requeued job resumes from) hold it, and `scontrol requeue <job>` is called."""
    from helpers import signal_at_step
    from lightning.fabric.plugins.environments import SLURMEnvironment

    calls = tmp_path / "scontrol.args"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {calls}\n')
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for key, value in {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    trainer = _trainer(
        tmp_path,
        [signal_at_step(3, signal.SIGUSR1), StopOnSignal()],
        plugins=[SLURMEnvironment(auto_requeue=True)],
        default_root_dir=tmp_path,
        val_check_interval=100,
    )
    with pytest.raises(
        Preempted, match=r"stopped after step 3, last.ckpt saved .*; SLURM job 4242 requeued$"
    ):
        trainer.fit(_module(dm), datamodule=dm)
    assert _ckpt_step(tmp_path / "ckpt" / "last.ckpt") == 3
    assert _ckpt_step(tmp_path / "hpc_ckpt_1.ckpt") == 3
    assert calls.read_text().split() == ["requeue", "4242"]
    assert signal.getsignal(signal.SIGUSR1) is not None  # handlers given back (Lightning's teardown)


def test_throughput_logs_tokens_per_sec_and_mfu(tmp_path: Path, dm: Any) -> None:
    peak = 1e10
    throughput = Throughput(peak_flops=peak)
    module = _module(dm)
    trainer = _trainer(tmp_path, [throughput], max_steps=6, log_every_n_steps=3, val_check_interval=100)
    trainer.fit(module, datamodule=dm)
    rows = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    logged = [dict(zip(header, r.split(","))) for r in rows[1:]]
    logged = [r for r in logged if r.get("tokens_per_sec")]
    assert [int(r["step"]) for r in logged] == [3, 6]
    flops_per_token = module.model.flops_per_token(BLOCK)
    for r in logged:
        tps, mfu = float(r["tokens_per_sec"]), float(r["mfu"])
        assert tps > 0
        assert mfu == pytest.approx(flops_per_token * tps / peak, rel=1e-6)
    assert throughput.total_tokens == 6 * 4 * BLOCK and throughput.total_seconds > 0
    # after training, run/* hold the run's averages (what the progress bar and summary.json show)
    run = throughput.total_tokens / throughput.total_seconds
    assert float(trainer.callback_metrics["run/tokens_per_sec"]) == pytest.approx(run)
    assert float(trainer.callback_metrics["run/mfu"]) == pytest.approx(flops_per_token * run / peak, rel=1e-5)


def test_time_spent_on_side_work_is_left_out_of_tokens_per_sec(tmp_path: Path, dm: Any) -> None:
    """A callback's side work (a sample, a drawing) inside its `self.side_work()` is not training time:
    Throughput learns of it from the logged `side_seconds/<callback>` alone, listed before or after it."""
    import time

    from mini_gpt.train.callbacks.base import StepCallback

    class SlowSideWork(StepCallback):
        def on_optimizer_step(self, trainer: Any, pl_module: Any) -> None:
            with self.side_work(pl_module):
                time.sleep(0.2)

    for order in ("before", "after"):
        throughput, slow = Throughput(peak_flops=1e10), SlowSideWork()
        module = _module(dm)
        listed = [slow, throughput] if order == "before" else [throughput, slow]
        trainer = _trainer(tmp_path / order, listed, max_steps=4, val_check_interval=100)
        t0 = time.perf_counter()
        trainer.fit(module, datamodule=dm)
        wall = time.perf_counter() - t0
        assert slow.side_seconds == pytest.approx(0.8, abs=0.1)
        assert float(trainer.callback_metrics["side_seconds/SlowSideWork"]) == pytest.approx(
            slow.side_seconds
        )
        assert throughput.total_seconds < wall - 0.75, order  # the four side-work sleeps are not in it


def test_progress_bar_ends_on_the_run_averages_whatever_the_callback_order(tmp_path: Path, dm: Any) -> None:
    bar, throughput = ProgressBar(refresh_rate=1), Throughput(peak_flops=1e10)
    trainer = _trainer(
        tmp_path, [bar, throughput], max_steps=4, log_every_n_steps=3, enable_progress_bar=True
    )  # the bar listed before the callback whose numbers it shows
    trainer.fit(_module(dm), datamodule=dm)
    assert throughput.total_tokens == 4 * 4 * BLOCK  # the tail after the last log interval counted
    assert f" {throughput.total_tokens / throughput.total_seconds:,.0f} tok/s" in f" {bar.shown_stats}"
    assert bar.shown_stats.startswith("loss ") and bar.shown_stats.endswith("% mfu")


def test_cpu_peak_is_measured_once_per_machine_and_cached(monkeypatch, tmp_path) -> None:
    """MFU's CPU peak: the first run measures it and keeps it in the cache dir; later runs (a new process:
    the probe's own per-process cache cleared) read it back instead of measuring again. A probe taken on
    a busy machine is not kept."""
    import json

    from mini_gpt import machine
    from mini_gpt.train.callbacks import throughput

    monkeypatch.setenv("MINI_GPT_CACHE_DIR", str(tmp_path))
    probes = iter([3.0e11, 5.0e11, 7.0e11])
    monkeypatch.setattr(throughput, "measure_cpu_matmul_flops", lambda dtype: next(probes))
    monkeypatch.setattr(machine, "_cpu_times", lambda: (0.0, 0.0))  # an idle machine
    assert peak_flops(torch.device("cpu")) == 3.0e11
    assert peak_flops(torch.device("cpu")) == 3.0e11  # read back, not measured again
    ((key, value),) = json.loads((tmp_path / "cpu_peak_flops.json").read_text()).items()
    assert value == 3.0e11 and str(torch.get_num_threads()) in key and "float32" in key
    assert peak_flops(torch.device("cpu"), "bf16-mixed") == 5.0e11  # another dtype: its own entry
    (tmp_path / "cpu_peak_flops.json").unlink()
    busy = iter([0.0, 1e9])  # other processes: far more busy time than this one's
    monkeypatch.setattr(machine, "_cpu_times", lambda: (next(busy), 0.0))
    assert peak_flops(torch.device("cpu")) == 7.0e11
    assert not (tmp_path / "cpu_peak_flops.json").exists()


def test_peak_flops_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    assert peak_flops(torch.device("cpu"), "32-true", override=123.0) == 123.0
    cpu = measure_cpu_matmul_flops(torch.float32)
    assert 1e8 < cpu < 1e14  # a plausible CPU, measured (cached per process)
    assert measure_cpu_matmul_flops(torch.float32) == cpu
    # GPUs: Lightning's table of published dense peaks (H100 SXM: bf16 989 TFLOP/s, plain fp32 67)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert peak_flops(torch.device("cuda"), "bf16-mixed") == pytest.approx(989e12, rel=0.01)
    import lightning.fabric.accelerators.cuda as lightning_cuda

    monkeypatch.setattr(lightning_cuda, "_is_ampere_or_later", lambda: False)  # no TF32 without CUDA here
    assert peak_flops(torch.device("cuda"), "32-true") == pytest.approx(67e12, rel=0.01)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-40GB")
    assert peak_flops(torch.device("cuda"), "16-mixed") == 312e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Mystery GPU")
    with pytest.warns(UserWarning, match="FLOPs not found"):
        assert peak_flops(torch.device("cuda"), "bf16-mixed") == 0.0


def test_sample_text_is_seeded_and_leaves_training_rng_alone(dm: Any) -> None:
    module = _module(dm)
    cb = SampleText(prompt="ROMEO:", max_new_tokens=25, seed=5)
    rng = torch.get_rng_state()
    a, b = cb.sample(module), cb.sample(module)
    assert torch.equal(rng, torch.get_rng_state())
    assert a == b and a.startswith("ROMEO:") and len(a) == len("ROMEO:") + 25
    assert set(a) <= set(dm.tokenizer.decode(list(range(dm.vocab_size))))


def test_samples_printed_during_training_and_final_validation(
    tmp_path: Path, dm: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _module(dm)
    cb = SampleText(every_n_steps=3, max_new_tokens=10)
    trainer = _trainer(tmp_path, [cb], max_steps=5, val_check_interval=3)
    trainer.fit(module, datamodule=dm)
    assert [row[0] for row in cb.rows] == [3, 5]  # every 3 steps, plus at the end
    assert "--- sample at step 3 ---" in capsys.readouterr().out
    # validation at step 3 (interval) and at step 5 (end of training, not a multiple of 3)
    vals = _recorder(trainer).record.val_curve
    assert [s for s, _, _ in vals] == [3, 5]
    assert math.isfinite(vals[-1][2])


def test_progress_bar_shows_the_logged_losses_and_throughput() -> None:
    losses = {"train/loss": torch.tensor(2.34567), "val/loss": torch.tensor(2.5)}  # the module's, logged
    metrics = {**losses, "tokens_per_sec": torch.tensor(12345.6), "mfu": torch.tensor(0.4321)}  # Throughput's
    bar = ProgressBar()
    trainer = SimpleNamespace(global_step=10, callback_metrics=metrics, log_every_n_steps=10, max_steps=100)
    assert bar.get_metrics(trainer, None) == {}  # type: ignore[arg-type]  # Lightning's column stays empty
    assert bar.shown_stats == "loss 2.346 val 2.500 12,346 tok/s 43.2% mfu"
    metrics.clear()
    trainer.global_step = 11  # not a log step: nothing is read (no device sync), the numbers stay
    bar.get_metrics(trainer, None)  # type: ignore[arg-type]
    assert bar.shown_stats == "loss 2.346 val 2.500 12,346 tok/s 43.2% mfu"
    metrics.update(losses)
    trainer.global_step = 20
    bar.get_metrics(trainer, None)  # type: ignore[arg-type]
    assert bar.shown_stats == "loss 2.346 val 2.500"  # nothing logged tokens/s: no tok/s


def test_validation_bar_says_how_many_tokens_the_estimate_uses() -> None:
    bar = ProgressBar()
    bar._trainer = SimpleNamespace(datamodule=SimpleNamespace(val_estimate_tokens=131_072))  # type: ignore[assignment]
    assert bar.validation_description == "val 131,072 tok"
    bar._trainer = SimpleNamespace(datamodule=None)  # type: ignore[assignment]  # a model fitted without one
    assert bar.validation_description == "val"


@pytest.mark.parametrize("steps", [500, 25_000])
def test_progress_bar_is_one_line_in_80_columns(steps: int) -> None:
    import io

    from rich.console import Console
    from rich.progress import Progress

    metrics = {"train/loss": 1.82345, "val/loss": 1.819, "tokens_per_sec": 126580.4, "mfu": 0.316}
    bar = ProgressBar()
    trainer = SimpleNamespace(global_step=5, callback_metrics=metrics, log_every_n_steps=5, max_steps=10)
    bar.get_metrics(trainer, None)  # type: ignore[arg-type]
    out = io.StringIO()
    console = Console(file=out, width=80)
    progress = Progress(*bar.configure_columns(None), console=console)  # type: ignore[arg-type]
    sanity = progress.add_task("Sanity Checking", total=2)
    bar.train_progress_bar_id = progress.add_task("Epoch 0/-2", total=steps)  # as Lightning names it
    progress.update(bar.train_progress_bar_id, completed=steps // 2)
    console.print(progress.make_tasks_table([progress.tasks[bar.train_progress_bar_id]]))
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 80, lines
    assert lines[0].startswith("train ")  # the training task is called "train", whatever its description
    assert f"{steps // 2}/{steps}" in lines[0]
    assert lines[0].endswith("loss 1.823 val 1.819 126,580 tok/s 31.6% mfu")
    console.print(progress.make_tasks_table([progress.tasks[sanity]]))
    other = out.getvalue().splitlines()[1]
    assert other.startswith("Sanity Checking ") and "tok/s" not in other  # other tasks keep theirs


@pytest.mark.parametrize(
    ("precision", "clip", "advice"),
    [
        ("32-true", 1.0, "lower optim.lr"),
        ("32-true", None, "lower optim.lr or set trainer.gradient_clip_val=1.0"),
        (
            "bf16-mixed",
            1.0,
            "lower optim.lr or use trainer.precision=32-true (this run used bf16-mixed)",
        ),
        (
            "16-mixed",
            0.0,
            "lower optim.lr, set trainer.gradient_clip_val=1.0 or use trainer.precision=32-true "
            "(this run used 16-mixed)",
        ),
    ],
)
def test_nan_message_suggests_only_what_the_run_has_not_tried(precision: str, clip: Any, advice: str) -> None:
    trainer = SimpleNamespace(
        global_step=7, precision=precision, gradient_clip_val=clip, checkpoint_callback=None, callbacks=[]
    )
    guard = LossGuard()
    batch = SimpleNamespace(
        global_step=7, log_every_n_steps=50, max_steps=100, callback_metrics={}
    )  # no check here
    guard.on_train_batch_end(batch, None, {"loss": torch.tensor(float("nan"))}, None, 0)  # type: ignore[arg-type]
    with pytest.raises(NonFiniteLossError) as err:
        guard.check_finite(trainer, None)  # type: ignore[arg-type]
    assert str(err.value).endswith(f"(no checkpoint was saved yet); {advice}")


def test_progress_bar_counts_the_whole_run_after_a_resume(tmp_path: Path, dm: Any) -> None:
    import lightning as L

    seen: dict[str, Any] = {}

    class Spy(L.Callback):  # listed before the bar: reads it before the bar closes at train end
        def on_train_end(self, trainer: Any, *args: Any) -> None:
            task = next(t for t in bar.progress.tasks if t.id == bar.train_progress_bar_id)
            seen["bar"] = (task.completed, task.total)

    first = _trainer(tmp_path / "a", [], max_steps=5, val_check_interval=5)
    first.fit(_module(dm), datamodule=dm)
    bar = ProgressBar(refresh_rate=1)
    resumed = _trainer(
        tmp_path / "b", [Spy(), bar], max_steps=8, val_check_interval=5, enable_progress_bar=True
    )
    resumed.fit(_module(dm), datamodule=dm, ckpt_path=tmp_path / "a" / "ckpt" / "last.ckpt")
    assert resumed.global_step == 8
    assert seen["bar"] == (8, 8)  # 8/8 at the end, not 8/3


# ---- checkpoint writing -----------------------------------------------------------------------------
KILLED_WRITER = """
import sys, torch
from mini_gpt.train.callbacks import AtomicCheckpointIO
io, path = AtomicCheckpointIO(), sys.argv[1]
io.save_checkpoint({"step": 1, "w": torch.ones(8)}, path)
print("saved step 1", flush=True)
io.save_checkpoint({"step": 2, "w": torch.ones(40_000_000)}, path)  # 160 MB: killed while writing it
print("saved step 2", flush=True)
"""


def test_checkpoint_survives_a_hard_kill_while_the_next_is_written(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    path = tmp_path / "last.ckpt"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(path)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "saved step 1\n"
        size_1 = path.stat().st_size
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the second checkpoint is partly on disk
            partial = [p.stat().st_size for p in [*tmp_path.glob(".last.ckpt.*.tmp"), path] if p.exists()]
            if max(partial, default=0) > max(size_1, 1 << 20):
                break
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.kill()
    ckpt = torch.load(path, map_location="cpu", weights_only=True)  # still the complete previous one
    assert ckpt["step"] == 1 and ckpt["w"].tolist() == [1.0] * 8
    # The next save in the folder removes what the killed one left, and only that.
    left = tmp_path / f".last.ckpt.{child.pid}.tmp"
    live = tmp_path / f".best.ckpt.{os.getppid()}.tmp"  # a process that still runs may still be saving
    other = tmp_path / ".notes.tmp"
    live.write_bytes(b"x")
    other.write_bytes(b"x")
    assert left.exists()
    from mini_gpt.train.callbacks import AtomicCheckpointIO

    AtomicCheckpointIO().save_checkpoint({"step": 3}, tmp_path / "epoch.ckpt")
    assert not left.exists() and live.exists() and other.exists()


class _FullAfter:
    """A file whose disk fills up after `room` bytes: the next write raises ENOSPC (as on a tmpfs)."""

    def __init__(self, fh: Any, room: int) -> None:
        self.fh, self.room = fh, room

    def write(self, data: bytes) -> int:
        import errno

        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


@pytest.mark.parametrize("full_at", ["first byte", "inside a tensor", "near the end", "fsync"])
def test_full_disk_while_writing_a_checkpoint_is_one_line(tmp_path: Path, monkeypatch, full_at: str) -> None:
    """ENOSPC anywhere in the write (torch's zip writer turns it into RuntimeError 'unexpected pos'):
    one line naming the file and the bytes it needs, the previous checkpoint intact, no temporary."""
    import errno

    import mini_gpt.train.callbacks.checkpointing as checkpointing

    io = checkpointing.AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    state = {"step": 2, "w": torch.ones(100_000)}  # 400,000 bytes of tensor data
    real_save = torch.save
    if full_at == "fsync":

        def full(_fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(checkpointing.os, "fsync", full)
    else:
        room = {"first byte": 0, "inside a tensor": 200_000, "near the end": 400_500}[full_at]
        monkeypatch.setattr(torch, "save", lambda obj, fh: real_save(obj, _FullAfter(fh, room)))
    with pytest.raises(MiniGPTError) as info:
        io.save_checkpoint(state, path)
    msg = str(info.value)
    assert msg.startswith(f"cannot write checkpoint {path} (No space left on device; needs ~400,000 bytes, ")
    assert " free there); the previous one is unchanged" in msg and "paths.run_dir" in msg and "\n" not in msg
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temporary file left


def test_zip_writer_failures_without_an_os_error_and_other_runtime_errors(
    tmp_path: Path, monkeypatch
) -> None:
    """A write failure torch reports alone (no OSError behind it) still names the bytes; a RuntimeError
    that is not about writing stays what it is."""
    import mini_gpt.train.callbacks.checkpointing as checkpointing

    io, path = checkpointing.AtomicCheckpointIO(), tmp_path / "last.ckpt"
    for raised in ("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598", "cannot pickle"):

        def broken(obj: Any, fh: Any, raised: str = raised) -> None:
            raise RuntimeError(raised)

        monkeypatch.setattr(torch, "save", broken)
        expected = MiniGPTError if "unexpected pos" in raised else RuntimeError
        with pytest.raises(expected) as info:
            io.save_checkpoint({"w": torch.ones(10)}, path)
        assert list(tmp_path.iterdir()) == []
        if expected is MiniGPTError:
            assert str(info.value).startswith(
                f"cannot write checkpoint {path} (the write failed: is the disk full?; needs ~40 bytes, "
            )
    assert "cannot pickle" in str(info.value)


def test_unreadable_checkpoint_is_one_line(tmp_path: Path) -> None:
    from mini_gpt.train.callbacks import AtomicCheckpointIO

    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1, "w": torch.ones(1000)}, path)
    path.write_bytes(path.read_bytes()[:-100])  # truncated
    with pytest.raises(MiniGPTError) as info:
        AtomicCheckpointIO().load_checkpoint(path)
    assert str(info.value).startswith(f"cannot read checkpoint {path}: corrupt, truncated")
    assert "\n" not in str(info.value)


def test_the_default_run_has_seven_callbacks(compose: Any, tmp_path: Path) -> None:
    """conf/callbacks/default.yaml switches on seven callbacks (those off by default, every_n_steps=0, are
    left out of the Trainer), each with one job."""
    from hydra.utils import instantiate

    cfg = compose([f"paths.run_dir={tmp_path}"])
    made = [instantiate(node) for node in cfg.callbacks.values() if node is not None]
    on = sorted(type(c).__name__ for c in made if getattr(c, "enabled", True))
    assert on == [
        "EvalCheckpoint", "Health", "LossGuard", "ProgressBar", "SampleText", "StopOnSignal", "Throughput"
    ]  # fmt: skip
    assert sorted(type(c).__name__ for c in made if not getattr(c, "enabled", True)) == [
        "AttentionMaps",
        "EvaluateCallback",
        "HeadRoles",
    ]
    off = compose([f"paths.run_dir={tmp_path}", "callbacks.health.every_n_steps=0"]).callbacks.health
    assert not instantiate(off).enabled


class ThreeLineStep:
    """The training step a learner writes first: the loss, `self.log`, return it (mixed into the module)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _logits, loss = self.model(*batch)  # type: ignore[attr-defined]
        self.log("train/loss", loss)  # type: ignore[attr-defined]
        return loss


def test_a_three_line_training_step_keeps_every_callback_working(tmp_path: Path, dm: Any) -> None:
    """Guard, health, progress bar, throughput and summary.json learn what they need from Lightning's
    channels alone (the step's returned loss, the logged train/loss and val/loss), not from the module."""
    from mini_gpt.train.callbacks import Health
    from mini_gpt.train.module import GPTLitModule

    class Module(ThreeLineStep, GPTLitModule):
        pass

    def module(lr: float) -> Any:
        torch.manual_seed(0)
        config = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=dm.vocab_size, block_size=BLOCK)
        optim = OptimConfig(name="adamw", lr=lr, warmup_steps=0, min_lr_ratio=1.0)
        return Module(config, optim, tokenizer=dm.tokenizer, max_steps=50, tokens_per_step=4 * BLOCK)

    def callbacks() -> list[Any]:
        return [LossGuard(), Health(spike_window=4), ProgressBar(refresh_rate=1), Throughput(peak_flops=1e10)]

    healthy = _trainer(
        tmp_path / "ok", callbacks(), max_steps=6, log_every_n_steps=1, enable_progress_bar=True
    )
    done = _fit_with_summary(healthy, module(1e-3), dm, tmp_path / "ok.json")
    assert (done["status"], done["steps"]) == ("completed", 6)
    assert [row[0] for row in done["val_curve"]] == [2, 4, 6] and done["final_val_loss"] < math.log(65)
    assert done["tokens_per_sec"] > 0 and done["spikes"] == 0  # health judged every logged loss
    bar = next(cb for cb in healthy.callbacks if isinstance(cb, ProgressBar))
    assert bar.shown_stats.startswith("loss ") and " val " in bar.shown_stats and "tok/s" in bar.shown_stats
    assert len(_recorder(healthy).record.train_curve) == 6

    # AdamW at lr 1e6: the guard still stops the run (NaN/inf or diverged), before anything of it is saved
    broken = _trainer(
        tmp_path / "bad", callbacks(), max_steps=40, log_every_n_steps=1, enable_progress_bar=True
    )
    with pytest.raises((NonFiniteLossError, DivergedError)):
        _fit_with_summary(broken, module(1e6), dm, tmp_path / "bad.json")
    stopped = json.loads((tmp_path / "bad.json").read_text())
    assert stopped["status"] in ("nonfinite", "diverged") and stopped["steps"] < 40
