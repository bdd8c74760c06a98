"""CausalSelfAttention against independent references.

The references below are written from the maths (and from the five tutorials' formulations, in our own
code), never by calling the module under test. Each comparison maps weights into `c_attn`/`c_proj`.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mini_gpt.interop.hf import interleaved_qkv_to_fused
from mini_gpt.model.attention import CausalSelfAttention, KVCache, causal_mask

ATOL = 1e-5


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Give every parameter (biases too) non-trivial values, so a mix-up cannot hide behind zeros."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


def plain_attention(x, w_qkv, b_qkv, w_o, b_o, n_head, merge="transpose", mask=None):
    """Textbook causal multi-head attention, step by step, from raw weight matrices.

    w_qkv is (3C, d_in) laid out [q; k; v]. Returns (y, att) with att (B, nh, T, T).
    """
    B, T, _ = x.shape
    C = w_o.shape[0]
    hs = C // n_head
    qkv = x @ w_qkv.T + (b_qkv if b_qkv is not None else 0)
    q, k, v = qkv[..., :C], qkv[..., C : 2 * C], qkv[..., 2 * C :]

    def heads(t):  # (B, T, C) -> (B, nh, T, hs)
        return t.reshape(B, T, n_head, hs).permute(0, 2, 1, 3)

    q, k, v = heads(q), heads(k), heads(v)
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(hs)
    allowed = torch.ones(T, T).tril().bool() if mask is None else mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    att = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhts,bhsd->bhtd", att, v)  # (B, nh, T, hs)
    if merge == "transpose":
        out = out.permute(0, 2, 1, 3).reshape(B, T, C)  # heads side by side at each position
    else:  # the tutorials' bug: reshape (B, nh, T, hs) straight to (B, T, C)
        out = out.reshape(B, T, C)
    y = out @ w_o.T + (b_o if b_o is not None else 0)
    return y, att


def reference(attn: CausalSelfAttention, x, **kw):
    return plain_attention(
        x, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight, attn.c_proj.bias, attn.n_head, **kw
    )


@pytest.mark.parametrize(
    "B,T,n_embd,n_head,d_in,bias",
    [(2, 7, 16, 4, None, True), (3, 5, 24, 3, 10, True), (1, 9, 32, 8, 48, False), (2, 1, 8, 2, None, True)],
)
def test_matches_plain_math_including_weights(B, T, n_embd, n_head, d_in, bias):
    torch.manual_seed(B * 100 + T)
    attn = randomize(CausalSelfAttention(n_embd, n_head, bias=bias, d_in=d_in)).eval()
    x = torch.randn(B, T, d_in or n_embd)
    y_ref, att_ref = reference(attn, x)
    y_fast = attn(x)
    y_exact, att = attn(x, need_weights=True)
    assert y_fast.shape == (B, T, n_embd)
    torch.testing.assert_close(y_fast, y_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(y_exact, y_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(att, att_ref, atol=ATOL, rtol=0)


def test_c_attn_layout_is_q_k_v_with_heads_contiguous():
    attn = CausalSelfAttention(n_embd=8, n_head=2, d_in=8)
    assert attn.c_attn.weight.shape == (24, 8)
    assert attn.c_proj.weight.shape == (8, 8)
    # Zero the key and value rows: every score is 0, so each query spreads its weight evenly over
    # the visible keys. If q/k/v were laid out in another order, some score would be non-zero.
    with torch.no_grad():
        attn.c_attn.weight.normal_()
        attn.c_attn.weight[8:].zero_()
        attn.c_attn.bias.zero_()
    _, att = attn.eval()(torch.randn(1, 4, 8), need_weights=True)
    expected = torch.ones(4, 4).tril() / torch.arange(1, 5).unsqueeze(1)
    torch.testing.assert_close(att[0, 0], expected)
    torch.testing.assert_close(att[0, 1], expected)


def test_merge_without_transpose_is_caught():
    """The tutorials' merge `reshape(B, T, nh * hs)` of (B, nh, T, hs) mixes positions and heads."""
    torch.manual_seed(1)
    attn = randomize(CausalSelfAttention(16, 4)).eval()
    x = torch.randn(2, 6, 16)
    y = attn(x)
    y_good, _ = reference(attn, x, merge="transpose")
    y_buggy, _ = reference(attn, x, merge="reshape")
    torch.testing.assert_close(y, y_good, atol=ATOL, rtol=0)
    assert (y - y_buggy).abs().max() > 1e-2


