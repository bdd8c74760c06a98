"""Activation patching: which (layer, position) of the residual stream carries the answer? The clean run's
stream copied into the corrupted run at one place; recovered = (patched - corrupted) / (clean - corrupted)
of the last position's logit difference (docs/inspect.md#activation-patching)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mini_gpt.infer.sampling import eval_no_grad
from mini_gpt.inspect.hooks import patch_stream, residual_stream
from mini_gpt.model.gpt import GPT


@dataclass
class Patching:
    clean_diff: float  # logit(answer) - logit(wrong) at the last position of the clean prompt
    corrupted_diff: float  # the same on the corrupted prompt
    recovered: Tensor  # (n_layer + 1, T): patching the stream entering block l (l = n_layer: the final
    #                    norm) at position t; 1 = the clean difference, 0 = the corrupted one


def logit_diff(logits: Tensor, answer: int, wrong: int) -> Tensor:
    """(B,) logit(answer) - logit(wrong) at the last position of logits (B, T, vocab)."""
    last = logits[:, -1].float()
    return last[:, answer] - last[:, wrong]


@eval_no_grad
def activation_patching(
    model: GPT, clean: list[int], corrupted: list[int], answer: int, wrong: int
) -> Patching:
    if len(clean) != len(corrupted):
        raise ValueError(
            f"clean and corrupted prompts must have the same token length ({len(clean)} != {len(corrupted)})"
        )
    device = next(model.parameters()).device
    with residual_stream(model) as stream:
        clean_logits, _ = model(torch.tensor([clean], device=device))
    clean_diff = float(logit_diff(clean_logits, answer, wrong)[0])
    corrupted_diff = float(logit_diff(model(torch.tensor([corrupted], device=device))[0], answer, wrong)[0])
    if clean_diff == corrupted_diff:
        raise ValueError(
            "the clean and corrupted prompts give the same logit difference between the two answers, so "
            "there is nothing to recover; pick prompts (or answers) that the model tells apart"
        )
    T, n_layer = len(clean), model.config.n_layer
    # Row t of a batch is the corrupted prompt patched at position t alone; the rows go in chunks of at
    # most ~2**24 floats of logits or MLP activations (a GPT-2 vocabulary would need T * T * 50257).
    chunk = max(1, 2**24 // (T * max(model.config.vocab_size, 4 * model.config.n_embd)))
    positions = torch.arange(T, device=device)
    recovered = torch.zeros(len(stream), T)
    for layer, clean_x in enumerate(stream):  # clean_x (1, T, C)
        diffs = []
        for chosen in positions.split(chunk):
            batch = torch.tensor([corrupted] * len(chosen), device=device)  # (rows, T)
            rows = torch.arange(len(chosen), device=device)
            with patch_stream(model, layer, rows, chosen, clean_x[0, chosen]):  # row i <- clean at chosen[i]
                # Below the final norm the last position's logits are all the metric reads; the final
                # norm's own input is cut to that position by last_logits, so patch it before the cut.
                logits = model.last_logits(batch) if layer < n_layer else model(batch)[0]
            diffs.append(logit_diff(logits, answer, wrong))
        recovered[layer] = ((torch.cat(diffs) - corrupted_diff) / (clean_diff - corrupted_diff)).cpu()
    return Patching(clean_diff, corrupted_diff, recovered)
