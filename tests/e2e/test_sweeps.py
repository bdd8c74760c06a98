"""Sweeps: the Optuna search (hparams_search/), the W&B sweep file (sweep/), the SLURM launcher."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO
from omegaconf import OmegaConf

from mini_gpt.conf import CONF_DIR

SWEEP_FILE = CONF_DIR / "sweep" / "lr.yaml"
SEARCHED = {"optim.lr", "optim.warmup_steps", "model.dropout", "optim.weight_decay"}


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(NETRC=str(home / "no-netrc"), PYTHONPATH=str(REPO), WANDB_MODE="disabled", WANDB_SILENT="true")
    return env


@pytest.fixture(scope="module")
def char_cache(tmp_path_factory: pytest.TempPathFactory, shakespeare_path: Path) -> Path:
    from mini_gpt.data import DataConfig, prepare_data

    root = tmp_path_factory.getbasetemp() / "mini_gpt_char_cache"
    prepare_data(DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(root)))
    return root


def _tiny(data_dir: Path, shakespeare: Path, steps: int) -> list[str]:
    return [
        "model=tiny",
        f"data.path={shakespeare}",
        f"data.data_dir={data_dir}",
        "loader.batch_size=8",
        "loader.val_windows=16",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.enable_checkpointing=false",
        "callbacks.sample_text=null",
    ]


# ---- Optuna ----------------------------------------------------------------------------------------


def test_lr_search_composes_with_real_keys(compose: Any) -> None:
    cfg = compose(["hparams_search=lr_search"], hydra=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("optuna_sweeper.OptunaSweeper")
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler"
    assert sweeper.sampler.seed == 1234
    assert sweeper.direction == "minimize"
    assert sweeper.n_jobs == 1
    assert sweeper.max_failure_rate == 1.0  # n_jobs=1: anything lower ends the sweep at one failure
    assert set(sweeper.params) == SEARCHED
    for key in SEARCHED:  # every searched key exists in the composed config (a typo would not sweep)
        assert OmegaConf.select(cfg, key, throw_on_missing=True) is not None, key
    # trials get their own directories under one sweep dir
    assert OmegaConf.to_container(cfg.hydra.sweep)["subdir"] == "${hydra.job.num}"


def _three_trial_lr_search(
    tmp_path: Path, sweep_dir: Path, overrides: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess:
    """`train.py -m hparams_search=lr_search` with 3 trials into `sweep_dir`; the sweep must exit 0."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", *overrides, "hparams_search=lr_search",
         "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return proc


