"""Pruning: the optimizer steps an Optuna sweep spends with each pruner, and the best val loss it finds.

    python -m mini_gpt.bench sweep [--pruners none,median,successive_halving] [--trials 8] [--steps 50]

Runs `mini-gpt sweep hparams_search=lr_search` once per pruner on the tiny model, same sampler seed and
trial count, each in a fresh study under --out; a row per pruner: optimizer steps of all trials (from the
trials' summary.json), their share of the first pruner's (the unpruned baseline), pruned trials, the best
val loss and its difference from the baseline's. Steps, not seconds: they do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mini_gpt.bench.common import comma_choices, conf_options, int_at_least

PRUNERS = ("none", "median", "successive_halving")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pruners",
        type=comma_choices(*PRUNERS),
        default=",".join(PRUNERS),
        help="comma list; the first is the baseline",
    )
    parser.add_argument("--trials", type=int_at_least(1), default=8)
    parser.add_argument("--steps", type=int_at_least(1), default=50, help="trainer.max_steps of each trial")
    parser.add_argument("--val-every", type=int_at_least(1), default=10, help="trainer.val_check_interval")
    parser.add_argument("--seed", type=int, default=1234, help="the sampler's seed")
    parser.add_argument("--model", choices=conf_options("model"), default="tiny")
    parser.add_argument("--out", default=None, help="folder for the studies (default: a temporary one)")


def _sweep(args: argparse.Namespace, pruner: str, folder: Path) -> list[dict[str, Any]]:
    from mini_gpt.train.sweep import TABLE_FILE  # (it imports Lightning: not for --help)

    command = [
        sys.executable, "-m", "mini_gpt.cli", "sweep", "hparams_search=lr_search", f"model={args.model}",
        f"hparams_search.dir={folder}", f"hparams_search.n_trials={args.trials}",
        f"hparams_search.sampler.seed={args.seed}", f"hparams_search.pruner.name={pruner}",
        f"hparams_search.pruner.successive_halving.min_resource={args.val_every}",
        f"trainer.max_steps={args.steps}", f"trainer.val_check_interval={args.val_every}",
        "loader.val_windows=32", "logger=none", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false", "trainer.enable_checkpointing=false",
        "callbacks.sample_text=null",
    ]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with (folder / TABLE_FILE).open() as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["steps"] = json.loads((folder / row["trial"] / "summary.json").read_text())["steps"]
    return rows


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-sweep-"))
    results = {}
    for pruner in args.pruners.split(","):
        trials = _sweep(args, pruner, root / pruner)
        best = min(float(t["best_val_loss"]) for t in trials if t["state"] == "complete")
        steps = sum(int(t["steps"]) for t in trials)
        results[pruner] = (steps, best, sum(t["state"] == "pruned" for t in trials), len(trials))
    base_steps, base_best, _, _ = next(iter(results.values()))
    rows = [
        {
            "pruner": pruner,
            "trials": n,
            "pruned": pruned,
            "optimizer_steps": steps,
            "steps_vs_first": steps / base_steps,
            "best_val_loss": best,
            "best_minus_first": best - base_best,
        }
        for pruner, (steps, best, pruned, n) in results.items()
    ]
    return rows, {"studies": str(root)}
