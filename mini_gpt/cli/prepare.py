"""`mini-gpt prepare [data=... key=value ...]`: tokenize a corpus without training, e.g.

    mini-gpt prepare data=fineweb_edu data.max_tokens=100000000   # e.g. on a login node
    mini-gpt prepare experiment=gpt2_124m_fineweb                # the data of a recipe

conf/prepare.yaml is train.yaml, so a training run with the same `data=...` finds the prepared files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mini_gpt.conf import run_tool
from mini_gpt.data import AnyDataConfig, ShardedCorpus, data_config, prepare


def summary(cfg: AnyDataConfig, progress: bool | None = None) -> str:
    """Prepare (or find and check) the token files of any `data=` config; returns a one-line summary."""
    c = prepare(cfg, progress=progress)
    train, val = (
        (f" in {len(c.train)} shard(s)", f" in {len(c.val)}") if isinstance(c, ShardedCorpus) else ("", "")
    )
    return (
        f"ready: {c.dir}: {c.train_tokens:,} train tokens{train}, {c.val_tokens:,} val tokens{val} "
        f"({c.dtype}, {c.tokenizer!r})"
    )


def _run(data: dict[str, Any]) -> None:
    print(summary(data_config(data)), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    """`mini-gpt prepare OVERRIDES`; `argv` default: the command line."""
    run_tool("prepare", _run, argv, node="data")
