"""`mini-gpt compare runs=[DIR,...]` (or `mini-gpt compare DIR...`): one table and the curves of runs."""

from __future__ import annotations

import glob
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from mini_gpt.conf import run_tool, split_free_text
from mini_gpt.conf.tools import SCALING_PARAMS, CompareConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.viz import compare as viz


def compare(cfg: CompareConfig) -> None:
    # Quoted globs expand here; a pattern matching nothing stays (and is refused).
    paths = [path for run in cfg.runs for path in sorted(glob.glob(run)) or [run]]
    if not paths:
        raise MiniGPTError("name the runs: mini-gpt compare DIR... or runs=[DIR,...] (globs work)")
    header, rows, ordered, keys = viz.compare_table(viz.find_runs(paths))
    out = Path(cfg.out or (paths[0] if len(paths) == 1 and Path(paths[0]).is_dir() else "compare"))
    files = viz.write_report(header, rows, ordered, keys, out)
    print(viz.markdown(header, rows))
    print(f"\n{len(rows)} runs; table: {files['csv']}, report: {files['html']}, curves: {files['png']}")
    if groups := viz.seed_groups(ordered, keys):
        print("\nover seeds (completed runs; std: the sample standard deviation):")
        print(viz.markdown(*viz.seeds_table(groups)))
    if cfg.scaling:
        fit = viz.scaling_fit(ordered, SCALING_PARAMS[cfg.params])
        viz.plot_scaling(ordered, fit, out / "scaling.png")
        print(f"\nisoFLOP optima ({fit.params_key}):")
        for budget, n_opt, loss in fit.minima:
            print(f"  C={budget:.3g} FLOPs: N_opt={n_opt:,.0f}, loss {loss:.4f}, "
                  f"D_opt={budget / (6 * n_opt):,.0f} tokens")  # fmt: skip
        if fit.exponent is not None:
            print(f"power law: N_opt = {fit.coefficient:.4g} * C^{fit.exponent:.3f}")
        print(f"plot: {out / 'scaling.png'}")


def arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(overrides, run folders: arguments without `=` or existing paths); --scaling, --out, --params work."""
    keyed, paths = [], []
    args = iter(argv)
    for arg in args:
        flag, eq, value = arg.partition("=")
        if arg == "--scaling":
            keyed.append("scaling=true")
        elif flag in ("--out", "--params"):
            keyed.append(f"{flag[2:]}={value if eq else next(args, '')}")
        elif not arg.startswith("-") and (not eq or Path(arg).exists()):
            paths.append(arg)
        else:
            keyed.append(arg)
    return keyed, paths


def main(argv: Sequence[str] | None = None) -> int:
    keyed, paths = arguments(sys.argv[1:] if argv is None else argv)
    overrides, out = split_free_text(keyed, ("out",))  # a path, verbatim
    run_tool("compare", lambda cfg: compare(replace(cfg, runs=[*cfg.runs, *paths], **out)), overrides)
    return 0
