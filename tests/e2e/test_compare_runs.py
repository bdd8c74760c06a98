"""`mini-gpt compare` on real runs: a 2 x 2 grid of `python train.py -m`, and the scaling sweep
(experiment=scaling_cpu on a tiny grid of widths and FLOP budgets) with its isoFLOP fit."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO

from mini_gpt.cli.compare import main
from mini_gpt.viz.compare import compare_table, find_runs, labels


def _multirun(tmp_path: Path, sweep_dir: Path, *overrides: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(PYTHONPATH=str(REPO), WANDB_MODE="disabled", NETRC=str(tmp_path / "no-netrc"))
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", *overrides, "logger=none", "loader.batch_size=8",
         "loader.val_windows=8", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false",
         "trainer.enable_model_summary=false", "trainer.enable_checkpointing=false",
         "callbacks.sample_text=null", f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def test_compare_a_2x2_grid(tmp_path: Path, char_data_dir: Path, shakespeare_path: Path) -> None:
    grid = tmp_path / "grid"
    data = [f"data.path={shakespeare_path}", f"data.data_dir={char_data_dir}"]
    _multirun(tmp_path, grid, "model=tiny,char", "optim=adamw,muon", *data, "trainer.max_steps=2",
              "trainer.val_check_interval=2")  # fmt: skip
    assert main([str(grid)]) == 0
    with (grid / "compare.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {row["status"] for row in rows} == {"completed"}
    losses = [float(row["best_val_loss"]) for row in rows]
    assert losses == sorted(losses)
    assert {row["model.n_embd"] for row in rows} == {"32", "128"} and {row["optim.name"] for row in rows} == {
        "adamw", "muon"
    }  # fmt: skip
    runs = compare_table(find_runs([str(grid)]))[2]
    assert sorted(labels(runs, [])) == sorted(
        f"model={m} optim={o}" for m in ("tiny", "char") for o in ("adamw", "muon")
    )
    assert (grid / "compare.png").stat().st_size > 20_000


def test_scaling_sweep_end_to_end(tmp_path: Path, char_data_dir: Path, shakespeare_path: Path) -> None:
    sweep = tmp_path / "scaling"
    _multirun(
        tmp_path,
        sweep,
        "experiment=scaling_cpu",
        "model.n_embd=16,32,48",
        "trainer.max_flops=1e9,2e9",
        f"data.path={shakespeare_path}",
        f"data.data_dir={char_data_dir}",
        "trainer.val_check_interval=50",
    )
    folders = sorted(p.parent for p in sweep.glob("*/summary.json"))
    assert len(folders) == 6
    for folder in folders:  # each run spent its budget: the whole steps that fit, FLOPs per token as in MFU
        summary = json.loads((folder / "summary.json").read_text())
        cfg = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        model, budget = cfg["model"], float(cfg["trainer"]["max_flops"])
        per_token = 6 * summary["non_embedding_params"] + 12 * model["n_layer"] * model["n_embd"] * 64
        per_step = per_token * 8 * 64  # loader.batch_size x block_size tokens
        assert summary["steps"] == int(budget // per_step) >= 1
        assert summary["flops"] == pytest.approx(summary["steps"] * per_step)
    assert main([str(sweep), "--scaling"]) == 0
    assert (sweep / "scaling.png").stat().st_size > 10_000
