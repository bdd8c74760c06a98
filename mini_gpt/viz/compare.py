"""Compare runs by their `summary.json` and `.hydra/config.yaml`; an isoFLOP fit. No torch, no Lightning."""

from __future__ import annotations

import base64
import contextlib
import csv
import html
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import yaml
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from mini_gpt.conf import register
from mini_gpt.errors import MiniGPTError
from mini_gpt.files import atomic_write
from mini_gpt.viz import save_figure

# Config keys that say where a run lives or how it was launched, not what it trained.
IGNORED_PREFIXES = ("paths.", "hparams_search.", "trainer.default_root_dir", "hydra.", "ckpt_path", "tags")
# The config's top-level keys that change what a run trains: the table's columns when their values differ.
TRAINED = {
    "model",
    "optim",
    "finetune",
    "trainer",
    "loader",
    "data",
    "seed",
    "init_from",
    "global_batch_tokens",
}
# Keys whose difference makes val losses incomparable (another corpus or tokenizer).
DATA_KEYS = ("data.name", "data.path", "data.tokenizer", "data.bpe_file")
NUMBERS = ["best_val_loss", "final_val_loss", "bits_per_byte", "steps", "tokens", "flops", "wall_seconds",
           "tokens_per_sec"]  # fmt: skip
CURVE_AXES = ("step", "tokens", "wall seconds", "FLOPs")  # compare.png's x axes


@dataclass
class Run:
    path: Path
    summary: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)  # flattened: "optim.lr" -> value
    overrides: dict[str, str] = field(default_factory=dict)  # its command line: "optim" -> "adamw"

    @property
    def objective(self) -> float:
        value = self.summary.get("best_val_loss")
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else math.inf

    def number(self, key: str) -> float | None:
        if key == "bits_per_byte":
            value = (self.summary.get("eval") or {}).get("eval/bpb/bits_per_byte")
        else:
            value = self.summary.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {k: v for key, value in node.items() for k, v in _flatten(value, f"{prefix}{key}.").items()}


