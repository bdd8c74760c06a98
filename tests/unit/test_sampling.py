"""Decoding: KV cache vs recompute, the sliding window, temperature/top-k/top-p, seeding, batching."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import preset

from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.padding import padded_last_logits
from mini_gpt.infer.sampling import (
    apply_repetition_penalty,
    context_start,
    generate,
    next_token_probs,
    sample_next,
)
from mini_gpt.model.gpt import GPT, GPTConfig

# Tiny ops: a second thread only adds synchronisation on a shared 2-core machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_model(pos_embedding: str = "learned", block_size: int = 16, seed: int = 0, **kw) -> GPT:
    """A float64 tiny GPT whose greedy continuations vary (a random tied model repeats one token).

    Untied output weights scaled up make the next token depend strongly on the context; float64 makes
    "same argmax" a statement about the decoding logic, not about two attention kernels' rounding.
    """
    torch.manual_seed(seed)
    kw = {"tie_weights": False, **kw}
    cfg = GPTConfig(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=61,
        block_size=block_size,
        pos_embedding=pos_embedding,
        **kw,
    )
    model = GPT(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model


def reference_greedy(model: GPT, prompt: list[int], steps: int, window: int) -> list[int]:
    """Greedy decoding written out plainly: full recompute, context rule spelled out by hand."""
    L = model.config.block_size
    seq = list(prompt)
    start = max(0, len(seq) - L)
    with torch.no_grad():
        for _ in range(steps):
            if len(seq) - start > L:  # one token too many: keep only the last `window`
                start = len(seq) - window
            logits = model(torch.tensor([seq[start:]]))[0][0, -1]
            seq.append(int(logits.argmax()))
    return seq


@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
@pytest.mark.parametrize(("prompt_len", "steps"), [(1, 40), (7, 45), (15, 20), (16, 12), (21, 37)])
def test_greedy_cache_equals_recompute_past_block_size(pos_embedding, prompt_len, steps):
    model = tiny_model(pos_embedding)
    torch.manual_seed(prompt_len)
    prompt = torch.randint(0, 61, (1, prompt_len))
    cached = generate(model, prompt, steps, temperature=0, use_cache=True)
    recomputed = generate(model, prompt, steps, temperature=0, use_cache=False)
    expected = reference_greedy(model, prompt[0].tolist(), steps, window=8)
    assert cached.shape == (1, prompt_len + steps)
    assert cached[0].tolist() == expected
    assert recomputed[0].tolist() == expected
    # Greedy decoding of a random tiny model is not a constant sequence (else the test proves little).
    assert len(set(expected[prompt_len:])) >= min(4, steps - 1)


@pytest.mark.parametrize("window", [1, 5, 16])
def test_other_windows_and_batches_match(window):
    model = tiny_model("rope", seed=1)
    prompt = torch.randint(0, 61, (3, 4), generator=torch.Generator().manual_seed(2))
    cached = generate(model, prompt, 30, temperature=0, window=window)
    recomputed = generate(model, prompt, 30, temperature=0, use_cache=False, window=window)
    assert torch.equal(cached, recomputed)
    for row in range(3):
        assert cached[row].tolist() == reference_greedy(model, prompt[row].tolist(), 30, window)


def test_context_start_rule():
    # block_size 8, window 4: grows to 8 tokens, then jumps to the last 4 and grows again.
    starts, start = [], 0
    for length in range(1, 20):
        start = context_start(start, length, block_size=8, window=4)
        starts.append(start)
        assert 4 <= length - start <= 8 or length < 4
    assert starts == [0] * 8 + [5] * 5 + [10] * 5 + [15]


def test_sampled_cache_equals_recompute_with_same_seed():
    model = tiny_model("learned", seed=3)
    prompt = torch.tensor([[1, 2, 3]])
    runs = [
        generate(
            model,
            prompt,
            40,
            temperature=1.3,
            top_k=10,
            top_p=0.9,
            use_cache=use_cache,
            generator=torch.Generator().manual_seed(7),
            num_samples=4,
        )
        for use_cache in (True, False)
    ]
    assert torch.equal(runs[0], runs[1])


def test_same_seed_same_output_and_different_seed_differs():
    model = tiny_model("learned", seed=4)
    prompt = torch.tensor([[5]])

    def sample(seed):
        return generate(model, prompt, 50, temperature=1.5, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(11), sample(11))
    assert not torch.equal(sample(11), sample(12))


def test_temperature_zero_is_argmax():
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample_next(logits, temperature=0, top_k=3, top_p=0.1), logits.argmax(-1))
    # In generate, greedy ignores the generator entirely.
    model = tiny_model("learned", seed=5)
    a = generate(model, torch.tensor([[0]]), 20, temperature=0, generator=torch.Generator().manual_seed(1))
    b = generate(model, torch.tensor([[0]]), 20, temperature=0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b)


def test_top_k_never_samples_outside_top_k():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4000, 50, generator=gen) * 0.3  # flat-ish: outside tokens would be likely
    tokens = sample_next(logits, temperature=1.0, top_k=5, generator=gen)
    top5 = logits.topk(5, dim=-1).indices
    assert (top5 == tokens[:, None]).any(dim=-1).all()
    # ...and it does sample all of them, not just the argmax.
    rank = (top5 == tokens[:, None]).float().argmax(dim=-1)
    assert set(rank.tolist()) == {0, 1, 2, 3, 4}


# probabilities 0.05, 0.40, 0.10, 0.30, 0.15 (vocab order)
PROBS = torch.tensor([[0.05, 0.40, 0.10, 0.30, 0.15]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (0.35, [0, 1, 0, 0, 0]),  # 0.40 alone already reaches 0.35
        (0.5, [0, 0.4 / 0.7, 0, 0.3 / 0.7, 0]),  # 0.40 < 0.5, 0.40 + 0.30 >= 0.5
        (0.75, [0, 0.4 / 0.85, 0, 0.3 / 0.85, 0.15 / 0.85]),  # 0.70 < 0.75 <= 0.85
        (0.9, [0, 0.4 / 0.95, 0.1 / 0.95, 0.3 / 0.95, 0.15 / 0.95]),  # 0.85 < 0.9 <= 0.95
        (1.0, [0.05, 0.4, 0.1, 0.3, 0.15]),
    ],
)
def test_top_p_keeps_smallest_set_reaching_p(top_p, expected):
    probs = next_token_probs(PROBS.log(), temperature=1.0, top_p=top_p)
    torch.testing.assert_close(probs, torch.tensor([expected], dtype=probs.dtype), atol=1e-6, rtol=0)


def test_top_p_sampling_frequencies():
    gen = torch.Generator().manual_seed(0)
    logits = PROBS.log().float().expand(20000, -1)
    tokens = sample_next(logits, temperature=1.0, top_p=0.75, generator=gen)
    freq = torch.bincount(tokens, minlength=5).double() / len(tokens)
    expected = torch.tensor([0, 0.4 / 0.85, 0, 0.3 / 0.85, 0.15 / 0.85], dtype=torch.float64)
    assert freq[0] == 0 and freq[2] == 0
    torch.testing.assert_close(freq, expected, atol=0.015, rtol=0)


def test_temperature_then_top_k_then_top_p():
    # temperature 2: p_i ∝ sqrt(p_i); top_k=3 keeps 0.40, 0.30, 0.15; top_p=0.6 on the renormalised
    # three keeps the two largest (sqrt(.4)/(s) ~ 0.41 < 0.6 <= 0.41 + 0.36).
    roots = PROBS.sqrt()[0]
    s3 = roots[1] + roots[3] + roots[4]
    assert roots[1] / s3 < 0.6 <= (roots[1] + roots[3]) / s3
    probs = next_token_probs(PROBS.log(), temperature=2.0, top_k=3, top_p=0.6)[0]
    s2 = roots[1] + roots[3]
    expected = torch.tensor([0, roots[1] / s2, 0, roots[3] / s2, 0], dtype=probs.dtype)
    torch.testing.assert_close(probs, expected, atol=1e-6, rtol=0)
    # top-k happens before top-p: top_k=2 then top_p=0.5 keeps only 0.40 (4/7 >= 0.5).
    probs = next_token_probs(PROBS.log(), top_k=2, top_p=0.5)[0]
    torch.testing.assert_close(probs, torch.tensor([0, 1, 0, 0, 0], dtype=probs.dtype), atol=1e-6, rtol=0)


def test_repetition_penalty():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    seq = torch.tensor([[0, 1, 1]])
    out = apply_repetition_penalty(logits, seq, 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]
    # A huge penalty makes greedy decoding avoid every token it has already produced.
    model = tiny_model("learned", seed=6)
    seq = generate(model, torch.tensor([[0]]), 20, temperature=0, repetition_penalty=1e6)[0].tolist()
    assert len(set(seq)) == len(seq)


def test_num_samples_share_one_prefill():
    model = tiny_model("learned", seed=7)
    shapes = []
    # the token ids each model pass embeds (generation calls model.last_logits, not forward)
    handle = model.transformer.wte.register_forward_pre_hook(
        lambda _m, args: shapes.append(tuple(args[0].shape))
    )
    try:
        out = generate(model, torch.tensor([[1, 2, 3, 4, 5]]), 4, temperature=0, num_samples=3)
    finally:
        handle.remove()
    assert shapes == [(1, 5), (3, 1), (3, 1), (3, 1)]
    assert out.shape == (3, 9)
    single = generate(model, torch.tensor([[1, 2, 3, 4, 5]]), 4, temperature=0)
    assert torch.equal(out, single.expand(3, -1))
    # Sampled rows differ from each other (each row draws its own tokens).
    sampled = generate(
        model,
        torch.tensor([[1]]),
        30,
        temperature=2.0,
        num_samples=3,
        generator=torch.Generator().manual_seed(0),
    )
    assert not torch.equal(sampled[0], sampled[1])


def test_eval_mode_during_generation_and_restored():
    model = tiny_model("learned", seed=8, dropout=0.5)
    expected = generate(model, torch.tensor([[3]]), 15, temperature=0)
    model.train()
    got = generate(model, torch.tensor([[3]]), 15, temperature=0)  # dropout off while generating
    assert model.training
    assert torch.equal(got, expected)
    assert torch.is_grad_enabled()  # no_grad only while generating


def test_stream_callback_and_early_stop():
    model = tiny_model("learned", seed=9)
    seen = []
    out = generate(model, torch.tensor([[1, 2]]), 10, temperature=0, stream=lambda t: seen.append(t.tolist()))
    assert [s[0] for s in seen] == out[0, 2:].tolist()
    stopped = generate(model, torch.tensor([[1, 2]]), 10, temperature=0, stream=lambda t: len(t) > 0)
    assert stopped.tolist() == [out[0, :3].tolist()]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0},
        {"top_k": 0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"repetition_penalty": 0.0},
        {"window": 17},
    ],
)
def test_invalid_arguments(kwargs):
    model = tiny_model("learned")
    with pytest.raises(MiniGPTError):
        generate(model, torch.tensor([[1]]), 2, **kwargs)


def test_log_probs_of_top_p_nucleus_are_finite_only_in_nucleus():
    # The filtered distribution is a proper distribution over exactly the kept tokens.
    logits = torch.randn(8, 30, generator=torch.Generator().manual_seed(1))
    probs = next_token_probs(logits, top_p=0.8)
    assert torch.allclose(probs.sum(-1), torch.ones(8))
    full = torch.softmax(logits, -1)
    for row in range(8):
        kept = probs[row] > 0
        mass = full[row][kept].sum().item()
        smallest_kept = full[row][kept].min().item()
        assert mass >= 0.8 - 1e-6
        assert mass - smallest_kept < 0.8  # dropping the least likely kept token falls below p
        assert (~kept).all() or full[row][~kept].max() <= smallest_kept  # the kept ones are the likeliest
        assert math.isclose(mass, 1.0) or (~kept).any()


def test_top_p_exact_boundary_keeps_the_smaller_set():
    # 0.5 alone has mass exactly p = 0.5: the smallest set reaching p is {0.5}, not {0.5, 0.25}.
    logits = torch.tensor([[0.25, 0.5, 0.25]]).log()  # dyadic probabilities: exact in float
    probs = next_token_probs(logits, top_p=0.5)
    assert probs.tolist() == [[0.0, 1.0, 0.0]]
    probs = next_token_probs(logits, top_p=0.75)  # 0.5 + 0.25 = 0.75 exactly: two tokens, ties by sort
    assert sorted(probs[0].tolist()) == pytest.approx([0.0, 1 / 3, 2 / 3], abs=1e-6)


def test_benchmark_baseline_loop_matches_generate_within_block_size():
    # The benchmark's nanoGPT-style baseline (crop to block_size, recompute) and our decoding agree
    # token for token, seed for seed, while the sequence fits (past it their windows differ by design).
    from mini_gpt.bench.generate import recompute_crop_loop

    model = tiny_model("learned", seed=10)
    prompt = torch.tensor([[4, 5]])
    ours = generate(model, prompt, 14, temperature=1.0, top_k=200, generator=torch.Generator().manual_seed(3))
    base = recompute_crop_loop(model, prompt, 14, generator=torch.Generator().manual_seed(3))
    assert torch.equal(ours, base)
    longer = recompute_crop_loop(model, prompt, 30, generator=torch.Generator().manual_seed(3))
    assert longer.shape == (1, 32)


@pytest.mark.parametrize("pos_embedding", ["learned", "rope"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_batch_decodes_each_row_as_alone(pos_embedding, use_cache):
    """Prompts of different lengths in one batch (left padding + attention_mask) give, row by row,
    the greedy tokens of that prompt generated on its own."""
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=40, block_size=24, pos_embedding=pos_embedding))
    model.eval()
    prompts = [torch.randint(0, 40, (n,)).tolist() for n in (3, 7, 5)]
    width = max(len(p) for p in prompts)
    idx = torch.full((3, width), 39)  # pad id: any token, it must not matter
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, p in enumerate(prompts):
        idx[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    out = generate(model, idx, 12, temperature=0, use_cache=use_cache, attention_mask=mask)  # 19 <= 24
    for row, p in enumerate(prompts):
        alone = generate(model, torch.tensor([p]), 12, temperature=0, use_cache=use_cache)
        assert out[row, width:].tolist() == alone[0, len(p) :].tolist()


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(pos_embedding="rope"), dict(norm="rmsnorm", mlp="swiglu", bias=False, tie_weights=False)],
)
def test_padded_last_logits_equal_the_prompt_alone(kw):
    """A left-padded row gives the logits of its prompt run alone through GPT.forward, in one pass and
    continued from a KV cache (its positions count real tokens only; the padding is never attended to)."""
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=50, block_size=24, **kw)).eval()
    prompt = torch.randint(0, 50, (1, 7))
    padded = torch.cat([torch.full((1, 3), 49), prompt], dim=1)  # (1, 10)
    keep = torch.ones(1, 10, dtype=torch.bool)
    keep[:, :3] = False
    with torch.no_grad():
        alone, _ = model(prompt)  # (1, 7, V)
        out = padded_last_logits(model, padded, keep)
        assert out.shape == (1, 1, 50) and torch.isfinite(out).all()
        torch.testing.assert_close(out, alone[:, -1:], atol=1e-5, rtol=0)
        caches = model.new_kv_caches()
        padded_last_logits(model, padded[:, :6], keep[:, :6], caches)  # 3 padding + 3 real tokens
        for n in range(7, 11):
            out = padded_last_logits(model, padded[:, n - 1 : n], keep[:, :n], caches)
            torch.testing.assert_close(out, alone[:, n - 4 : n - 3], atol=1e-5, rtol=0)


def test_left_padded_batch_cache_equals_recompute_past_block_size():
    torch.manual_seed(1)
    model = GPT(preset("tiny", vocab_size=40, block_size=16)).eval()
    idx = torch.randint(0, 40, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :4] = 0
    kw = dict(temperature=0, attention_mask=mask)
    cached = generate(model, idx, 30, use_cache=True, **kw)
    assert torch.equal(cached, generate(model, idx, 30, use_cache=False, **kw))


def test_attention_mask_errors():
    model = GPT(preset("tiny", vocab_size=40, block_size=16)).eval()
    idx = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(MiniGPTError, match="shape"):
        generate(model, idx, 2, attention_mask=torch.ones(2, 3))
    with pytest.raises(MiniGPTError, match="at least one real"):
        generate(model, idx, 2, attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]))


def test_compile_decoding_compiles_the_step_generate_runs(monkeypatch) -> None:
    """generate calls `last_logits`, not `forward`: compiling the module would compile nothing it runs."""
    from mini_gpt.infer.sampling import compile_decoding, generate
    from mini_gpt.model.gpt import GPT, GPTConfig

    calls: list[int] = []

    def fake_compile(fn, **kwargs):  # what torch.compile returns: a callable standing in for fn
        assert kwargs == {"dynamic": True}

        def compiled(*args, **kw):
            calls.append(1)
            return fn(*args, **kw)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=8)).eval()
    plain = generate(model, torch.tensor([[1, 2, 3]]), 4, temperature=0)
    assert compile_decoding(model) is model
    assert torch.equal(generate(model, torch.tensor([[1, 2, 3]]), 4, temperature=0), plain)
    assert len(calls) == 4  # the prefill and three decoding steps went through the compiled step