def test_matches_torch_multihead_attention():
    torch.manual_seed(2)
    n_embd, n_head, T = 24, 4, 9
    attn = randomize(CausalSelfAttention(n_embd, n_head)).eval()
    mha = nn.MultiheadAttention(n_embd, n_head, batch_first=True).eval()
    with torch.no_grad():  # torch's in_proj is laid out [q; k; v] like ours: copy as is
        mha.in_proj_weight.copy_(attn.c_attn.weight)
        mha.in_proj_bias.copy_(attn.c_attn.bias)
        mha.out_proj.weight.copy_(attn.c_proj.weight)
        mha.out_proj.bias.copy_(attn.c_proj.bias)
    x = torch.randn(3, T, n_embd)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # torch's bool mask: True = may NOT attend
    y_ref, w_ref = mha(x, x, x, attn_mask=future, need_weights=True, average_attn_weights=False)
    y, w = attn(x, need_weights=True)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(w, w_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(attn(x), y_ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("need_weights", [False, True])
def test_causality_future_tokens_do_not_leak(need_weights):
    torch.manual_seed(3)
    attn = randomize(CausalSelfAttention(16, 2)).eval()
    x = torch.randn(2, 10, 16)
    y = attn(x, need_weights=need_weights)
    y = y[0] if need_weights else y
    for t in (0, 4, 8):
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn_like(x2[:, t + 1 :]) * 5
        y2 = attn(x2, need_weights=need_weights)
        y2 = y2[0] if need_weights else y2
        torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], atol=ATOL, rtol=0)
        assert (y2[:, t + 1 :] - y[:, t + 1 :]).abs().max() > 1e-3  # the future does change the future


def test_weights_are_causal_and_normalised():
    attn = randomize(CausalSelfAttention(12, 3)).eval()
    _, att = attn(torch.randn(2, 8, 12), need_weights=True)
    assert att.shape == (2, 3, 8, 8)
    assert torch.all(att.triu(1) == 0)
    torch.testing.assert_close(att.sum(-1), torch.ones(2, 3, 8))


def test_fast_path_equals_exact_path_with_mask_and_cache():
    torch.manual_seed(4)
    attn = randomize(CausalSelfAttention(32, 4)).eval()
    x = torch.randn(3, 12, 32)
    pad = torch.ones(3, 1, 12, 12, dtype=torch.bool)
    pad[1, ..., :3] = False  # sequence 1 is left-padded by 3
    for kw in (dict(), dict(attn_mask=pad)):
        torch.testing.assert_close(attn(x, **kw), attn(x, need_weights=True, **kw)[0], atol=ATOL, rtol=0)
    c1, c2 = KVCache(12), KVCache(12)
    attn(x[:, :5], kv_cache=c1), attn(x[:, :5], kv_cache=c2, need_weights=True)
    fast = attn(x[:, 5:], kv_cache=c1)
    exact, w = attn(x[:, 5:], kv_cache=c2, need_weights=True)
    torch.testing.assert_close(fast, exact, atol=ATOL, rtol=0)
    assert w.shape == (3, 4, 7, 12)


def test_dropout_only_in_train_mode():
    torch.manual_seed(5)
    attn = randomize(CausalSelfAttention(16, 2, dropout=0.5))
    x = torch.randn(2, 8, 16)
    attn.eval()
    y_eval = attn(x)
    torch.testing.assert_close(attn(x), y_eval)
    _, w_eval = attn(x, need_weights=True)
    torch.testing.assert_close(w_eval.sum(-1), torch.ones(2, 2, 8))  # no dropout on the weights
    attn.train()
    for need_weights in (False, True):
        a = attn(x, need_weights=need_weights)
        b = attn(x, need_weights=need_weights)
        a, b = (a[0], b[0]) if need_weights else (a, b)
        assert (a - b).abs().max() > 1e-3
        assert (a - y_eval).abs().max() > 1e-3
    _, w_train = attn(x, need_weights=True)
    visible = w_train[..., torch.ones(8, 8).tril().bool()]  # the causal half, all > 0 before dropout
    assert 0.35 < (visible == 0).float().mean() < 0.65  # about half of them dropped (p = 0.5)
    kept = w_train[w_train > 0]
    assert kept.max() <= 2.0 + 1e-6  # survivors rescaled by 1 / (1 - p)


