"""Log-likelihoods of text under a GPT: the two primitives every evaluation is built from.

- `continuation_logprobs(model, pairs)`: for (context ids, continuation ids) pairs, the summed
  log-probability of the continuation, its token count and whether greedy decoding gives it. Pairs are
  right-padded into batches (a causal model cannot see padding at the end of a row).
- `rolling_nll(model, ids, stride)` / `score_windows`: the NLL of every token of a sequence of any length,
  by windows of `block_size` tokens moving `stride` at a time, each scoring only the tokens the previous
  one did not (every token is predicted once, the last window right-aligned as lm-evaluation-harness does).

Everything runs under `torch.inference_mode()` in float32 log-softmax, whatever the model's dtype.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mini_gpt.errors import MiniGPTError

__all__ = ["Continuation", "RollingScore", "continuation_logprobs", "rolling_nll", "score_windows", "windows"]


@dataclass(frozen=True)
class Continuation:
    """Score of one continuation: summed log-probability (nats), token count, greedy match."""

    logprob: float
    tokens: int
    is_greedy: bool


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _pack(rows: Sequence[Sequence[int]], device: torch.device) -> Tensor:
    """Right-padded (B, T) long tensor of the rows (padding id 0, never scored)."""
    T = max(len(r) for r in rows)
    out = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out.to(device)


@torch.inference_mode()
def continuation_logprobs(
    model: nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 16
) -> list[Continuation]:
    """Score `continuation` after `context` for every pair, `batch_size` rows per forward pass. The context
    must not be empty (pass [eot_id] for none); a too-long context is cut from the left; a continuation
    longer than block_size is scored by sliding windows keeping half a block of context."""
    block_size = model.config.block_size
    device = _device(model)
    short = []  # indices of the pairs that fit one forward pass
    for i, (context, continuation) in enumerate(pairs):
        if not context:
            raise MiniGPTError("continuation_logprobs needs a non-empty context (e.g. [eot_id])")
        if not continuation:
            raise MiniGPTError("continuation_logprobs got an empty continuation")
        if len(continuation) <= block_size:
            short.append(i)
    results: dict[int, Continuation] = {
        i: _score_long(model, *pairs[i]) for i in range(len(pairs)) if len(pairs[i][1]) > block_size
    }
    for b in range(0, len(short), batch_size):
        batch = short[b : b + batch_size]
        rows, spans = [], []  # model inputs, and (first scored input position, continuation length)
        for i in batch:
            context, continuation = pairs[i]
            full = [*context, *continuation][-(block_size + 1) :]
            rows.append(full[:-1])  # the last token is only a target
            spans.append((len(full) - 1 - len(continuation), len(continuation)))
        logits, _ = model(_pack(rows, device))  # (B, T, V)
        # Gather the positions that predict continuation tokens: row r, positions start..start+n-1.
        row_idx = torch.cat([torch.full((n,), r) for r, (_, n) in enumerate(spans)]).to(device)
        pos_idx = torch.cat([torch.arange(s, s + n) for s, n in spans]).to(device)
        targets = torch.cat([torch.as_tensor(pairs[i][1], dtype=torch.long) for i in batch]).to(device)
        picked = logits[row_idx, pos_idx].float()  # (N, V)
        logp = -F.cross_entropy(picked, targets, reduction="none")  # (N,)
        greedy = picked.argmax(dim=-1) == targets  # (N,)
        counts = [n for _, n in spans]
        for i, lp, gr, n in zip(batch, logp.split(counts), greedy.split(counts), counts, strict=True):
            results[i] = Continuation(float(lp.sum()), n, bool(gr.all()))
    return [results[i] for i in range(len(pairs))]


def _score_long(model: nn.Module, context: Sequence[int], continuation: Sequence[int]) -> Continuation:
    """A continuation longer than block_size: sliding windows (stride block_size // 2) over the
    continuation and the last half block of the context, scoring only continuation tokens."""
    block_size = model.config.block_size
    device = _device(model)
    half = max(1, block_size // 2)
    start = max(0, len(context) - half)
    ids = [*context[start:], *continuation]
    first_target = len(context) - start  # index in ids of the first continuation token
    logprob, greedy = 0.0, True
    for w in windows(ids, block_size, half):
        first = max(w.first, first_target - 1 - w.begin)  # position p predicts ids[begin + p + 1]
        if first > len(w.ids) - 2:
            continue
        logits = model(torch.as_tensor([w.ids[:-1]], device=device))[0][0, first:].float()  # (n, V)
        targets = torch.as_tensor(w.ids[first + 1 :], device=device)
        logprob -= float(F.cross_entropy(logits, targets, reduction="sum"))
        greedy = greedy and bool((logits.argmax(dim=-1) == targets).all())
    return Continuation(logprob, len(continuation), greedy)


@dataclass(frozen=True)
class Window:
    """One forward pass of a sliding-window score: `ids` holds the window's tokens plus the target of its
    last position (len = inputs + 1); the targets of positions `first..len(ids)-2` are scored."""

    ids: Sequence[int]
    first: int
    doc: int
    begin: int = 0  # index of ids[0] in the scored sequence


def windows(ids: Sequence[int], block_size: int, stride: int, doc: int = 0) -> Iterator[Window]:
    """Sliding windows over `ids`: every token but the first is a target exactly once. Window k starts at
    k * stride, holds block_size inputs and scores the targets after the previous window's; the last one
    is right-aligned to the last token (as lm-evaluation-harness does)."""
    if not 1 <= stride <= block_size:
        raise MiniGPTError(f"stride={stride} must be between 1 and block_size={block_size}")
    n = len(ids)
    scored_to = 0  # targets ids[1..scored_to] are done
    begin = 0
    while scored_to < n - 1:
        end = min(begin + block_size, n - 1)  # inputs ids[begin:end], targets ids[begin+1:end+1]
        if end == n - 1:  # the last window: right-aligned, so its targets see a whole block of context
            begin = max(0, end - block_size)
        yield Window(ids[begin : end + 1], first=scored_to - begin, doc=doc, begin=begin)
        scored_to = end
        begin += stride


@dataclass
class RollingScore:
    """Totals of a rolling (sliding-window) score."""

    nll: float = 0.0  # summed negative log-likelihood, nats
    tokens: int = 0  # scored tokens
    context: int = 0  # summed context length of the scored tokens (context per token = context / tokens)
    min_context: int | None = None

    @property
    def context_per_token(self) -> float:
        return self.context / self.tokens if self.tokens else 0.0


@torch.inference_mode()
def score_windows(
    model: nn.Module, wins: Sequence[Window], batch_size: int = 16, per_doc: bool = False
) -> tuple[RollingScore, list[float]]:
    """Sum the scored targets' NLL over all windows (batched); with `per_doc`, also NLL per document."""
    device = _device(model)
    total = RollingScore()
    doc_nll: list[float] = [0.0] * (max((w.doc for w in wins), default=-1) + 1) if per_doc else []
    # Equal lengths batch best: sort by length (windows are mostly block_size long).
    order = sorted(range(len(wins)), key=lambda i: len(wins[i].ids))
    for b in range(0, len(order), batch_size):
        batch = [wins[i] for i in order[b : b + batch_size]]
        logits, _ = model(_pack([w.ids[:-1] for w in batch], device))  # (B, T, V)
        row_idx = torch.cat([torch.full((len(w.ids) - 1 - w.first,), i) for i, w in enumerate(batch)])
        pos_idx = torch.cat([torch.arange(w.first, len(w.ids) - 1) for w in batch])
        targets = torch.cat([torch.as_tensor(w.ids[w.first + 1 :], dtype=torch.long) for w in batch])
        nll = F.cross_entropy(
            logits[row_idx.to(device), pos_idx.to(device)].float(), targets.to(device), reduction="none"
        )  # (N,)
        counts = [len(w.ids) - 1 - w.first for w in batch]
        sums = torch.stack([part.sum() for part in nll.split(counts)]).tolist()  # one sync per batch
        for w, s, n in zip(batch, sums, counts, strict=True):
            total.nll += s
            total.tokens += n
            # position p predicts with p + 1 tokens of context: sum over p = first..first+n-1
            total.context += n * (w.first + 1) + n * (n - 1) // 2
            total.min_context = min(total.min_context or w.first + 1, w.first + 1)
            if per_doc:
                doc_nll[w.doc] += s
    return total, doc_nll


def rolling_nll(
    model: nn.Module, ids: Sequence[int], stride: int | None = None, batch_size: int = 16
) -> RollingScore:
    """NLL of ids[1:] given everything before, by sliding windows of block_size moving `stride` tokens."""
    block_size = model.config.block_size
    stride = stride or max(1, block_size // 2)
    return score_windows(model, list(windows(ids, block_size, stride)), batch_size)[0]
