"""`mini-gpt <verb> [args]`: imports only the verb's module (so `mini-gpt generate` never loads Lightning)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

VERBS: dict[str, tuple[str, str]] = {
    "train": ("mini_gpt.cli.train", "train a model (= python train.py; Hydra: -m sweeps, --cfg job work)"),
    "generate": ("mini_gpt.cli.generate", "sample text from a checkpoint, an export or GPT-2"),
    "evaluate": ("mini_gpt.cli.evaluate", "bits per byte, HellaSwag and lm-eval tasks of a model"),
    "export": ("mini_gpt.cli.export", "a checkpoint to safetensors, a transformers GPT-2 directory or GGUF"),
    "prepare": ("mini_gpt.cli.prepare", "tokenize a corpus (train's data=... overrides) without training"),
    "tokenizer": ("mini_gpt.cli.tokenizer", "train your own BPE or judge one: tokenizer train|eval ..."),
    "plot": ("mini_gpt.cli.plot", "a run's loss and learning-rate curves to a PNG: plot RUN_DIR"),
    "attention-maps": ("mini_gpt.cli.attention_maps", "draw a model's attention maps for a prompt"),
    "inspect": ("mini_gpt.cli.inspect", "logit lens, head roles, ablations, activation patching of a model"),
    "compare": ("mini_gpt.cli.compare", "one table + curves of runs: compare runs=[DIR,...] [scaling=true]"),
    "sweep": ("mini_gpt.cli.sweep", "Optuna search: sweep hparams_search=NAME [key=value ...]"),
    "serve": ("mini_gpt.cli.serve", "a local playground page + OpenAI-compatible API: serve ckpt=PATH"),
    "bench": ("mini_gpt.bench.__main__", "benchmarks: bench SECTION [--flags] (argparse, not overrides)"),
    "harness": ("mini_gpt.cli.harness", "lm-evaluation-harness with the mini-gpt model (lm_eval's flags)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        width = max(map(len, VERBS))
        print("usage: mini-gpt <verb> [key=value ...]    (mini-gpt <verb> --help lists the verb's keys)\n")
        print("verbs:", *(f"  {verb:<{width}}  {about}" for verb, (_, about) in VERBS.items()), sep="\n")
        return 0
    verb, rest = args[0], args[1:]
    if verb not in VERBS:
        print(f"error: unknown verb {verb!r}; the verbs are {', '.join(VERBS)}", file=sys.stderr)
        return 2
    # For a verb that reads sys.argv (Hydra, lm_eval); argv[0] names the command, e.g. in the resume hint.
    sys.argv = [f"mini-gpt {verb}", *rest]
    status = importlib.import_module(VERBS[verb][0]).main(rest)
    return status if isinstance(status, int) else 0  # a verb may return its result (generate: the samples)
