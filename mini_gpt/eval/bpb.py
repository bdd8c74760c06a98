"""Bits per byte, independent of the tokenizer: total NLL (nats) / ln 2 / UTF-8 bytes (docs/evaluation.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from mini_gpt.data import data_config, prepare
from mini_gpt.data.shards import open_shard
from mini_gpt.data.sources import text_files
from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.scoring import RollingScore, Window, score_windows, windows
from mini_gpt.tokenizer import Tokenizer


@dataclass
class BpbResult:
    nll: float  # nats, summed over scored tokens
    tokens: int
    bytes: int
    context_per_token: float
    min_context: int
    stride: int
    documents: int

    @property
    def loss(self) -> float:  # mean NLL per token (nats)
        return self.nll / self.tokens if self.tokens else float("nan")

    @property
    def bits_per_byte(self) -> float:
        return self.nll / math.log(2) / self.bytes if self.bytes else float("nan")

    def to_dict(self) -> dict[str, Any]:
        metrics = {"bits_per_byte": self.bits_per_byte, "loss": self.loss, "perplexity": math.exp(self.loss)}
        return metrics | {k: v for k, v in asdict(self).items() if k != "nll"}


def read_documents(path: str | Path) -> list[str]:
    docs = []
    for f in text_files(str(path), "bpb.path"):
        try:
            docs.append(f.read_text(encoding="utf-8-sig"))
        except UnicodeDecodeError as err:
            raise MiniGPTError(f"{f} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not (docs := [d for d in docs if d]):
        raise MiniGPTError(f"bpb.path={path} holds no text")
    return docs


def split_documents(prepared: Any, split: str) -> list[str]:
    if not (shards := getattr(prepared, split)):
        raise MiniGPTError(f"the prepared corpus has no {split} shards")
    ids = np.concatenate([np.asarray(open_shard(info)) for info in shards])
    return prepared_split_documents(ids.tolist(), prepared.tokenizer)


def prepare_split(data: dict[str, Any], split: str, progress: bool | None = None) -> tuple[list[str], str]:
    """(documents, description) of a split of the corpus `data` (a `data=` mapping), prepared if needed."""
    cfg = data_config(dict(data))
    return split_documents(prepare(cfg, progress=progress), split), f"{cfg.name}:{split}"


def prepared_split_documents(ids: Sequence[int], tokenizer: Tokenizer) -> list[str]:
    eot = tokenizer.eot_id
    pieces = groupby(ids, key=lambda t: t == eot)
    return [text for is_eot, doc in pieces if not is_eot and (text := tokenizer.decode(list(doc)))]


@dataclass
class BpbWindows:
    windows: list[Window]
    bytes: int  # UTF-8 bytes of the text the windows score
    stride: int
    documents: int
    source: str = ""  # where the documents came from: a path, or corpus:split


def bpb_windows(
    tokenizer: Tokenizer, documents: Sequence[str], block_size: int, stride: int | None = None,
    source: str = "",
) -> BpbWindows:  # fmt: skip
    """Sliding windows of `block_size` moving `stride` (None = block_size // 2) over every document; with an
    end-of-text id before each, every document token is predicted (as lm-evaluation-harness does)."""
    stride = stride or max(1, block_size // 2)
    wins: list[Window] = []
    n_bytes, eot = 0, tokenizer.eot_id
    for d, text in enumerate(documents):
        ids = tokenizer.encode_ordinary(text)  # special-token text stays text
        if eot is not None:
            ids = [eot, *ids]  # every document token is predicted
            n_bytes += len(text.encode("utf-8"))
        elif len(ids) > 1:  # the first token is context only: its bytes are not scored
            n_bytes += len(text.encode("utf-8")) - len(tokenizer.decode(ids[:1]).encode("utf-8"))
        wins.extend(windows(ids, block_size, stride, doc=d))
    if not wins:
        raise MiniGPTError("the text is too short to score (it needs at least 2 tokens)")
    return BpbWindows(wins, n_bytes, stride, len(documents), source)


def score_bpb(model: nn.Module, cut: BpbWindows, batch_size: int = 16) -> BpbResult:
    """NLL and token counts (which add up over devices' shares) of the windows."""
    score: RollingScore = score_windows(model, cut.windows, batch_size)[0]
    return BpbResult(
        score.nll, score.tokens, cut.bytes, score.context_per_token, score.min_context or 0, cut.stride,
        cut.documents,
    )  # fmt: skip


def bits_per_byte(
    model: nn.Module, tokenizer: Tokenizer, documents: Sequence[str], stride: int | None = None,
    batch_size: int = 16,
) -> BpbResult:  # fmt: skip
    return score_bpb(model, bpb_windows(tokenizer, documents, model.config.block_size, stride), batch_size)
