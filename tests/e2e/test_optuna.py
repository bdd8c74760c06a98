"""`mini-gpt sweep`: an Optuna study on a tiny model, run as a user runs it (subprocesses): pruning, the
trials' folders and table, resuming, two workers on one study, a killed sweep restarted, bad inputs."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from helpers import REPO
from omegaconf import OmegaConf

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(NETRC=str(home / "no-netrc"), PYTHONPATH=str(REPO), WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    return env


def _command(sweep_dir: Path, data_dir: Path, shakespeare: Path, n_trials: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "mini_gpt.cli", "sweep", "hparams_search=lr_search", "model=tiny",
        f"data.path={shakespeare}", f"data.data_dir={data_dir}", "loader.batch_size=8",
        "loader.val_windows=8", "trainer.max_steps=4", "trainer.val_check_interval=2",
        "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
        "callbacks.sample_text=null",
        "logger=none", f"hparams_search.dir={sweep_dir}", f"hparams_search.n_trials={n_trials}", *extra,
    ]  # fmt: skip


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, cwd=cwd, env=_env(cwd), capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL
    )


def _load(sweep_dir: Path) -> optuna.Study:
    return optuna.load_study(study_name="lr_search", storage=f"sqlite:///{sweep_dir / 'study.db'}")


@pytest.fixture(scope="module")
def pruned_sweep(tmp_path_factory: pytest.TempPathFactory, char_data_dir: Path, shakespeare_path: Path):
    """4 trials, the median pruner from the second trial on; sampler seed 5 makes trials 2 and 3 worse than
    the median at their first report (step 2)."""
    home = tmp_path_factory.mktemp("optuna")
    sweep_dir = home / "sweep"
    command = _command(sweep_dir, char_data_dir, shakespeare_path, 4, "hparams_search.sampler.seed=5",
                       "hparams_search.pruner.median.n_startup_trials=1")  # fmt: skip
    proc = _run(command, home)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return home, sweep_dir, command, proc


def test_sweep_prunes_and_every_trial_folder_says_how_it_ended(pruned_sweep) -> None:
    _, sweep_dir, _, proc = pruned_sweep
    trials = _load(sweep_dir).trials
    assert len(trials) == 4
    states = [t.state for t in trials]
    assert optuna.trial.TrialState.PRUNED in states and optuna.trial.TrialState.COMPLETE in states, states
    for t in trials:
        folder = sweep_dir / str(t.number)
        summary = json.loads((folder / "summary.json").read_text())
        config = OmegaConf.load(folder / ".hydra" / "config.yaml")
        for key, value in t.params.items():  # the trial trained exactly what Optuna suggested
            assert OmegaConf.select(config, key) == value, key
        assert set(t.params) == {"optim.lr", "optim.muon_lr", "optim.warmup_steps", "model.dropout"}
        assert (folder / "checkpoints" / "last.ckpt").is_file()  # a pruned trial keeps its checkpoint
        reported = {step: loss for step, _, loss in summary["val_curve"]}
        assert t.intermediate_values == pytest.approx(reported)  # every validation was reported at its step
        if t.state == optuna.trial.TrialState.PRUNED:
            assert summary["status"] == "pruned" and summary["steps"] < 4
        else:
            assert summary["status"] == "completed" and summary["steps"] == 4
            assert t.value == pytest.approx(min(reported.values()))

    with (sweep_dir / "trials.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [row["trial"] for row in table] == ["0", "1", "2", "3"]
    assert [row["state"] for row in table] == [s.name.lower() for s in states]
    for row, t in zip(table, trials):
        assert row["optim.lr"] == f"{t.params['optim.lr']:.4g}"
        assert len(row["optim.lr"].replace("0.", "").lstrip("0")) <= 4  # no 20-digit floats
    best = [row["trial"] for row in table if row["best"] == "*"]
    assert best == [str(_load(sweep_dir).best_trial.number)]
    assert "trials of study lr_search" in proc.stdout


def test_sweep_run_again_continues_the_study(pruned_sweep) -> None:
    home, sweep_dir, command, _ = pruned_sweep
    done = _run(command, home)  # n_trials reached: nothing to run
    assert done.returncode == 0 and "trial 4" not in done.stdout, done.stderr[-2000:]
    more = _run([*command, "hparams_search.n_trials=5"], home)  # one more trial in the same study
    assert more.returncode == 0, more.stderr[-3000:]
    assert [t.number for t in _load(sweep_dir).trials] == [0, 1, 2, 3, 4]
    assert "trial 4:" in more.stdout and "trial 3:" not in more.stdout


def test_a_storage_of_another_search_space_is_one_line(pruned_sweep) -> None:
    home, _, command, _ = pruned_sweep
    proc = _run([*command, "optim=adamw"], home)  # AdamW's weight decay is searched instead of muon_lr
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the study 'lr_search' in sqlite:///")
    assert "searches model.dropout, optim.lr, optim.muon_lr, optim.warmup_steps, not model.dropout, " in last
    assert "give this search space its own hparams_search.study_name or storage" in proc.stderr


def test_two_workers_share_one_study(tmp_path: Path, char_data_dir: Path, shakespeare_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    command = _command(sweep_dir, char_data_dir, shakespeare_path, 4, "hparams_search.pruner.name=none")
    workers = [
        subprocess.Popen(command, cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        for _ in range(2)
    ]  # fmt: skip
    outs = [w.communicate(timeout=240) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [err[-2000:] for _, err in outs]
    ran = [{int(n) for n in re.findall(r"^trial (\d+): ", out, flags=re.M)} for out, _ in outs]
    assert ran[0] and ran[1] and not ran[0] & ran[1]  # both worked, no trial twice
    assert ran[0] | ran[1] == {0, 1, 2, 3}
    trials = _load(sweep_dir).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 4
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 4


def test_a_killed_sweep_restarted_completes(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    sweep_dir = tmp_path / "sweep"
    command = _command(sweep_dir, char_data_dir, shakespeare_path, 2, "hparams_search.pruner.name=none",
                       "hparams_search.heartbeat_interval=1", "hparams_search.grace_period=2")  # fmt: skip
    worker = subprocess.Popen(command, cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    started = sweep_dir / "0" / "train.log"  # trial 0 asked for and running
    deadline = time.time() + 300
    while not started.exists() and worker.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    assert not (sweep_dir / "0" / "summary.json").exists()  # killed mid-trial
    first = _load(sweep_dir).trials[0]
    assert first.state == optuna.trial.TrialState.RUNNING

    proc = _run(command, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = _load(sweep_dir).trials
    states = [t.state for t in trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 1  # the killed one, failed by its stale heartbeat
    finished = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == 2  # the study completed its 2 trials
    assert any(t.params == first.params for t in finished)  # the killed trial was retried


def test_the_plugin_spelling_points_to_mini_gpt_sweep(tmp_path: Path) -> None:
    proc = _run([sys.executable, str(REPO / "train.py"), "-m", "hparams_search=lr_search"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: Optuna searches run with `mini-gpt sweep hparams_search=NAME ...` (the same overrides, "
        "without -m; docs/sweeps.md); `python train.py -m key=a,b` grid sweeps work as before"
    ]
