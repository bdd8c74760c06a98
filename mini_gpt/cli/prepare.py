"""`mini-gpt prepare [data=... key=value ...]`: tokenize a corpus without training (conf/prepare.yaml)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mini_gpt.conf import run_tool
from mini_gpt.data import ShardedCorpus, data_config, prepare


def _run(data: dict[str, Any]) -> None:
    c = prepare(data_config(data))
    sharded = isinstance(c, ShardedCorpus)
    train, val = (f" in {len(c.train)} shard(s)", f" in {len(c.val)}") if sharded else ("", "")
    print(f"ready: {c.dir}: {c.train_tokens:,} train tokens{train}, {c.val_tokens:,} val tokens{val} "
          f"({c.dtype}, {c.tokenizer!r})", flush=True)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    run_tool("prepare", _run, argv, node="data")