def test_dropout_zero_train_equals_eval():
    attn = randomize(CausalSelfAttention(16, 2, dropout=0.0))
    x = torch.randn(2, 8, 16)
    torch.testing.assert_close(attn.train()(x), attn.eval()(x))


def test_left_padding_mask_matches_unpadded_and_has_no_nan():
    torch.manual_seed(6)
    attn = randomize(CausalSelfAttention(16, 4)).eval()
    short = torch.randn(1, 5, 16)
    n_pad = 3
    padded = torch.cat([torch.randn(1, n_pad, 16) * 10, short], dim=1)  # garbage in the padding
    keep = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    keep[..., :n_pad] = False  # nobody may attend to padding keys
    for need_weights in (False, True):
        out = attn(padded, attn_mask=keep, need_weights=need_weights)
        y = out[0] if need_weights else out
        assert not torch.isnan(y).any()
        expected = attn(short)
        torch.testing.assert_close(y[:, n_pad:], expected, atol=ATOL, rtol=0)
        # padding queries see nothing at all: attention output 0, so y is just c_proj's bias
        torch.testing.assert_close(y[0, :n_pad], attn.c_proj.bias.expand(n_pad, 16), atol=ATOL, rtol=0)
    _, w = attn(padded, attn_mask=keep, need_weights=True)
    assert torch.all(w[..., :n_pad, :] == 0) and torch.all(w[..., :n_pad] == 0)


def test_gradients_are_finite_with_padding():
    attn = randomize(CausalSelfAttention(16, 4))
    x = torch.randn(2, 6, 16, requires_grad=True)
    keep = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    keep[0, ..., :2] = False
    attn(x, attn_mask=keep, need_weights=True)[0].sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("need_weights", [False, True])
def test_kv_cache_prefill_then_one_token_equals_full_forward(need_weights):
    torch.manual_seed(7)
    attn = randomize(CausalSelfAttention(24, 3)).eval()
    x = torch.randn(2, 11, 24)
    full = attn(x)
    cache = KVCache(max_len=16)
    chunks = [x[:, :4]] + [x[:, t : t + 1] for t in range(4, 11)]
    outs = []
    for chunk in chunks:
        out = attn(chunk, kv_cache=cache, need_weights=need_weights)
        outs.append(out[0] if need_weights else out)
    assert len(cache) == cache.length == 11
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=ATOL, rtol=0)


def test_kv_cache_full_raises_and_reset_reuses_storage():
    attn = CausalSelfAttention(8, 2).eval()
    cache = KVCache(max_len=4)
    attn(torch.randn(1, 3, 8), kv_cache=cache)
    storage = cache.k
    with pytest.raises(ValueError, match="full"):
        attn(torch.randn(1, 2, 8), kv_cache=cache)
    cache.reset()
    assert len(cache) == 0
    attn(torch.randn(1, 4, 8), kv_cache=cache)
    assert cache.k is storage and len(cache) == 4


def test_causal_mask_with_cached_prefix():
    m = causal_mask(2, 5)  # two new queries at absolute positions 3 and 4
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)


def test_n_embd_not_divisible_by_n_head():
    with pytest.raises(ValueError, match="not divisible"):
        CausalSelfAttention(10, 3)


# ---------------------------------------------------------------------------------------------------
# The five tutorials' formulations (../shared/seeds), each re-implemented here in our own words.
# ---------------------------------------------------------------------------------------------------


def seed000_interleaved_fused(x, qkv: nn.Linear, out: nn.Linear, n_head: int, merge: str = "transpose"):
    """Seeds 000/001: one fused Linear whose output is reshaped to (B, T, H, 3*hs) and chunked per head,
    a causal mask added as a -inf upper triangle, and an output Linear. The seeds merge heads with a
    plain reshape; merge="transpose" is the correct merge."""
    B, T, _ = x.shape
    d_model = out.in_features
    hs = d_model // n_head
    h = qkv(x).reshape(B, T, n_head, 3 * hs).permute(0, 2, 1, 3)  # (B, H, T, 3hs)
    q, k, v = h.chunk(3, dim=-1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hs)
    scores = scores + torch.full((T, T), float("-inf")).triu(1)
    att = F.softmax(scores, dim=-1)
    vals = att @ v  # (B, H, T, hs)
    if merge == "transpose":
        vals = vals.permute(0, 2, 1, 3)
    return out(vals.reshape(B, T, d_model)), att


