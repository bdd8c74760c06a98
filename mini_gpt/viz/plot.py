"""A run's curves from its `metrics.csv` and `summary.json` files, resumed runs joined. No torch."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.reference import run_reference
from mini_gpt.files import read_json
from mini_gpt.viz import save_figure

Series = dict[int, float]  # step -> value
Band = tuple[list[float], list[float], list[float], str]  # steps, mean, half width, label

COLUMNS = {"train_loss": "train/loss", "val_loss": "val/loss", "lr": "lr"}  # our name -> the CSV column
# The best head's score per role, as callbacks.head_roles logs it (docs/inspect.md)
HEAD_ROLE_COLUMNS = {
    role: f"head_roles/{role}_max" for role in ("induction", "previous_token", "duplicate_token")
}
# The health page's panels (callbacks.health's `health/<family>/<member>` columns, kept under those names).
HEALTH_PANELS = {
    "grad_norm": ("gradient norm (before clipping)", True),  # family: (title, log scale)
    "update_ratio": ("update / weight, ||dw|| / ||w|| per step", True),
    "rms": ("block output RMS (residual stream)", False),
    "attn_entropy": ("attention entropy (nats)", False),
}
NO_TRAIN_LOSS = "train loss not logged (logger=none); rerun with logger=csv or logger=wandb"


def _float(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def read_metrics_csv(path: Path, columns: dict[str, str] = COLUMNS) -> dict[str, Series]:
    """The curves in one CSVLogger file (a row per log call, blanks for the other columns)."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    health = [(c, c) for c in reader.fieldnames or [] if c.startswith("health/")]
    out: dict[str, Series] = {}
    for name, column in [*columns.items(), *(health if columns is COLUMNS else [])]:
        pairs = ((_float(row.get("step")), _float(row.get(column))) for row in rows)
        if series := {int(step): value for step, value in pairs if step is not None and value is not None}:
            out[name] = series
    return out


def read_summary_val_curve(path: Path) -> Series:
    """{step: val_loss} from summary.json's `val_curve` ([step, seconds, val_loss] rows)."""
    rows = (read_json(path) or {}).get("val_curve") or []
    pairs = ((row[0], _float(row[2])) for row in rows if isinstance(row, list) and len(row) == 3)
    return {step: value for step, value in pairs if isinstance(step, int) and value is not None}


def resumed_from(run_dir: Path) -> Path | None:
    try:
        ckpt = (yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text()) or {}).get("ckpt_path")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    if not ckpt:
        return None
    ckpt = Path(str(ckpt))
    previous = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return previous if previous.is_dir() and previous.resolve() != run_dir.resolve() else None


def run_segments(run_dir: Path) -> list[Path]:
    """The run directories a run resumed (perhaps several times) is made of, oldest first."""
    segments = [run_dir]
    while (prev := resumed_from(segments[0])) and prev.resolve() not in [s.resolve() for s in segments]:
        segments.insert(0, prev)
    return segments


def _metric_files(run_dir: Path) -> list[Path]:
    if run_dir.is_file():  # a metrics.csv / summary.json passed directly
        return [run_dir]
    files: list[Path] = []
    for pattern in ("metrics.csv", "summary.json"):
        found = {p.resolve() for p in run_dir.rglob(pattern) if p.is_file()}  # latest-run is a symlink
        files += sorted(found, key=lambda p: (p.stat().st_mtime, str(p)))
    return files


def find_metrics(run_dir: str | Path) -> tuple[dict[str, Series], list[Path]]:
    """The curves and their files; curves["resumed_at"] holds the step each later segment resumed at."""
    run_dir = Path(run_dir).expanduser()
    if not run_dir.exists():
        raise MiniGPTError(f"run directory {run_dir} does not exist")
    curves: dict[str, Series] = {}
    summary_val: Series = {}
    used, summary_files, starts = [], [], []  # starts: the first step of each resumed segment
    for i, segment in enumerate([run_dir] if run_dir.is_file() else run_segments(run_dir)):
        steps: list[int] = []
        for path in _metric_files(segment):
            if path.suffix == ".csv":
                found = read_metrics_csv(path)
                for name, series in found.items():
                    curves.setdefault(name, {}).update(series)  # later files win on repeated steps
                    steps += series
                if found:
                    used.append(path)
            elif series := read_summary_val_curve(path):
                summary_val.update(series)
                summary_files.append(path)
                steps += series
        start = (read_json(segment / "summary.json") or {}).get("start_step")  # the resumed checkpoint's step
        start = start if isinstance(start, int) and not isinstance(start, bool) else None
        if i and (steps or start is not None):  # older runs without it: the first step logged
            starts.append(start if start is not None else min(steps))
    # summary.json has each evaluation's optimizer step (the CSV's can be one earlier), but only from a
    # finished process, for its own evaluations: use it when it is at least as complete as the CSV.
    if summary_val and len(summary_val) >= len(curves.get("val_loss", {})):
        curves["val_loss"] = summary_val
        used += summary_files
    if starts:
        curves["resumed_at"] = {step: 0.0 for step in starts}
    if not any(k in curves for k in ("train_loss", "val_loss")):
        raise MiniGPTError(
            f"no metrics found under {run_dir}: expected a CSVLogger metrics.csv (logger=csv or "
            "logger=wandb) or train.py's summary.json; pass the directory of a training run"
        )
    return curves, used


