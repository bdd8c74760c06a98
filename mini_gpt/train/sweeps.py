"""Hydra multirun (`python train.py -m ...`): checks before the first trial, the table of trials at the end.

`SweepReport` (a Hydra callback, conf/hydra/default.yaml) refuses in one line a multi-device strategy the
trials could not run, before the first trial; after the last it prints the trials' table (varying
overrides, status, best val loss, wall seconds) and writes it to `<sweep dir>/trials.csv`.
"""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from mini_gpt.errors import MiniGPTError

__all__ = ["TABLE_FILE", "SweepReport", "check_sweep_strategy", "read_trials", "render_table", "trials_table"]

TABLE_FILE = "trials.csv"


def check_sweep_strategy(config: DictConfig) -> None:
    """Refuse trials that would each start a multi-device strategy from inside the trial (every trial would
    fail); a cluster launcher (SLURM) starts the ranks itself and is allowed."""
    launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
    if "submitit" in launcher.lower():
        return
    trainer_cfg = config.trainer
    strategy = trainer_cfg.get("strategy", "auto")
    if isinstance(strategy, str) and strategy == "auto":
        return  # one device per process (Lightning picks single-device strategies for "auto")
    import lightning as L
    from hydra.utils import instantiate

    from mini_gpt.train.run import check_multirun_strategy

    lightning_logger = logging.getLogger("lightning.pytorch")
    level = lightning_logger.level
    lightning_logger.setLevel(logging.WARNING)  # no "GPU available: ..." lines for a throwaway Trainer
    try:
        trainer = L.Trainer(
            accelerator=trainer_cfg.get("accelerator", "auto"),
            devices=trainer_cfg.get("devices", "auto"),
            num_nodes=trainer_cfg.get("num_nodes", 1),
            strategy=instantiate(strategy) if not isinstance(strategy, str) else strategy,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
    finally:
        lightning_logger.setLevel(level)
    check_multirun_strategy(trainer, multirun=True)


def _error_line(trial_dir: Path) -> str:
    """The reason a trial failed, from its train.log: the `error:` line, else the last line."""
    log = trial_dir / "train.log"
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()] if log.is_file() else []
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no train.log"])[-1]


def read_trials(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """One row (a dict) per trial directory `<sweep dir>/<n>/`, in trial order."""
    rows = []
    trial_dirs = [d for d in Path(sweep_dir).iterdir() if d.is_dir() and d.name.isdigit()]
    for trial_dir in sorted(trial_dirs, key=lambda d: int(d.name)):
        overrides_file = trial_dir / ".hydra" / "overrides.yaml"
        overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []
        row: dict[str, Any] = {
            "trial": int(trial_dir.name),
            "overrides": dict(o.split("=", 1) for o in overrides or [] if "=" in o),
            "status": "failed",
            "best_val_loss": None,
            "wall_seconds": None,
            "steps": None,
            "error": "",
        }
        summary_file = trial_dir / "summary.json"
        if summary_file.is_file():
            summary = json.loads(summary_file.read_text())
            row.update({k: summary.get(k) for k in ("status", "best_val_loss", "wall_seconds", "steps")})
        if row["status"] != "completed":
            row["error"] = _error_line(trial_dir)
        rows.append(row)
    return rows


def _varying_keys(rows: list[dict[str, Any]]) -> list[str]:
    """Override keys whose value differs between trials (all keys for a single trial), in first-seen order."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row["overrides"] if k not in keys]
    if len(rows) < 2:
        return keys
    return [k for k in keys if len({row["overrides"].get(k) for row in rows}) > 1]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
    return str(value)


def trials_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows of strings) of the sweep's table; only the overrides that vary get a column."""
    keys = _varying_keys(rows)
    header = ["trial", *keys, "status", "best_val_loss", "wall_seconds", "steps", "error"]
    body = [
        [
            str(row["trial"]),
            *(row["overrides"].get(k, "-") for k in keys),
            row["status"],
            _fmt(row["best_val_loss"]),
            "-" if row["wall_seconds"] is None else f"{row['wall_seconds']:.1f}",
            _fmt(row["steps"]),
            row["error"],
        ]
        for row in rows
    ]
    return header, body


def render_table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header) - 1)]
    lines = []
    for r in [header, *body]:
        cells = [c.ljust(w) for c, w in zip(r, widths)]
        lines.append("  ".join([*cells, r[-1]]).rstrip())
    return "\n".join(lines)


class SweepReport(Callback):
    """Hydra callback: refuse an impossible strategy before the first trial; the table after the last."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "trainer" not in config:  # another tool's multirun
            return
        try:
            check_sweep_strategy(config)
        except MiniGPTError as err:  # before any trial: one line, nothing started
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if "trainer" not in config or not sweep_dir.is_dir():
            return
        rows = read_trials(sweep_dir)
        if not rows:
            return
        header, body = trials_table(rows)
        path = sweep_dir / TABLE_FILE
        with path.open("w", newline="") as f:
            csv.writer(f).writerows([header, *body])
        print(f"\ntrials of {sweep_dir} (also in {path}):\n{render_table(header, body)}", flush=True)