# 001's class has d_in != d_model
@pytest.mark.parametrize("d_in,d_model,n_head", [(32, 32, 4), (40, 24, 3)])
def test_seed_000_001_interleaved_fused_qkv(d_in, d_model, n_head):
    torch.manual_seed(8)
    qkv, out = randomize(nn.Linear(d_in, 3 * d_model), 1), randomize(nn.Linear(d_model, d_model), 2)
    ours = CausalSelfAttention(d_model, n_head, d_in=d_in).eval()
    with torch.no_grad():
        ours.c_attn.weight.copy_(interleaved_qkv_to_fused(qkv.weight, n_head))
        ours.c_attn.bias.copy_(interleaved_qkv_to_fused(qkv.bias, n_head))
        ours.c_proj.load_state_dict(out.state_dict())
    x = torch.randn(2, 6, d_in)
    y_ref, att_ref = seed000_interleaved_fused(x, qkv, out, n_head)
    y, att = ours(x, need_weights=True)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(att, att_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours(x), y_ref, atol=ATOL, rtol=0)
    # The tutorial's own merge (reshape without transposing back) gives something else.
    y_seed_bug, _ = seed000_interleaved_fused(x, qkv, out, n_head, merge="reshape")
    assert (y_seed_bug - y).abs().max() > 1e-2
    # Without the layout conversion the weights land on the wrong roles.
    with torch.no_grad():
        ours.c_attn.weight.copy_(qkv.weight)
        ours.c_attn.bias.copy_(qkv.bias)
    assert (ours(x) - y_ref).abs().max() > 1e-2


def test_interleaved_qkv_to_fused_moves_rows_to_roles():
    n_head, hs = 2, 3
    # Row r of an interleaved projection belongs to head r // (3*hs), role (r // hs) % 3.
    rows = torch.arange(3 * n_head * hs, dtype=torch.float32)
    fused = interleaved_qkv_to_fused(rows, n_head)
    expected = []
    for role in range(3):  # q, k, v
        for head in range(n_head):
            start = head * 3 * hs + role * hs
            expected.extend(range(start, start + hs))
    assert fused.tolist() == expected


class Seed002CausalHead(nn.Module):
    """Seed 002: one causal head with its own W_query/W_key/W_value, dropout on the weights."""

    def __init__(self, d_in, d_out, qkv_bias=False, dropout=0.0):
        super().__init__()
        self.W_query, self.W_key, self.W_value = (nn.Linear(d_in, d_out, bias=qkv_bias) for _ in range(3))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        T = x.shape[1]
        scores = (q @ k.transpose(1, 2)).masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        att = self.dropout(torch.softmax(scores / k.shape[-1] ** 0.5, dim=-1))
        return att @ v


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_seed_002_wrapper_of_single_heads_without_output_projection(qkv_bias):
    torch.manual_seed(9)
    d_in, d_out, n_head = 5, 4, 3
    heads = [randomize(Seed002CausalHead(d_in, d_out, qkv_bias), seed=i) for i in range(n_head)]
    x = torch.randn(2, 6, d_in)
    y_ref = torch.cat([h(x) for h in heads], dim=-1)  # the wrapper: heads side by side, no W_o
    ours = CausalSelfAttention(n_head * d_out, n_head, d_in=d_in).eval()
    with torch.no_grad():
        roles = ("W_query", "W_key", "W_value")
        ours.c_attn.weight.copy_(torch.cat([getattr(h, r).weight for r in roles for h in heads]))
        if qkv_bias:
            ours.c_attn.bias.copy_(torch.cat([getattr(h, r).bias for r in roles for h in heads]))
        else:
            ours.c_attn.bias.zero_()
        ours.c_proj.weight.copy_(torch.eye(n_head * d_out))  # no output projection = identity
        ours.c_proj.bias.zero_()
    torch.testing.assert_close(ours(x), y_ref, atol=ATOL, rtol=0)