def test_optuna_sweep_runs_trials_and_survives_a_failed_one(
    tmp_path: Path, char_cache: Path, shakespeare_path: Path
) -> None:
    sweep_dir = tmp_path / "sweep"
    # loader.batch_size=choice(8,0) joins the search space from the command line: batch size 0 makes a
    # trial fail (MiniGPTError); with sampler seed 2 the three trials draw 8, 8 and 0 (optuna 2.10).
    tiny = [o for o in _tiny(char_cache, shakespeare_path, steps=3) if not o.startswith("loader.batch_size")]
    overrides = [*tiny, "hydra.sweeper.sampler.seed=2", "loader.batch_size=choice(8,0)", "logger=wandb"]
    proc = _three_trial_lr_search(tmp_path, sweep_dir, overrides, {**_env(tmp_path), "WANDB_MODE": "offline"})
    out = proc.stdout + proc.stderr

    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert set(results["best_params"]) == SEARCHED | {"loader.batch_size"}
    values = {}
    for trial in range(3):
        summary = sweep_dir / str(trial) / "summary.json"
        if summary.is_file():
            values[trial] = json.loads(summary.read_text())["best_val_loss"]
    assert sorted(values) == [0, 1], (values, out[-3000:])  # trial 2 failed, the sweep went on
    group = f"multirun-{sweep_dir.parent.name}_{sweep_dir.name}".encode()
    for trial in values:  # one W&B run per trial (finished after each job), all in the sweep's group
        runs = list((sweep_dir / str(trial) / "wandb").glob("offline-run-*/run-*.wandb"))
        assert len(runs) == 1, runs
        records = runs[0].read_bytes()
        assert group in records and f"trial-{trial}".encode() in records
    assert "Failed experiment: batch_size=0 must be a positive integer" in out
    assert results["best_value"] == pytest.approx(min(values.values()), abs=1e-12)
    assert results["best_params"]["loader.batch_size"] == 8
    assert "Best parameters" in out

    # Each trial is timed from its own start: trial 1 began after trial 0 wrote its summary.
    summaries = {t: json.loads((sweep_dir / str(t) / "summary.json").read_text()) for t in values}
    mtime = {t: (sweep_dir / str(t) / "summary.json").stat().st_mtime for t in values}
    own = mtime[1] - mtime[0]
    assert 0 < summaries[1]["wall_seconds"] <= own + 0.5, (summaries[1]["wall_seconds"], own)
    assert 0 < summaries[1]["val_curve"][-1][1] <= summaries[1]["wall_seconds"]
    # The failed trial's folder says why.
    assert "error: batch_size=0 must be a positive integer" in (sweep_dir / "2" / "train.log").read_text()
    # The table of trials: printed at the end and written beside optimization_results.yaml.
    with (sweep_dir / "trials.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [row["trial"] for row in table] == ["0", "1", "2"]
    assert set(table[0]) >= SEARCHED | {"status", "best_val_loss", "wall_seconds", "steps", "error"}
    for trial in (0, 1):
        row = table[trial]
        assert row["status"] == "completed" and row["error"] == ""
        assert float(row["best_val_loss"]) == pytest.approx(values[trial], abs=1e-4)
        assert float(row["wall_seconds"]) == pytest.approx(summaries[trial]["wall_seconds"], abs=0.05)
        overrides = yaml.safe_load((sweep_dir / str(trial) / ".hydra" / "overrides.yaml").read_text())
        assert f"optim.lr={row['optim.lr']}" in overrides
    assert table[2]["status"] == "failed" and table[2]["loader.batch_size"] == "0"
    assert table[2]["error"].startswith("error: batch_size=0 must be a positive integer")
    assert f"trials of {sweep_dir}" in proc.stdout
    printed = proc.stdout[proc.stdout.index(f"trials of {sweep_dir}") :].splitlines()
    assert printed[1].split()[:2] == ["trial", *[k for k in table[0] if k != "trial"][:1]]
    assert [line.split()[0] for line in printed[2:5]] == ["0", "1", "2"]


def test_multirun_with_ddp_stops_once_before_the_first_trial(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", "trainer=ddp", "trainer.accelerator=cpu",
         "trainer.devices=2", "seed=1,2", f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=240,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "error: Hydra multirun (-m) cannot run a multi-device strategy started from inside the trial "
        "(trainer.devices=2): sweep with one device per trial, or run each trial as a multi-GPU SLURM job "
        "with hydra/launcher=slurm"
    ]
    assert "Launching" not in proc.stdout and not sweep_dir.exists()  # no trial started


def test_trials_table_from_trial_folders(tmp_path: Path) -> None:
    from mini_gpt.train.sweeps import read_trials, trials_table

    def trial(n: int, overrides: list[str], summary: dict[str, Any] | None, log: str = "") -> None:
        folder = tmp_path / str(n)
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        if summary is not None:
            (folder / "summary.json").write_text(json.dumps(summary))
        (folder / "train.log").write_text(log)

    common = "trainer.max_steps=3"
    done = {"status": "completed", "best_val_loss": 2.5, "wall_seconds": 9.04, "steps": 3}
    diverged = {"status": "nonfinite", "best_val_loss": None, "wall_seconds": 3.0, "steps": 2}
    trial(0, [common, "optim.lr=0.01", "seed=1"], done)
    trial(1, [common, "optim.lr=0.02", "seed=1"], None, "step 0\nerror: bad value\nmore\n")
    trial(10, [common, "optim.lr=0.03", "seed=1"], diverged, "Traceback\nValueError: x\n")
    (tmp_path / ".submitit").mkdir()  # not a trial
    header, rows = trials_table(read_trials(tmp_path))
    # only the override that differs between trials gets a column; trials in numeric order
    assert header == ["trial", "optim.lr", "status", "best_val_loss", "wall_seconds", "steps", "error"]
    assert rows == [
        ["0", "0.01", "completed", "2.5000", "9.0", "3", ""],
        ["1", "0.02", "failed", "-", "-", "-", "error: bad value"],
        ["10", "0.03", "nonfinite", "-", "3.0", "2", "ValueError: x"],
    ]


def _search_space_lr_bounds() -> list[float]:
    """The smallest and largest optim.lr of the Optuna search and of the W&B sweep, as shipped."""
    params = OmegaConf.load(CONF_DIR / "hparams_search" / "lr_search.yaml").hydra.sweeper.params
    low, high = (float(x) for x in str(params["optim.lr"]).split("interval(")[1].rstrip(")").split(","))
    wandb_lr = yaml.safe_load(SWEEP_FILE.read_text())["parameters"]["optim.lr"]
    return [low, high, float(wandb_lr["min"]), float(wandb_lr["max"])]


@pytest.mark.parametrize("optim", ["muon", "adamw"])
def test_every_lr_of_the_shipped_search_spaces_is_valid(optim: str, compose: Any) -> None:
    from mini_gpt.train.optim import OptimConfig, lr_multiplier

    bounds = _search_space_lr_bounds()
    assert min(bounds) == pytest.approx(1e-4)  # the low end that used to fall under an absolute min_lr
    for lr in bounds:
        cfg = compose([f"optim={optim}", f"optim.lr={lr}"])
        optim_cfg = OptimConfig.from_dict(OmegaConf.to_container(cfg.optim, resolve=True))
        factor = lr_multiplier(optim_cfg, max_steps=100)
        assert factor(100) * lr == pytest.approx(optim_cfg.min_lr_ratio * lr)  # the floor follows the peak
        assert 0 < factor(100) * lr < lr


def test_optuna_search_over_the_shipped_space_has_no_failed_trial(
    tmp_path: Path, char_cache: Path, shakespeare_path: Path
) -> None:
    sweep_dir = tmp_path / "sweep"
    # Sampler seed 3 draws optim.lr 2.3e-3, 1.3e-4 and 1.2e-4 (optuna 2.10): two below the old
    # absolute floor (min_lr 3e-4 of optim=muon, the default), which made such trials fail.
    overrides = [*_tiny(char_cache, shakespeare_path, steps=2), "hydra.sweeper.sampler.seed=3", "logger=none"]
    proc = _three_trial_lr_search(tmp_path, sweep_dir, overrides, _env(tmp_path))
    out = proc.stdout + proc.stderr
    lrs = [OmegaConf.load(sweep_dir / str(t) / ".hydra" / "config.yaml").optim.lr for t in range(3)]
    assert min(lrs) < 3e-4, lrs  # the search did reach the low end of its range
    assert "Failed experiment" not in out, out[-3000:]
    for trial in range(3):
        summary = json.loads((sweep_dir / str(trial) / "summary.json").read_text())
        assert summary["steps"] == 2 and math.isfinite(summary["best_val_loss"])


def test_nonfinite_objective_becomes_inf_in_multirun() -> None:
    """A NaN objective crashes hydra-optuna-sweeper 1.3 (optuna 2.10 refuses it, then the sweeper's
    FAIL fallback raises); train.py hands the sweeper +inf instead, which Optuna records as the worst."""
    from mini_gpt.train import run as train

    assert train.sweep_objective(float("nan")) == math.inf
    assert train.sweep_objective(None) == math.inf
    assert train.sweep_objective(-math.inf) == math.inf
    assert train.sweep_objective(1.25) == 1.25


def test_wandb_group_for_sweeps() -> None:
    from mini_gpt.train import loggers

    assert loggers.default_wandb_group({"WANDB_SWEEP_ID": "abc123"}, sweep_dir=None) == "sweep-abc123"
    assert (
        loggers.default_wandb_group({}, sweep_dir="/x/outputs/train/multiruns/2024-01-02/03-04-05")
        == "multirun-2024-01-02_03-04-05"
    )
    assert loggers.default_wandb_group({}, sweep_dir=None) is None


# ---- W&B sweeps ------------------------------------------------------------------------------------


def _agent_command(spec: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """The argv `wandb agent` runs for one trial: its own macro expansion (wandb/wandb_agent.py) with
    the flags from wandb's create_sweep_command_args; ${interpreter} is this Python, not `python`."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    macros = create_sweep_command_args({"args": {k: {"value": v} for k, v in params.items()}})
    macros.update(env=["/usr/bin/env"], interpreter=[sys.executable], program=[spec["program"]])
    argv: list[str] = []
    for part in map(str, spec["command"]):
        argv += macros[part[2:-1]] if part.startswith("${") and part.endswith("}") else [part]
    return argv


def test_wandb_sweep_file_has_the_required_keys(compose: Any) -> None:
    spec = yaml.safe_load(SWEEP_FILE.read_text())
    assert spec["program"] == "train.py"
    assert spec["method"] in {"grid", "random", "bayes"}
    assert spec["metric"] == {"name": "val/loss", "goal": "minimize"}
    assert set(spec["parameters"]) == SEARCHED
    assert "${args_no_hyphens}" in spec["command"]
    cfg = compose([])
    for key in spec["parameters"]:  # the parameter names are real Hydra keys
        assert OmegaConf.select(cfg, key, throw_on_missing=True) is not None, key
    # no folder in conf/ is a defaults-list group named `sweep`
    entries = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "train.yaml"))["defaults"]
    groups = {next(iter(d)) for d in entries if isinstance(d, dict)}
    assert "model" in groups and "sweep" not in groups


def test_agent_command_expansion() -> None:
    spec = yaml.safe_load(SWEEP_FILE.read_text())
    argv = _agent_command(spec, {"optim.lr": 0.002, "optim.warmup_steps": 50})
    assert argv[:3] == ["/usr/bin/env", sys.executable, "train.py"]
    assert argv[-2:] == ["optim.lr=0.002", "optim.warmup_steps=50"]


def test_wandb_sweep_command_runs_train(tmp_path: Path, char_cache: Path, shakespeare_path: Path) -> None:
    spec = yaml.safe_load(SWEEP_FILE.read_text())
    params = {"optim.lr": 0.0031, "optim.warmup_steps": 25, "model.dropout": 0.05, "optim.weight_decay": 0.02}
    argv = _agent_command(spec, params)
    run_dir = tmp_path / "trial"
    argv += [*_tiny(char_cache, shakespeare_path, steps=2), "logger=csv", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(
        argv, cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=180,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    resolved = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    assert resolved.optim.lr == 0.0031
    assert resolved.optim.warmup_steps == 25
    assert resolved.model.dropout == 0.05
    assert resolved.optim.weight_decay == 0.02
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    assert math.isfinite(summary["final_val_loss"])
    assert (run_dir / "csv" / "metrics.csv").is_file()


# ---- SLURM launcher --------------------------------------------------------------------------------


def test_slurm_launcher_composes(compose: Any) -> None:
    from hydra.utils import instantiate

    cfg = compose(
        ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.tasks_per_node=8"],
        hydra=True,
    )
    launcher_cfg = cfg.hydra.launcher
    assert launcher_cfg._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher_cfg.partition == "gpu"
    assert launcher_cfg.tasks_per_node == 8
    assert launcher_cfg.timeout_min == 240
    # the plugin's own keys are all present (ours extends submitit_slurm)
    assert {"signal_delay_s", "max_num_timeout", "additional_parameters", "qos"} <= set(launcher_cfg)
    launcher = instantiate(launcher_cfg)
    # (Hydra's plugin discovery imports the module under its own name: compare by name, not isinstance)
    assert type(launcher).__qualname__ == "SlurmLauncher"
    assert launcher.params["partition"] == "gpu"
    assert launcher.params["submitit_folder"].endswith("/.submitit/%j")  # job logs inside the sweep dir
