"""Log-likelihood primitives against transformers (the exported HF model) and a plain single-sequence loop."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from helpers import WORDS, bpe_model, reference_sliding_nll

from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.scoring import continuation_logprobs, rolling_nll, score_windows, windows
from mini_gpt.interop.export import export_model
from mini_gpt.tokenizer import build_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def gpt2_tok(gpt2_bpe_file):
    return build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, gpt2_tok):
    """(our model, transformers' GPT2LMHeadModel loaded from the `format=hf` export of it)."""
    from transformers import GPT2LMHeadModel

    model = bpe_model()
    out = export_model(model, gpt2_tok, tmp_path_factory.mktemp("hf") / "export", "hf")
    return model, GPT2LMHeadModel.from_pretrained(out).eval()


def random_text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def hf_continuation(hf, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """Reference: one unpadded sequence through transformers, log_softmax, pick the continuation tokens."""
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logp = F.log_softmax(hf(ids).logits[0].double(), dim=-1)  # (T, V)
    positions = range(len(context) - 1, len(context) + len(continuation) - 1)
    picked = [logp[p, t].item() for p, t in zip(positions, continuation)]
    greedy = all(logp[p].argmax().item() == t for p, t in zip(positions, continuation))
    return sum(picked), greedy


def test_continuation_logprobs_equal_transformers_and_a_single_sequence_loop(exported, gpt2_tok):
    model, hf = exported
    rng = random.Random(0)
    pairs = []
    for _ in range(36):
        context = random_text(rng, rng.randint(1, 12))
        pairs.append((gpt2_tok.encode(context), gpt2_tok.encode(" " + random_text(rng, rng.randint(1, 6)))))
    ours = continuation_logprobs(model, pairs, batch_size=8)  # padded batches of different lengths
    for (ctx, cont), got in zip(pairs, ours, strict=True):
        ref_lp, ref_greedy = hf_continuation(hf, ctx, cont)
        assert got.tokens == len(cont)
        assert got.logprob == pytest.approx(ref_lp, abs=1e-4)
        assert got.is_greedy == ref_greedy
        # plain loop over one sequence with our own model, no batching, no padding
        with torch.no_grad():
            logits = model(torch.tensor([ctx + cont[:-1]]))[0][0]
        plain = F.log_softmax(logits, -1)[len(ctx) - 1 :].gather(1, torch.tensor(cont)[:, None]).sum().item()
        assert got.logprob == pytest.approx(plain, abs=1e-4)


def test_greedy_flag_is_true_for_the_models_own_argmax_continuation(exported):
    model, _ = exported
    ctx = [464, 3290, 318]
    cont = []
    seq = list(ctx)
    with torch.no_grad():
        for _ in range(4):
            nxt = int(model(torch.tensor([seq]))[0][0, -1].argmax())
            cont.append(nxt)
            seq.append(nxt)
    (greedy,) = continuation_logprobs(model, [(ctx, cont)])
    assert greedy.is_greedy is True
    (other,) = continuation_logprobs(model, [(ctx, [*cont[:-1], (cont[-1] + 1) % 50257])])
    assert other.is_greedy is False


def test_a_continuation_longer_than_block_size_is_scored_by_windows(exported):
    model, _ = exported
    block = model.config.block_size
    ctx, cont = list(range(300, 330)), list(range(500, 500 + 2 * block + 5))
    (got,) = continuation_logprobs(model, [(ctx, cont)])
    # Independent: every continuation token once, from the tokens before it inside its window. The
    # windows hold block inputs, start half a block before the continuation and move by half a block.
    full, half = ctx + cont, block // 2
    start = len(ctx) - half
    want, done = 0.0, len(ctx) - 1  # full[done] is the last token already scored (or context)
    begin = start
    while done < len(full) - 1:
        end = min(begin + block, len(full) - 1)
        if end == len(full) - 1:
            begin = max(start, end - block)
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([full[begin:end]]))[0][0], -1)
        for j in range(done + 1, end + 1):
            want += logp[j - begin - 1, full[j]].item()
        done, begin = end, begin + half
    assert got.tokens == len(cont)
    assert got.logprob == pytest.approx(want, abs=1e-3)


def test_long_context_is_cut_from_the_left(exported):
    model, _ = exported
    block = model.config.block_size
    ctx, cont = list(range(100, 100 + 2 * block)), [5, 6, 7]
    (got,) = continuation_logprobs(model, [(ctx, cont)])
    (short,) = continuation_logprobs(model, [(ctx[-(block + 1 - len(cont)) :], cont)])
    assert got.logprob == pytest.approx(short.logprob, abs=1e-5)
    with pytest.raises(MiniGPTError, match="non-empty context"):
        continuation_logprobs(model, [([], [1])])


@pytest.mark.parametrize(
    ("n", "block", "stride"), [(200, 16, 8), (200, 16, 16), (17, 16, 5), (5, 16, 3), (100, 16, 1)]
)
def test_windows_score_every_token_once_with_the_promised_context(n, block, stride):
    ids = list(range(n))
    seen = []
    for w in windows(ids, block, stride):
        assert len(w.ids) - 1 <= block  # model inputs fit the context
        start = w.ids[0]  # ids are their own positions here
        for p in range(w.first, len(w.ids) - 1):
            target = w.ids[p + 1]
            seen.append(target)
            context = target - start
            assert context == p + 1
            if target > block:  # after the first window: at least block - stride tokens of context
                assert context >= block - stride
    assert seen == list(range(1, n))  # every token but the first, once, in order
    assert len(w.ids) - 1 == min(block, n - 1)  # the last window is a whole block (right-aligned)


@pytest.mark.parametrize("stride", [48, 24, 7])
def test_rolling_nll_equals_transformers_sliding_window(exported, gpt2_tok, stride):
    model, hf = exported
    ids = gpt2_tok.encode(random_text(random.Random(1), 150))
    ref_nll, ref_count, ref_context = reference_sliding_nll(hf, ids, model.config.block_size, stride)
    got = rolling_nll(model, ids, stride=stride, batch_size=5)
    assert got.tokens == ref_count == len(ids) - 1
    assert got.nll == pytest.approx(ref_nll, abs=1e-4 * ref_count)
    assert got.context == ref_context
    assert got.min_context == 1  # the very first target sees one token


def test_score_windows_per_document_sums(exported, gpt2_tok):
    model, _ = exported
    rng = random.Random(2)
    docs = [gpt2_tok.encode(random_text(rng, k)) for k in (5, 80, 30)]
    wins = [w for d, ids in enumerate(docs) for w in windows(ids, model.config.block_size, 16, doc=d)]
    total, per_doc = score_windows(model, wins, batch_size=4, per_doc=True)
    singles = [rolling_nll(model, ids, stride=16).nll for ids in docs]
    assert per_doc == pytest.approx(singles, abs=1e-4)
    assert total.nll == pytest.approx(sum(singles), abs=1e-4)
