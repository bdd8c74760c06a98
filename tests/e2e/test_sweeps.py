"""Sweeps: Hydra multiruns (the trials table), the W&B sweep file (sweep/), the SLURM launcher; the Optuna
search (`mini-gpt sweep`) is tested in test_optuna.py."""

from __future__ import annotations

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
    from mini_gpt.train.sweep import read_trials, trials_table

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
    params = OmegaConf.load(CONF_DIR / "hparams_search" / "lr_search.yaml").params
    low, high = (float(x) for x in str(params["optim.lr"]).split("interval(")[1].rstrip(")").split(","))
    wandb_lr = yaml.safe_load(SWEEP_FILE.read_text())["parameters"]["optim.lr"]
    return [low, high, float(wandb_lr["min"]), float(wandb_lr["max"])]


@pytest.mark.parametrize("optim", ["muon", "adamw"])
def test_every_lr_of_the_shipped_search_spaces_is_valid(optim: str, compose: Any) -> None:
    from mini_gpt.train.optim import lr_multiplier

    bounds = _search_space_lr_bounds()
    assert min(bounds) == pytest.approx(1e-4)  # the low end that used to fall under an absolute min_lr
    for lr in bounds:
        cfg = compose([f"optim={optim}", f"optim.lr={lr}"])
        optim_cfg = OmegaConf.to_object(cfg.optim)
        factor = lr_multiplier(optim_cfg, max_steps=100)
        assert factor(100) * lr == pytest.approx(optim_cfg.min_lr_ratio * lr)  # the floor follows the peak
        assert 0 < factor(100) * lr < lr


def test_nonfinite_objective_becomes_inf_in_multirun() -> None:
    """A Hydra sweeper plugin may refuse a NaN objective; train.py hands it +inf instead, the worst value."""
    from mini_gpt.cli.train import sweep_objective

    assert sweep_objective(float("nan")) == math.inf
    assert sweep_objective(None) == math.inf
    assert sweep_objective(-math.inf) == math.inf
    assert sweep_objective(1.25) == 1.25


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
