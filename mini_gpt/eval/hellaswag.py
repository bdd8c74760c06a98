"""HellaSwag, completion style as in build-nanogpt and llm.c, not the harness's (docs/evaluation.md)."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
from torch import nn

from mini_gpt.data.sources import download
from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.scoring import continuation_logprobs
from mini_gpt.tokenizer import Tokenizer

HELLASWAG_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
HELLASWAG_VAL_ITEMS = 10_042


@dataclass(frozen=True)
class HellaSwagItem:
    ctx: str
    endings: tuple[str, ...]
    label: int


@dataclass
class HellaSwagResult:
    correct: int = 0
    correct_norm: int = 0
    n: int = 0

    @property
    def acc(self) -> float:
        return self.correct / self.n if self.n else 0.0

    @property
    def acc_norm(self) -> float:
        return self.correct_norm / self.n if self.n else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"acc": self.acc, "acc_norm": self.acc_norm, "n": self.n}


def _parse(line: str, where: str) -> HellaSwagItem:
    try:
        row = json.loads(line)
        item = HellaSwagItem(str(row["ctx"]), tuple(str(e) for e in row["endings"]), int(row["label"]))
    except (ValueError, KeyError, TypeError) as err:
        raise MiniGPTError(
            f"{where} is not a HellaSwag item ({type(err).__name__}: {err}); each line needs "
            '{"ctx": str, "endings": [4 strings], "label": 0-3}'
        ) from None
    if len(item.endings) != 4 or not 0 <= item.label < 4:
        raise MiniGPTError(f"{where}: a HellaSwag item needs 4 endings and a label 0-3")
    return item


def read_hellaswag(
    path: str | Path, limit: int | None = None, key: str = "hellaswag.path"
) -> list[HellaSwagItem]:
    """`key` is the setting the user gives the path with, for the error lines."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise MiniGPTError(f"{key}={path} does not exist; pass the path of hellaswag_val.jsonl")
    with open(path, encoding="utf-8") as fh:
        lines = ((i, line) for i, line in enumerate(fh, 1) if line.strip())
        items = [_parse(line, f"{path}:{i}") for i, line in islice(lines, limit)]
    if not items:
        raise MiniGPTError(f"{key}={path} holds no items")
    return items


def resolve_hellaswag_path(
    path: str | None, cache_dir: Path, url: str = HELLASWAG_URL, key: str = "hellaswag.path"
) -> Path:
    if path:
        return Path(path).expanduser()
    dest = cache_dir / "hellaswag_val.jsonl"
    if dest.is_file():
        return dest
    hint = f"download {url} where there is network and pass {key}=FILE (or put it at {dest})"
    if os.environ.get("HF_DATASETS_OFFLINE") not in (None, "", "0"):
        raise MiniGPTError(f"HellaSwag is not cached and HF_DATASETS_OFFLINE is set; {hint}")

    def verify(file: Path) -> None:  # a truncated or foreign file fails here, before it is cached
        if (n_items := len(read_hellaswag(file))) != HELLASWAG_VAL_ITEMS:
            raise MiniGPTError(f"download of {url} has {n_items} items, not {HELLASWAG_VAL_ITEMS}")

    print(f"downloading {url} -> {dest}", file=sys.stderr)
    try:
        return download(url, dest, None, verify=verify)
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        raise MiniGPTError(f"cannot download HellaSwag ({type(err).__name__}: {err}); {hint}") from None


def load_hellaswag(
    path: str | None, cache_dir: Path, limit: int | None = None, key: str = "hellaswag.path"
) -> list[HellaSwagItem]:
    return read_hellaswag(resolve_hellaswag_path(path, cache_dir, key=key), limit, key)


def item_scores(
    model: nn.Module, tokenizer: Tokenizer, items: Sequence[HellaSwagItem], batch_items: int = 4
) -> Iterator[tuple[list[float], list[int]]]:
    """Per item: (summed log-likelihood of each ending, its token count)."""
    for b in range(0, len(items), batch_items):
        pairs = []
        for item in items[b : b + batch_items]:
            ctx = tokenizer.encode(tokenizer.known_text(item.ctx))
            endings = [tokenizer.encode(tokenizer.known_text(" " + e)) for e in item.endings]
            if not ctx or not all(endings):
                raise MiniGPTError(f"HellaSwag item {item.ctx[:50]!r} encodes to an empty context or ending")
            pairs.extend((ctx, e) for e in endings)
        scores = continuation_logprobs(model, pairs, batch_size=len(pairs))
        for i in range(0, len(scores), 4):
            group = scores[i : i + 4]
            yield [s.logprob for s in group], [s.tokens for s in group]


def evaluate_hellaswag(
    model: nn.Module, tokenizer: Tokenizer, items: Sequence[HellaSwagItem], batch_items: int = 4,
    progress: bool | None = None,
) -> HellaSwagResult:  # fmt: skip
    result = HellaSwagResult()
    shown = sys.stderr.isatty() if progress is None else progress
    with Progress(
        "hellaswag", BarColumn(), MofNCompleteColumn(), "acc_norm {task.fields[acc]:.4f}",
        TimeRemainingColumn(), disable=not shown, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("hellaswag", total=len(items), acc=0.0)
        for item, (logprobs, counts) in zip(items, item_scores(model, tokenizer, items, batch_items)):
            result.n += 1
            result.correct += int(np.argmax(logprobs) == item.label)
            result.correct_norm += int(np.argmax(np.divide(logprobs, counts)) == item.label)
            bar.update(task, advance=1, acc=result.acc_norm)
    return result