def _resolved(config: dict[str, Any]) -> dict[str, Any]:
    """`config` flattened, each `${...}` resolved as the run did; one that cannot resolve here (`${hydra:...}`
    outside Hydra, a key the config lacks) stays as written. Needs `register()`'s resolvers."""
    node, flat = OmegaConf.create(config), _flatten(config)
    for key in [k for k, v in flat.items() if "${" in str(v)]:
        with contextlib.suppress(Exception):  # any resolution error: the value stays as written
            value = OmegaConf.select(node, key, throw_on_resolution_failure=True)
            flat[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return flat


def _read_run(folder: Path) -> Run:
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise MiniGPTError(f"{folder / 'summary.json'} is not readable JSON ({err})") from None
    config, overrides = (
        yaml.safe_load(f.read_text()) if f.is_file() else None
        for f in (folder / ".hydra" / "config.yaml", folder / ".hydra" / "overrides.yaml")
    )
    pairs = dict(o.split("=", 1) for o in overrides or [] if "=" in o and not o.startswith(IGNORED_PREFIXES))
    return Run(folder, summary, _resolved(config or {}), pairs)


def find_runs(paths: list[str]) -> list[Run]:
    folders: list[Path] = []
    for text in paths:
        path = Path(text).expanduser()
        if not path.exists():
            raise MiniGPTError(f"{path} does not exist; pass run folders or multirun / sweep folders")
        found = (
            [path] if (path / "summary.json").is_file() else [p.parent for p in path.rglob("summary.json")]
        )
        folders += [f.resolve() for f in sorted(found) if f.resolve() not in folders]
    if not folders:
        raise MiniGPTError(
            f"no runs in {', '.join(paths)}: a run folder has a summary.json (written when a training "
            "run ends); pass run folders, multirun folders or sweep folders"
        )
    register()  # once: the resolvers training has (${project_root:}), for _resolved
    runs = [_read_run(f) for f in folders]
    # A trial killed before Hydra wrote .hydra/ has numbers but nothing that says what it trained.
    kept = [run for run in runs if run.config]
    missing = ", ".join(str(run.path) for run in runs if not run.config)
    if not kept:
        raise MiniGPTError(
            f"{missing}: no .hydra/config.yaml (killed before Hydra wrote it), so nothing says what was "
            "trained; pass folders of runs that started"
        )
    if missing:
        print(f"skipped {missing}: no .hydra/config.yaml (killed before Hydra wrote it)", file=sys.stderr)
    return kept


def _differing(runs: list[Run]) -> list[str]:
    trained = (k for run in runs for k in run.config if k.split(".")[0] in TRAINED)
    keys = dict.fromkeys(k for k in trained if not k.startswith(IGNORED_PREFIXES))
    return [k for k in keys if len({repr(run.config.get(k)) for run in runs}) > 1]


def _setting(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "-" if value is None else str(value)


def labels(runs: list[Run], keys: list[str]) -> list[str]:
    """Each run's name: the overrides that differ between runs, else the config values, else its folder.
    A value the config holds is shown as the table shows it (a float to 4 significant digits)."""
    names = []
    for run in runs:
        over = [k for k in run.overrides if len({r.overrides.get(k) for r in runs}) > 1]
        parts = [f"{k}={_setting(run.config[k]) if k in run.config else run.overrides[k]}" for k in over]
        names.append(" ".join(parts or [f"{k}={_setting(run.config.get(k))}" for k in keys]) or run.path.name)
    return names


def _fmt(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
    return "-" if value is None else str(value)


def compare_table(runs: list[Run]) -> tuple[list[str], list[list[str]], list[Run], list[str]]:
    """(header, rows, runs in row order, differing keys): best objective first, the best marked `*`."""
    keys = _differing(runs)
    data_keys = [k for k in keys if k in DATA_KEYS]
    if data_keys and not all(run.number("bits_per_byte") is not None for run in runs):
        raise MiniGPTError(
            f"these runs differ in {', '.join(data_keys)}: their val losses are on different data or tokens "
            "and do not compare; compare runs of one corpus and tokenizer (or evaluate bits per byte in all)"
        )
    ordered = sorted(runs, key=lambda r: (r.objective, str(r.path)))
    header = ["best", *keys, "status", *NUMBERS, "run"]
    rows = []
    for i, run in enumerate(ordered):
        best = "*" if i == 0 and math.isfinite(run.objective) else ""
        status = str(run.summary.get("status", "unknown"))  # any status string (completed, pruned, ...)
        numbers = [_fmt(run.summary.get(k) if k in ("steps", "tokens") else run.number(k)) for k in NUMBERS]
        rows.append([best, *(_setting(run.config.get(k)) for k in keys), status, *numbers, str(run.path)])
    return header, rows, ordered, keys


@dataclass(frozen=True)
class SeedGroup:
    """Runs that differ only in their seed: the same recipe's spread (a record is a mean over seeds)."""

    setting: str  # the other differing keys, as the table shows them ("" when only the seed differs)
    seeds: list[Any]
    final: list[float]  # final val loss per seed, in seed order
    wall: list[float]  # wall seconds per seed

    @property
    def mean(self) -> float:
        return statistics.fmean(self.final)

    @property
    def std(self) -> float:
        return statistics.stdev(self.final)  # the sample standard deviation, as the reference bands


def seed_groups(runs: list[Run], keys: list[str]) -> list[SeedGroup]:
    """When the seed is among the differing keys: the runs grouped by every other differing key, each group
    of 2+ completed runs with a final val loss (others are left out of the means)."""
    if "seed" not in keys:
        return []
    others = [k for k in keys if k != "seed"]
    groups: dict[str, list[Run]] = {}
    for run in runs:
        if run.summary.get("status") == "completed" and run.number("final_val_loss") is not None:
            name = " ".join(f"{k}={_setting(run.config.get(k))}" for k in others)
            groups.setdefault(name, []).append(run)
    result = []
    for name, members in groups.items():
        members = sorted(members, key=lambda r: _seed_order(r.config.get("seed")))
        if len(members) >= 2:
            final = [r.number("final_val_loss") or math.nan for r in members]
            wall = [r.number("wall_seconds") or math.nan for r in members]
            result.append(SeedGroup(name, [r.config.get("seed") for r in members], final, wall))
    return sorted(result, key=lambda g: g.mean)


def _seed_order(seed: Any) -> tuple[int, int, str]:
    return (0, seed, "") if isinstance(seed, int) else (1, 0, repr(seed))  # 2 before 10


def seeds_table(groups: list[SeedGroup]) -> tuple[list[str], list[list[str]]]:
    header = ["setting", "seeds", "mean final_val_loss", "std", "per seed", "max wall_seconds"]
    rows = [
        [g.setting or "-", ",".join(map(str, g.seeds)), f"{g.mean:.4f}", f"{g.std:.4f}",
         ", ".join(f"{v:.4f}" for v in g.final), f"{max(g.wall):.1f}"]
        for g in groups
    ]  # fmt: skip
    return header, rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def curves_figure(runs: list[Run], keys: list[str]) -> Figure:
    """Val loss against each of CURVE_AXES (tokens and FLOPs per step from the totals), a line per run."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), layout="constrained")
    names = labels(runs, keys)
    for run, name in zip(runs, names):
        curve, steps = run.summary.get("val_curve") or [], max(run.summary.get("steps") or 0, 1)
        tokens, flops = (run.summary.get("tokens") or 0) / steps, (run.summary.get("flops") or 0) / steps
        per_step = {"step": 1, "tokens": tokens, "FLOPs": flops}
        for ax, x in zip(axes.flat, CURVE_AXES):
            xs = [seconds if x == "wall seconds" else step * per_step[x] for step, seconds, _ in curve]
            ax.plot(xs, [val for _, _, val in curve], marker=".", label=name)
    for ax, x in zip(axes.flat, CURVE_AXES):
        ax.set(xlabel=x, ylabel="val loss")
        ax.grid(alpha=0.3)
    # below the panels, where long names cover no curve: as many columns as fit (~160 small characters)
    columns = max(1, min(len(names), 160 // (max(map(len, names), default=1) + 8)))
    handles = axes.flat[0].get_legend_handles_labels()
    fig.legend(*handles, loc="outside lower center", ncols=columns, fontsize="small")
    return fig


def write_report(
    header: list[str], rows: list[list[str]], runs: list[Run], keys: list[str], out: Path
) -> dict:
    files = {"csv": out / "compare.csv", "png": out / "compare.png", "html": out / "compare.html"}
    with atomic_write(files["csv"], "w") as f:
        csv.writer(f).writerows([header, *rows])
    save_figure(curves_figure(runs, keys), files["png"], dpi=110)
    image = base64.b64encode(files["png"].read_bytes()).decode()
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    page = (
        "<!doctype html><meta charset='utf-8'><title>mini-gpt compare</title>"
        "<style>table{border-collapse:collapse;font:13px monospace}td,th{border:1px solid #ccc;"
        "padding:2px 6px}</style>"
        f"<h1>{len(rows)} runs</h1><table><tr>{cells}</tr>{body}</table>"
        f"<h2>validation curves</h2><img src='data:image/png;base64,{image}'>"
    )
    with atomic_write(files["html"], "w") as f:
        f.write(page)
    return files


@dataclass
class ScalingFit:
    """isoFLOP minima per budget and the power law N_opt = a * C^b through them."""

    params_key: str  # "non_embedding_params" or "params"
    minima: list[tuple[float, float, float]]  # (budget FLOPs, N_opt, loss at N_opt)
    exponent: float | None  # b (None with fewer than two budgets)
    coefficient: float | None  # a
    parabolas: dict[float, np.ndarray]  # budget -> quadratic coefficients of loss in log10 N
    points: dict[float, list[tuple[float, float]]]  # budget -> the runs' (parameters, final val loss)


def scaling_fit(runs: list[Run], params_key: str = "non_embedding_params") -> ScalingFit:
    """Per compute budget (trainer.max_flops, >= 3 sizes): a parabola of final val loss in log10(parameters)
    whose minimum is the optimal size N_opt; then log N_opt = log a + b log C."""
    groups: dict[float, list[tuple[float, float]]] = {}
    for run in runs:
        budget = run.config.get("trainer.max_flops")
        n, loss = run.number(params_key), run.number("final_val_loss")
        if isinstance(budget, int | float) and n is not None and loss is not None and math.isfinite(loss):
            groups.setdefault(float(budget), []).append((n, loss))
    usable = {c: pts for c, pts in groups.items() if len({n for n, _ in pts}) >= 3}
    if not usable:
        raise MiniGPTError(
            "scaling=true needs runs trained to a compute budget (trainer.max_flops=...) with at least 3 "
            "model sizes per budget (e.g. python train.py -m experiment=scaling_cpu)"
        )
    minima, parabolas = [], {}
    for budget, pts in sorted(usable.items()):
        x, y = np.log10([n for n, _ in pts]), np.array([loss for _, loss in pts])
        coef = np.polyfit(x, y, 2)
        if coef[0] > 0:  # a valley: its vertex, kept inside the sizes tried
            best_x = float(np.clip(-coef[1] / (2 * coef[0]), x.min(), x.max()))
        else:  # no valley (data-limited or too few sizes): the best size tried
            best_x = float(x[int(np.argmin(y))])
        minima.append((budget, 10**best_x, float(np.polyval(coef, best_x))))
        parabolas[budget] = coef
    exponent = coefficient = None
    if len(minima) >= 2:
        b, log_a = np.polyfit(np.log10([c for c, _, _ in minima]), np.log10([n for _, n, _ in minima]), 1)
        exponent, coefficient = float(b), float(10**log_a)
    return ScalingFit(params_key, minima, exponent, coefficient, parabolas, usable)


def plot_scaling(runs: list[Run], fit: ScalingFit, path: Path) -> None:
    """isoFLOP curves from `fit` (`runs` is unused)."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(fit.minima)))
    for (budget, n_opt, loss_opt), color in zip(fit.minima, colors):
        pts = sorted(fit.points[budget])
        ax.scatter([n for n, _ in pts], [v for _, v in pts], color=color, label=f"C = {budget:.2g} FLOPs")
        xs = np.linspace(math.log10(pts[0][0]), math.log10(pts[-1][0]), 50)
        ax.plot(10**xs, np.polyval(fit.parabolas[budget], xs), color=color, alpha=0.6)
        ax.scatter([n_opt], [loss_opt], color=color, marker="*", s=200, edgecolor="black")
    title = "isoFLOP curves (star: fitted optimum per budget)"
    if fit.exponent is not None:
        title += f"\nN_opt = {fit.coefficient:.3g} * C^{fit.exponent:.3f}"
    xlabel = "non-embedding parameters" if fit.params_key == "non_embedding_params" else "parameters"
    ax.set(xscale="log", xlabel=xlabel, ylabel="final val loss", title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