def _sorted(series: Series) -> tuple[list[int], list[float]]:
    steps = sorted(series)
    return steps, [series[s] for s in steps]


def _losses(ax: Axes, curves: dict[str, Series], data: dict[str, Any], **styles: dict[str, Any]) -> None:
    """The train and val loss curves there are, drawn in styles[name] and kept in data[name]."""
    for name, label in (("train_loss", "train"), ("val_loss", "val")):
        if curves.get(name):
            data[name] = _sorted(curves[name])
            ax.plot(*data[name], label=label, **styles[name])
    ax.set_ylabel("loss (nats/token)")


def reference_band(run_dir: Path) -> Band | None:
    """The reference band of the run's recipe, in the run's optimizer steps, when one matches its config."""
    found = run_reference(run_dir)
    if found is None:
        return None
    ref, tokens_per_step = found
    steps = [t / tokens_per_step for t in ref.tokens]
    halves = [ref.band(t)[1] for t in ref.tokens]  # type: ignore[index]
    return steps, ref.mean, halves, f"reference: {ref.name} ({ref.seeds} seeds, mean ± band)"


def plot_curves(
    curves: dict[str, Series], title: str = "", band: Band | None = None
) -> tuple[Figure, dict[str, Any]]:
    """Loss and learning rate against optimizer step; data = {name: (steps, values)} as drawn, and "axes".
    `band`: the recipe's reference band, drawn behind the val curve (data["band"])."""
    has_lr = bool(curves.get("lr"))
    fig, axes = plt.subplots(
        2 if has_lr else 1, 1, figsize=(8, 6.5) if has_lr else (8, 4), sharex=True, squeeze=False,
        layout="constrained",
    )  # fmt: skip
    axes = list(axes[:, 0])
    ax_loss = axes[0]
    data: dict[str, Any] = {}
    _losses(ax_loss, curves, data, train_loss=dict(lw=1, alpha=0.8), val_loss=dict(marker="o", ms=3, lw=1.5))
    if band is not None:
        steps, mean, half, label = band
        lower, upper = [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)]
        ax_loss.fill_between(steps, lower, upper, color="tab:orange", alpha=0.2, lw=0, label=label)
        ax_loss.plot(steps, mean, color="tab:orange", lw=1, ls="--")
    values = [v for _, vals in data.values() for v in vals]
    if values and min(values) > 0 and max(values) / min(values) > 4:
        ax_loss.set_yscale("log")  # early loss is much larger than late loss
        ax_loss.yaxis.set_major_formatter(ScalarFormatter())
        ax_loss.yaxis.set_minor_formatter(ScalarFormatter())
    if band is not None:
        data["band"] = (band[0], lower, upper)
    data["resumed_at"] = sorted(curves.get("resumed_at", {}))
    for step in data["resumed_at"]:
        for ax in axes:
            ax.axvline(step, color="gray", ls=":", lw=1)
        ax_loss.annotate(f"resumed at {step}", (step, 1.0), xycoords=("data", "axes fraction"),
                         fontsize=7, color="gray", rotation=90, ha="right", va="top")  # fmt: skip
    if "train_loss" not in data:
        # logger=none keeps only summary.json's evaluations: say why there is no train curve.
        ax_loss.plot([], [], " ", label=NO_TRAIN_LOSS)
    ax_loss.legend()
    ax_loss.grid(alpha=0.3, which="both")
    best = f"  (best val {min(data['val_loss'][1]):.4f})" if "val_loss" in data else ""
    if title or best:
        ax_loss.set_title(f"{title}{best}".strip(), fontsize=10)
    if has_lr:
        data["lr"] = _sorted(curves["lr"])
        axes[1].plot(*data["lr"], color="tab:green")
        axes[1].set_ylabel("learning rate")
        axes[1].grid(alpha=0.3)
    axes[-1].set_xlabel("optimizer step")
    data["axes"] = axes
    return fig, data


def _member_order(name: str) -> tuple[int, int]:
    """embedding, then block_0, block_1, ... (layers by number, not as text), then head."""
    digits = name[len(name.rstrip("0123456789")) :]
    return {"embedding": 0, "head": 2}.get(name, 1), int(digits) if digits else -1


