"""`mini-gpt compare PATH... [--out DIR] [--scaling] [--params non_embedding|total]`: one table of runs
(a run folder, a `python train.py -m` multirun folder, a `mini-gpt sweep` folder, globs; any mix), printed
as markdown and written with the validation curves to DIR/compare.{csv,html,png}. `--scaling` also fits
loss against model size per compute budget (runs trained with trainer.max_flops) and writes
DIR/scaling.png. See docs/sweeps.md.
"""

from __future__ import annotations

import argparse
import glob
import sys
from collections.abc import Sequence
from pathlib import Path

from mini_gpt.errors import exit_on_user_error
from mini_gpt.viz.compare import (
    compare_table,
    find_runs,
    markdown,
    plot_scaling,
    scaling_fit,
    write_report,
)

PARAMS = {"non_embedding": "non_embedding_params", "total": "params"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mini-gpt compare", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help="run, multirun or sweep folders (globs work)"
    )
    parser.add_argument("--out", help="folder for compare.csv/.html/.png (default: the one PATH's folder, "
                        "else ./compare)")  # fmt: skip
    parser.add_argument("--scaling", action="store_true", help="fit loss vs parameters per FLOP budget")
    parser.add_argument("--params", choices=sorted(PARAMS), default="non_embedding",
                        help="parameter count of the scaling fit (default: non_embedding)")  # fmt: skip
    return parser


def _expand(paths: list[str]) -> list[str]:
    """Globs the shell left alone (quoted) expand here; a pattern matching nothing stays (and is refused)."""
    out: list[str] = []
    for path in paths:
        out += sorted(glob.glob(path)) if glob.has_magic(path) and glob.glob(path) else [path]
    return out


def compare(args: argparse.Namespace) -> None:
    paths = _expand(args.paths)
    runs = find_runs(paths)
    header, rows, ordered, keys = compare_table(runs)
    if args.out:
        out = Path(args.out)
    elif len(paths) == 1 and Path(paths[0]).is_dir():
        out = Path(paths[0])
    else:
        out = Path("compare")
    files = write_report(header, rows, ordered, keys, out)
    print(markdown(header, rows))
    print(f"\n{len(rows)} runs; table: {files['csv']}, report: {files['html']}, curves: {files['png']}")
    if args.scaling:
        fit = scaling_fit(ordered, PARAMS[args.params])
        plot_scaling(ordered, fit, out / "scaling.png")
        print(f"\nisoFLOP optima ({fit.params_key}):")
        for budget, n_opt, loss in fit.minima:
            print(
                f"  C={budget:.3g} FLOPs: N_opt={n_opt:,.0f}, loss {loss:.4f}, "
                f"D_opt={budget / (6 * n_opt):,.0f} tokens"
            )
        if fit.exponent is not None:
            print(f"power law: N_opt = {fit.coefficient:.4g} * C^{fit.exponent:.3f}")
        print(f"plot: {out / 'scaling.png'}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    exit_on_user_error(compare)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