class Seed002WeightSplit(nn.Module):
    """Seed 002's stand-alone multi-head class: W_query/W_key/W_value split into heads by view +
    transpose, in-place causal fill, scaling after masking, dropout on the weights, out_proj."""

    def __init__(self, d_in, d_out, n_head, qkv_bias=False, dropout=0.0):
        super().__init__()
        self.n_head, self.hs = n_head, d_out // n_head
        self.W_query, self.W_key, self.W_value = (nn.Linear(d_in, d_out, bias=qkv_bias) for _ in range(3))
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, _ = x.shape

        def split(t):
            return t.view(B, T, self.n_head, self.hs).transpose(1, 2)

        q, k, v = split(self.W_query(x)), split(self.W_key(x)), split(self.W_value(x))
        scores = q @ k.transpose(2, 3)
        scores.masked_fill_(torch.ones(T, T).triu(1).bool(), float("-inf"))
        att = self.dropout(torch.softmax(scores / self.hs**0.5, dim=-1))
        ctx = (att @ v).transpose(1, 2).contiguous().view(B, T, -1)
        return self.out_proj(ctx), att


def load_separate_projections(ours, w_q, w_k, w_v, w_o):
    """Map four separate Linear layers (q, k, v, output) into c_attn = [q; k; v] and c_proj."""
    with torch.no_grad():
        ours.c_attn.weight.copy_(torch.cat([w_q.weight, w_k.weight, w_v.weight]))
        biases = [w.bias if w.bias is not None else torch.zeros(w.out_features) for w in (w_q, w_k, w_v)]
        ours.c_attn.bias.copy_(torch.cat(biases))
        ours.c_proj.load_state_dict(w_o.state_dict())


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_seed_002_weight_split_multihead(qkv_bias):
    torch.manual_seed(10)
    ref = randomize(Seed002WeightSplit(d_in=6, d_out=8, n_head=2, qkv_bias=qkv_bias)).eval()
    ours = CausalSelfAttention(8, 2, d_in=6).eval()
    load_separate_projections(ours, ref.W_query, ref.W_key, ref.W_value, ref.out_proj)
    x = torch.randn(3, 7, 6)
    y_ref, att_ref = ref(x)
    y, att = ours(x, need_weights=True)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(att, att_ref, atol=ATOL, rtol=0)


def test_seed_002_dropout_acts_on_the_weights_like_ours():
    """Same dropout mask on both sides (same RNG stream) -> same output: dropout sits on the weights."""
    ref = randomize(Seed002WeightSplit(d_in=8, d_out=8, n_head=2, qkv_bias=True, dropout=0.3)).train()
    ours = CausalSelfAttention(8, 2, dropout=0.3).train()
    load_separate_projections(ours, ref.W_query, ref.W_key, ref.W_value, ref.out_proj)
    ours.resid_dropout.p = 0.0  # the tutorial has no residual dropout
    x = torch.randn(2, 5, 8)
    torch.manual_seed(11)
    y_ref, att_ref = ref(x)
    torch.manual_seed(11)
    y, att = ours(x, need_weights=True)
    torch.testing.assert_close(att, att_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)


class Seed003PerHeadLists(nn.Module):
    """Seed 003: per-head Linear lists for q, k and v, a scaled dot-product per head, concatenation,
    an output Linear. The tutorial attends bidirectionally; `causal` adds our mask to the same maths."""

    def __init__(self, d_model, n_head):
        super().__init__()
        d_h = d_model // n_head
        self.qs, self.ks, self.vs = (
            nn.ModuleList(nn.Linear(d_model, d_h) for _ in range(n_head)) for _ in range(3)
        )
        self.linear = nn.Linear(d_model, d_model)
        self.d_h = d_h

    def forward(self, x, causal=True):
        outs, weights = [], []
        T = x.shape[1]
        for lq, lk, lv in zip(self.qs, self.ks, self.vs):
            scores = lq(x) @ lk(x).permute(0, 2, 1) / math.sqrt(self.d_h)
            if causal:
                scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
            w = F.softmax(scores, dim=-1)
            outs.append(w @ lv(x))
            weights.append(w)
        return self.linear(torch.cat(outs, dim=-1)), torch.stack(weights).permute(1, 0, 2, 3)


