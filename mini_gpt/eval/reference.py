"""Reference bands: is this run's val loss normal for its recipe? (docs/training.md)

Each shipped recipe has a file in references/: its val loss against tokens seen, over 3 seeds, as a mean
and a spread. A run matches when what makes curves comparable is equal (model shape, corpus, tokenizer,
tokens per step, step count); the optimizer's settings and the seed may differ: the band judges those. At
the last evaluation the band is the mean +- max(2 standard deviations, MIN_HALF_WIDTH) at the same token
count (linear in between): within it, above (worse) or below (better than every seed spread).

Refresh a file from completed runs (folders with summary.json and .hydra/config.yaml), as in
docs/development.md: python -m mini_gpt.eval.reference NAME 'COMMAND' RUN_DIR RUN_DIR [...]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REFERENCE_DIR = Path(__file__).with_name("references")
MIN_HALF_WIDTH = 0.02  # nats: 3 seeds estimate a spread poorly; never call a smaller gap abnormal
_MODEL_KEYS = ("block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "norm", "pos_embedding", "mlp")
_MODEL_KEYS += ("tie_weights",)
_DATA_KEYS = ("name", "path", "tokenizer", "bpe_file", "val_fraction")


def recipe_key(config: Mapping[str, Any], tokens_per_step: int, steps: int) -> dict[str, Any]:
    """What must match for two runs' curves to compare, from a run's resolved config (a plain dict)."""
    model, data = config.get("model") or {}, config.get("data") or {}
    key = {f"model.{k}": model.get(k) for k in _MODEL_KEYS} | {f"data.{k}": data.get(k) for k in _DATA_KEYS}
    return key | {"init_from": config.get("init_from"), "tokens_per_step": tokens_per_step, "steps": steps}


@dataclass
class Reference:
    name: str
    key: dict[str, Any]
    tokens: list[int]  # at each evaluation
    mean: list[float]  # the seeds' mean val loss there
    std: list[float]  # their sample standard deviation
    command: str = ""
    seeds: int = 3

    def band(self, tokens: float) -> tuple[float, float] | None:
        """(mean, half width) at `tokens`, linear between evaluations; None outside the reference's range."""
        if not self.tokens or not self.tokens[0] <= tokens <= self.tokens[-1]:
            return None
        mean, std = (float(np.interp(tokens, self.tokens, values)) for values in (self.mean, self.std))
        return mean, max(2 * std, MIN_HALF_WIDTH)

    def judge(self, tokens: float, val_loss: float) -> tuple[str, float] | None:
        """(verdict, gap = val_loss - band mean) at `tokens`; None where the band does not reach."""
        if (band := self.band(tokens)) is None:
            return None
        mean, half = band
        gap = val_loss - mean
        return ("within" if abs(gap) <= half else "above" if gap > 0 else "below"), gap


def load_references(directory: Path | None = None) -> list[Reference]:
    raws = {path.stem: json.loads(path.read_text()) for path in (directory or REFERENCE_DIR).glob("*.json")}
    fields = ("key", "tokens", "mean", "std", "command", "seeds")  # not per_seed: the runs' own curves
    return [Reference(name, **{field: raw[field] for field in fields}) for name, raw in sorted(raws.items())]


def find_reference(key: Mapping[str, Any], directory: Path | None = None) -> Reference | None:
    return next((ref for ref in load_references(directory) if ref.key == dict(key)), None)


def compare_to_reference(key: Mapping[str, Any], val_curve: list[list[float]], tokens_per_step: int) -> dict:
    """summary.json's fields: `reference` (the recipe's name or None), `vs_reference` (a verdict or None)
    and `vs_reference_gap` (nats, the last evaluation's val loss minus the band's mean)."""
    ref = find_reference(key)
    judged = ref.judge(val_curve[-1][0] * tokens_per_step, val_curve[-1][-1]) if ref and val_curve else None
    verdict, gap = judged or (None, None)
    return {"reference": ref.name if ref else None, "vs_reference": verdict, "vs_reference_gap": gap}


# ---- building a reference from runs ------------------------------------------------------------------


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[tuple[int, float]], str]:
    """(recipe key, [(tokens, val loss), ...], status) of a run folder (summary.json, .hydra/config.yaml)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())  # the keys read: plain values
    tokens_per_step = summary["tokens"] // max(summary["steps"], 1)
    curve = [(step * tokens_per_step, val) for step, _, val in summary["val_curve"]]
    max_steps = (config.get("trainer") or {}).get("max_steps")  # type: ignore[union-attr]
    steps = summary["steps"] if summary["status"] == "completed" else max_steps
    return recipe_key(config, tokens_per_step, steps), curve, summary["status"]  # type: ignore[arg-type]


def run_reference(run_dir: Path) -> tuple[Reference, int] | None:
    """(the reference band of a run's recipe, the run's tokens per step); None without one or a summary."""
    if not (run_dir / "summary.json").is_file() or not (run_dir / ".hydra" / "config.yaml").is_file():
        return None
    key, _, _ = read_run(run_dir)
    ref = find_reference(key)
    return (ref, key["tokens_per_step"]) if ref else None


def build_reference(run_dirs: list[Path], command: str) -> dict[str, Any]:
    runs = []
    for run_dir in map(Path, run_dirs):
        key, curve, status = read_run(run_dir)
        if status != "completed":
            raise ValueError(f"{run_dir}: status {status}; a reference needs completed runs")
        runs.append((key, curve))
    keys = {json.dumps(key, sort_keys=True) for key, _ in runs}
    if len(keys) != 1 or len(runs) < 2:
        raise ValueError("a reference needs two or more runs of the same recipe (only the seed differs)")
    tokens = sorted(set.intersection(*({t for t, _ in curve} for _, curve in runs)))
    per_run = [dict(curve) for _, curve in runs]
    vals = [[run[t] for run in per_run] for t in tokens]
    return {
        "key": runs[0][0], "command": command, "seeds": len(runs), "tokens": tokens,
        "mean": [statistics.fmean(v) for v in vals], "std": [statistics.stdev(v) for v in vals],
        "per_seed": [[run[t] for t in tokens] for run in per_run],
    }  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print(
            "usage: python -m mini_gpt.eval.reference NAME 'COMMAND' RUN_DIR RUN_DIR [...]", file=sys.stderr
        )
        return 2
    name, command, *dirs = argv[1:]
    out = REFERENCE_DIR / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(build_reference([Path(d) for d in dirs], command), indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
