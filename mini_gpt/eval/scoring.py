"""Log-likelihoods under a GPT, the primitives of every evaluation. Batches are right-padded (a causal model
cannot see padding at the end of a row); log-softmax in float32 whatever the model's dtype."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from mini_gpt.errors import MiniGPTError


@dataclass(frozen=True)
class Continuation:
    logprob: float  # summed, nats
    tokens: int
    is_greedy: bool


@dataclass(frozen=True)
class Window:
    """One forward pass: `ids` holds the inputs plus the target of the last position (len = inputs + 1);
    the targets of positions `first..len(ids)-2` are scored."""

    ids: Sequence[int]
    first: int
    doc: int
    begin: int = 0  # index of ids[0] in the scored sequence


def windows(ids: Sequence[int], block_size: int, stride: int, doc: int = 0) -> Iterator[Window]:
    """Every token but the first a target exactly once; the last window right-aligned (as lm-eval does)."""
    if not 1 <= stride <= block_size:
        raise MiniGPTError(f"stride={stride} must be between 1 and block_size={block_size}")
    n, scored_to, begin = len(ids), 0, 0  # targets ids[1..scored_to] are done
    while scored_to < n - 1:
        end = min(begin + block_size, n - 1)  # inputs ids[begin:end], targets ids[begin+1:end+1]
        if end == n - 1:  # the last window: right-aligned, so its targets see a whole block of context
            begin = max(0, end - block_size)
        yield Window(ids[begin : end + 1], first=scored_to - begin, doc=doc, begin=begin)
        scored_to = end
        begin += stride


@torch.inference_mode()
def _score(model: nn.Module, wins: Sequence[Window], batch_size: int) -> list[tuple[float, bool]]:
    """Per window, `batch_size` per forward pass: (summed NLL of its targets, all predicted greedily)."""
    device = next(model.parameters()).device
    out: list[tuple[float, bool]] = []
    for b in range(0, len(wins), batch_size):
        batch = wins[b : b + batch_size]
        rows = [torch.as_tensor(w.ids, dtype=torch.long) for w in batch]
        logits, _ = model(pad_sequence([r[:-1] for r in rows], batch_first=True).to(device))  # (B, T, V)
        counts = [len(w.ids) - 1 - w.first for w in batch]
        row_idx = torch.cat([torch.full((n,), i) for i, n in enumerate(counts)]).to(device)
        pos_idx = torch.cat([torch.arange(w.first, len(w.ids) - 1) for w in batch]).to(device)
        targets = torch.cat([r[w.first + 1 :] for r, w in zip(rows, batch, strict=True)]).to(device)
        picked = logits[row_idx, pos_idx].float()  # (N, V)
        nll = F.cross_entropy(picked, targets, reduction="none")
        greedy = picked.argmax(dim=-1) == targets
        sums = torch.stack([part.sum() for part in nll.split(counts)]).tolist()  # one sync per batch
        out += zip(sums, torch.stack([g.all() for g in greedy.split(counts)]).tolist(), strict=True)
    return out


def continuation_logprobs(
    model: nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 16
) -> list[Continuation]:
    """A too-long context is cut from the left; a continuation longer than block_size is scored by sliding
    windows of stride block_size // 2 over it and the last half block of its context."""
    block_size = model.config.block_size
    half = max(1, block_size // 2)
    short, long = [], []
    for i, (context, continuation) in enumerate(pairs):
        if not context or not continuation:
            raise MiniGPTError("continuation_logprobs needs a non-empty context ([eot_id]) and continuation")
        if len(continuation) <= block_size:
            full = [*context, *continuation][-(block_size + 1) :]
            short.append(Window(full, len(full) - 1 - len(continuation), doc=i))
            continue
        start = max(0, len(context) - half)
        first_target = len(context) - start  # index of the first continuation token in the windowed ids
        for w in windows([*context[start:], *continuation], block_size, half, doc=i):
            # position p predicts ids[begin + p + 1]: score continuation tokens only
            long.append(Window(w.ids, max(w.first, first_target - 1 - w.begin), i))
    logprob, greedy = [0.0] * len(pairs), [True] * len(pairs)
    for wins, size in ((short, batch_size), (long, 1)):
        for w, (nll, is_greedy) in zip(wins, _score(model, wins, size), strict=True):
            logprob[w.doc] -= nll
            greedy[w.doc] = greedy[w.doc] and is_greedy
    return [Continuation(lp, len(c), g) for lp, g, (_, c) in zip(logprob, greedy, pairs, strict=True)]


@dataclass
class RollingScore:
    nll: float = 0.0  # summed negative log-likelihood, nats
    tokens: int = 0  # scored tokens
    context: int = 0  # summed context length of the scored tokens
    min_context: int | None = None

    @property
    def context_per_token(self) -> float:
        return self.context / self.tokens if self.tokens else 0.0


def score_windows(
    model: nn.Module, wins: Sequence[Window], batch_size: int = 16, per_doc: bool = False
) -> tuple[RollingScore, list[float]]:
    total = RollingScore()
    doc_nll: list[float] = [0.0] * (max((w.doc for w in wins), default=-1) + 1) if per_doc else []
    ordered = sorted(wins, key=lambda w: len(w.ids))  # equal lengths batch best (most are block_size)
    for w, (nll, _) in zip(ordered, _score(model, ordered, batch_size), strict=True):
        n = len(w.ids) - 1 - w.first
        total.nll += nll
        total.tokens += n
        # position p predicts with p + 1 tokens of context: sum over p = first..first+n-1
        total.context += n * (w.first + 1) + n * (n - 1) // 2
        total.min_context = min(total.min_context or w.first + 1, w.first + 1)
        if per_doc:
            doc_nll[w.doc] += nll
    return total, doc_nll


def rolling_nll(
    model: nn.Module, ids: Sequence[int], stride: int | None = None, batch_size: int = 16
) -> RollingScore:
    block_size = model.config.block_size
    wins = list(windows(ids, block_size, stride or max(1, block_size // 2)))
    return score_windows(model, wins, batch_size)[0]