def test_seed_003_per_head_linear_lists():
    torch.manual_seed(12)
    ref = randomize(Seed003PerHeadLists(d_model=12, n_head=3))
    ours = CausalSelfAttention(12, 3).eval()
    with torch.no_grad():
        per_role = [lin for group in (ref.qs, ref.ks, ref.vs) for lin in group]  # [q_0..; k_0..; v_0..]
        ours.c_attn.weight.copy_(torch.cat([lin.weight for lin in per_role]))
        ours.c_attn.bias.copy_(torch.cat([lin.bias for lin in per_role]))
        ours.c_proj.load_state_dict(ref.linear.state_dict())
    x = torch.randn(2, 5, 12)
    y_ref, att_ref = ref(x)
    y, att = ours(x, need_weights=True)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(att, att_ref, atol=ATOL, rtol=0)
    # The tutorial's unmasked form agrees at the last position, where causal attention sees everything.
    y_bidirectional, _ = ref(x, causal=False)
    torch.testing.assert_close(y[:, -1], y_bidirectional[:, -1], atol=ATOL, rtol=0)
    assert (y[:, 0] - y_bidirectional[:, 0]).abs().max() > 1e-3


def seed004_separate_wo(x, w_q, w_k, w_v, w_o, n_head, mask):
    """Seed 004: W_q/W_k/W_v/W_o with bias, heads by view + transpose, an optional 0/1 mask applied
    with masked_fill(mask == 0, -1e9), weights returned."""
    B, _, C = x.shape
    hs = C // n_head

    def split(t):
        return t.view(B, -1, n_head, hs).transpose(1, 2)

    q, k, v = split(w_q(x)), split(w_k(x)), split(w_v(x))
    scores = q @ k.transpose(-2, -1) / hs**0.5
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    att = F.softmax(scores, dim=-1)
    ctx = (att @ v).transpose(1, 2).contiguous().view(B, -1, C)
    return w_o(ctx), att


def test_seed_004_zero_one_mask_with_masked_fill():
    torch.manual_seed(13)
    C, n_head, T = 16, 4, 6
    w_q, w_k, w_v, w_o = (randomize(nn.Linear(C, C), seed=i) for i in range(4))
    ours = CausalSelfAttention(C, n_head).eval()
    load_separate_projections(ours, w_q, w_k, w_v, w_o)
    x = torch.randn(2, T, C)
    causal01 = torch.ones(T, T).tril()  # 1 = may attend, 0 = masked
    y_ref, att_ref = seed004_separate_wo(x, w_q, w_k, w_v, w_o, n_head, causal01)
    y, att = ours(x, need_weights=True)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(att, att_ref, atol=ATOL, rtol=0)
    # A padding 0/1 mask on top of causality: ours takes it as a bool attn_mask.
    pad01 = causal01.clone().expand(2, 1, T, T).clone()
    pad01[1, ..., :2] = 0
    pad01[1, ..., :2, :] = causal01[:2]  # padding queries keep their causal row (no empty rows in 004)
    y_ref, att_ref = seed004_separate_wo(x, w_q, w_k, w_v, w_o, n_head, pad01)
    y, att = ours(x, attn_mask=pad01.bool(), need_weights=True)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(att, att_ref, atol=ATOL, rtol=0)


def test_one_token_decode_step_with_padding_mask_equals_exact_path():
    """The single-query decoding path (plain ops) against the exact path, padding and an empty row."""
    torch.manual_seed(8)
    attn = randomize(CausalSelfAttention(32, 4)).eval()
    x = torch.randn(3, 9, 32)
    keep = torch.ones(3, 1, 1, 9, dtype=torch.bool)  # the 9th token's query sees keys 0..8
    keep[1, ..., :4] = False  # row 1 left-padded by 4
    keep[2] = False  # row 2 may see nothing: zeros, never NaN
    c1, c2 = KVCache(9), KVCache(9)
    attn(x[:, :8], kv_cache=c1), attn(x[:, :8], kv_cache=c2, need_weights=True)
    fast = attn(x[:, 8:], kv_cache=c1, attn_mask=keep)
    exact, _ = attn(x[:, 8:], kv_cache=c2, attn_mask=keep, need_weights=True)
    torch.testing.assert_close(fast, exact, atol=ATOL, rtol=0)
    torch.testing.assert_close(fast[2, 0], attn.c_proj.bias, atol=ATOL, rtol=0)