def plot_health(curves: dict[str, Series], title: str = "") -> tuple[Figure, dict[str, Any]]:
    """The `health/` curves as small multiples, a panel per signal and a line per layer (a layer keeps its
    colour across panels); data = {column: (steps, values)} as drawn, and "axes"."""
    families = [f for f in HEALTH_PANELS if any(k.startswith(f"health/{f}/") for k in curves)]
    rows = -(-len(families) // 2)
    fig, grid = plt.subplots(rows, 2 if len(families) > 1 else 1, figsize=(11, 3.2 * rows + 0.4),
                             sharex=True, squeeze=False, layout="constrained")  # fmt: skip
    axes = list(grid.flat)
    data: dict[str, Any] = {}
    layers = max((_member_order(k.split("/")[-1])[1] for k in curves if k.startswith("health/")), default=0)
    colours = plt.get_cmap("viridis")
    for ax, family in zip(axes, families):
        prefix = f"health/{family}/"
        members = sorted((k[len(prefix) :] for k in curves if k.startswith(prefix)), key=_member_order)
        for member in members:
            rank, layer = _member_order(member)
            colour = {0: "tab:red", 2: "tab:gray"}.get(rank)  # embedding, head; layers along viridis
            if rank == 1 and layer >= 0:
                colour = colours(layer / max(layers, 1))
            data[prefix + member] = _sorted(curves[prefix + member])
            ax.plot(*data[prefix + member], label=member, lw=1, color=colour)
        for step in sorted(curves.get("resumed_at", {})):
            ax.axvline(step, color="gray", ls=":", lw=1)
        title_text, log = HEALTH_PANELS[family]
        ax.set_title(title_text, fontsize=10)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, ncol=2 if len(members) > 6 else 1)
    for ax in axes[len(families) :]:
        ax.set_visible(False)
    for ax in axes[-2:]:
        ax.set_xlabel("optimizer step")
    if title:
        fig.suptitle(title, fontsize=11)
    data["axes"] = axes[: len(families)]
    return fig, data


def plot_run(run_dir: str | Path, out: str | Path | None = None, dpi: int = 120) -> Path:
    """curves.png (or `out`), and the health page health.png beside it (`<out stem>_health.png` for an
    `out` given) when the log has `health/` columns."""
    run_dir = Path(run_dir).expanduser()
    curves, used = find_metrics(run_dir)
    run_root = run_dir.parent if run_dir.is_file() else run_dir  # a metrics file may be passed directly
    given = out is not None  # pages beside an `out` given are named after it: <out stem>_health.png
    health = run_root / "health.png" if out is None else Path(out).with_stem(f"{Path(out).stem}_health")
    out = Path(out) if out else run_root / "curves.png"
    band = reference_band(run_root)
    fig, _ = plot_curves(curves, title=run_root.name, band=band)
    save_figure(fig, out, dpi)
    written = [out]
    if any(name.startswith("health/") for name in curves):
        fig, _ = plot_health(curves, title=f"{run_root.name}: health")
        written.append(save_figure(fig, health, dpi))
    print(f"read {', '.join(str(p) for p in used)}\nwrote {', '.join(str(p) for p in written)}")
    if band is not None:
        print(f"band: {band[3]}")
    if roles := head_role_curves(used):
        fig, _ = plot_head_roles(curves, roles, title=run_root.name)
        page = out.with_stem(f"{out.stem}_head_roles") if given else run_root / "head_roles.png"
        print(f"wrote {save_figure(fig, page, dpi)}")
    if "train_loss" not in curves:
        print(f"note: {NO_TRAIN_LOSS}")
    return out


def head_role_curves(files: list[Path]) -> dict[str, Series]:
    """The best head's score per role ({role: {step: score}}) from the metrics CSVs, resumed runs joined."""
    roles: dict[str, Series] = {}
    for path in files:
        if path.suffix == ".csv":
            for role, series in read_metrics_csv(path, HEAD_ROLE_COLUMNS).items():
                roles.setdefault(role, {}).update(series)
    return roles


def plot_head_roles(
    curves: dict[str, Series], roles: dict[str, Series], title: str = ""
) -> tuple[Figure, dict[str, Any]]:
    """The loss above the best head's score per role, against the same steps: an induction head forming
    shows as a jump in the induction score where the loss bends. data = {name: (steps, values)} as drawn."""
    fig, (ax_loss, ax_roles) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, layout="constrained")
    data: dict[str, Any] = {}
    _losses(ax_loss, curves, data, train_loss=dict(ms=3, lw=1), val_loss=dict(marker="o", ms=3, lw=1))
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    if title:
        ax_loss.set_title(title, fontsize=10)
    for role, series in roles.items():
        data[role] = _sorted(series)
        ax_roles.plot(*data[role], marker=".", lw=1.5, label=role.replace("_", "-"))
    ax_roles.set(ylabel="best head's score", ylim=(0, 1), xlabel="optimizer step")
    ax_roles.legend()
    ax_roles.grid(alpha=0.3)
    data["axes"] = [ax_loss, ax_roles]
    return fig, data
