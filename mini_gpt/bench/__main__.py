"""`mini-gpt bench {attention,train,generate,data,serve,all} [--json out.json] [section options]` (alias
`python -m mini_gpt.bench ...`). The one verb of mini-gpt with argparse flags rather than Hydra overrides:
each section's options are its own `--flags`.

Each section is a module of this package with `add_arguments(parser)` and `run(args) -> (rows, extra)`;
the flags several sections take are defined once, in `common.SHARED_FLAGS`, and this dispatcher applies
`--threads` (restoring torch's count after the section). Only the section asked for is imported (train
pulls in Lightning, ~5 s), and a section whose module is missing or broken is reported without stopping
the others under `all`. Every table is followed by the load other processes put on the machine meanwhile
(`other_load`, in cores; also in the JSON with `wall_s` and `machine`): numbers measured under load are
slower than the machine can do.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import Any

import torch

from mini_gpt.bench.common import BenchParser, machine_info, print_table, write_json
from mini_gpt.errors import MiniGPTError
from mini_gpt.machine import LoadMeter

SECTIONS = (
    "attention",
    "train",
    "generate",
    "data",
    "attention_maps",
    "evaluate",
    "validation",
    "serve",
    "tokenizer_train",
    "sweep",
    "gpu",
)
# minutes each (100 MB of text, whole sweeps, every GPU path): run on their own
NOT_IN_ALL = ("tokenizer_train", "sweep", "gpu")


def load_section(name: str) -> ModuleType:
    """The section's module; raises ImportError with a clear message when it is unavailable."""
    try:
        module = importlib.import_module(f"mini_gpt.bench.{name}")
    except ImportError as err:
        raise ImportError(f"benchmark section {name!r} is unavailable ({err})") from err
    for attr in ("add_arguments", "run"):
        if not hasattr(module, attr):
            raise ImportError(f"benchmark section {name!r} has no {attr}()")
    return module


def section_parser(name: str, module: ModuleType) -> argparse.ArgumentParser:
    # The docstring's first paragraph (which may wrap over several lines), as one sentence.
    summary = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
    parser = BenchParser(prog=f"mini-gpt bench {name}", description=summary or None)
    module.add_arguments(parser)
    return parser


def run_section(
    name: str, module: ModuleType, args: argparse.Namespace, json_path: str | None
) -> dict[str, Any]:
    threads = torch.get_num_threads()
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    try:
        with LoadMeter() as load:
            rows, extra = module.run(args)
        extra = {"machine": machine_info(), **extra}  # while the section's threads are set
    finally:
        torch.set_num_threads(threads)
    # a section's own figures win
    extra = {"other_load": round(load.other_load, 2), "wall_s": round(load.wall, 1), **extra}
    extra["args"] = {
        k: v for k, v in vars(args).items() if isinstance(v, str | int | float | bool | type(None))
    }
    print_table(name, rows)
    print(f"{name}: other_load={extra['other_load']:.2f} cores (other processes), {extra['wall_s']:.1f} s")
    if json_path:
        write_json(json_path, name, rows, extra)
    return {"rows": rows, **extra}


def _print_machine() -> None:
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine_info().items()))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = BenchParser(
        prog="mini-gpt bench",
        description="Benchmarks; `mini-gpt bench SECTION --help` lists a section's options.",
        add_help=False,  # --help after SECTION belongs to the section's parser
    )
    top.add_argument("section", choices=(*SECTIONS, "all"))
    top.add_argument("--json", default=None, help="merge results (with machine info) into this JSON file")
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0 if argv else 2
    top_args, rest = top.parse_known_args(argv)

    if top_args.section != "all":
        try:
            module = load_section(top_args.section)
        except ImportError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        args = section_parser(top_args.section, module).parse_args(rest)
        _print_machine()
        try:
            run_section(top_args.section, module, args, top_args.json)
        except MiniGPTError as err:  # a mistake a section finds in its options: one line
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0

    _print_machine()
    # all: every section with its defaults; options in `rest` go to the sections that know them.
    failed, unused = [], set(a for a in rest if a.startswith("-"))
    for name in (s for s in SECTIONS if s not in NOT_IN_ALL):
        try:
            module = load_section(name)
        except ImportError as err:
            print(f"\n## {name}\nskipped: {err}", file=sys.stderr)
            failed.append(name)
            continue
        args, unknown = section_parser(name, module).parse_known_args(rest)
        unused &= set(unknown)
        try:
            run_section(name, module, args, top_args.json)
        except Exception as err:  # one broken section must not cost the others' results
            print(f"\n## {name}\nfailed: {type(err).__name__}: {err}", file=sys.stderr)
            failed.append(name)
    if unused:
        print(f"warning: no section used {sorted(unused)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
