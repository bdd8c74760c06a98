"""mini_gpt.inspect against independent references: transformers' hidden states, hand-built heads with
known roles, weight surgery in place of hooks, and a forward pass spelled out in the test."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mini_gpt.inspect.ablation import ablate
from mini_gpt.inspect.heads import head_roles, repeated_tokens
from mini_gpt.inspect.hooks import patch_stream
from mini_gpt.inspect.lens import logit_lens
from mini_gpt.inspect.patching import activation_patching, logit_diff
from mini_gpt.interop.hf import gpt_from_hf, to_hf
from mini_gpt.model.gpt import GPT, GPTConfig


def random_gpt(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    shape = dict(vocab_size=53, block_size=24, n_layer=3, n_head=4, n_embd=32, dropout=0.0) | overrides
    model = GPT(GPTConfig(**shape)).eval()
    with torch.no_grad():  # biases and norms away from 0 / 1, so a mix-up cannot hide behind them
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


# ---- logit lens --------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_logit_lens_equals_transformers_hidden_states(arch):
    extra = {} if arch == "gpt2" else dict(norm="rmsnorm", pos_embedding="rope", mlp="swiglu", bias=False)
    hf = to_hf(random_gpt(1, **extra))  # an exported model: transformers computes the reference
    ours = gpt_from_hf(hf).eval()
    ids = torch.randint(53, (24,), generator=torch.Generator().manual_seed(2)).tolist()
    lens = logit_lens(ours, ids, k=3)
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_hidden_states=True)
        body = hf.transformer if arch == "gpt2" else hf.model
        final_norm = body.ln_f if arch == "gpt2" else body.norm
        # transformers' last hidden state has the final norm applied already; the earlier ones do not
        expected = [hf.lm_head(final_norm(h)) for h in out.hidden_states[:-1]] + [out.logits]
    expected_probs = torch.stack(expected)[:, 0].softmax(-1)  # (n_layer + 1, T, vocab)
    assert lens.probs.shape == expected_probs.shape == (4, 24, 53)
    torch.testing.assert_close(lens.probs, expected_probs, atol=1e-5, rtol=1e-4)
    top_probs, top_ids = expected_probs.topk(3, dim=-1)
    assert torch.equal(lens.top_ids, top_ids)
    torch.testing.assert_close(lens.top_probs, top_probs, atol=1e-5, rtol=1e-4)
    for layer in range(4):
        for t in range(23):
            assert lens.next_token_prob[layer, t].item() == pytest.approx(
                expected_probs[layer, t, ids[t + 1]].item(), abs=1e-5
            )


# ---- head roles: heads built by hand -----------------------------------------------------------------

T_MAX, VOCAB, SCALE = 16, 64, 200.0  # context, tokens, how sharply the hand-built heads attend


def induction_circuit() -> GPT:
    """Two one-head layers, attention only (MLPs write zeros), learned positions, RMSNorm:
    layer 0 attends to the previous position and writes that token into a "previous token" subspace;
    layer 1 attends to the position whose previous token is the current token (induction).
    Residual layout: [position one-hot (16) | token one-hot (64) | previous token one-hot (64)]."""
    P, V = T_MAX, VOCAB
    C = P + 2 * V
    model = GPT(
        GPTConfig(vocab_size=V, block_size=P, n_layer=2, n_head=1, n_embd=C, norm="rmsnorm", bias=False)
    ).eval()
    pos, tok, prev = slice(0, P), slice(P, P + V), slice(P + V, C)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for module in model.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.weight.fill_(1.0)
        model.transformer.wpe.weight[:, pos] = torch.eye(P)
        model.transformer.wte.weight[:, tok] = torch.eye(V)  # (tied head: the logits read the token)
        shift = torch.diag(torch.ones(P - 1), 1)  # q_i = x_(i+1): position p asks for key p - 1
        layer0 = model.transformer.h[0].attn
        q0, k0, v0 = layer0.c_attn.weight.split(C)  # (C, C) each, y = W x
        q0[pos, pos] = SCALE * shift  # query at position i looks for key position i - 1
        k0[pos, pos] = torch.eye(P)
        v0[tok, tok] = torch.eye(V)
        layer0.c_proj.weight[prev, tok] = torch.eye(V)  # ... and writes its token as "previous token"
        layer1 = model.transformer.h[1].attn
        q1, k1, _ = layer1.c_attn.weight.split(C)
        q1[tok, tok] = SCALE * torch.eye(V)  # query: my token; key: your previous token
        k1[tok, prev] = torch.eye(V)
    return model


def test_previous_token_head_scores_one_on_previous_token_and_none_on_induction():
    roles = head_roles(induction_circuit(), half=T_MAX // 2, batch=16, seed=0)
    assert roles.previous_token[0, 0].item() == pytest.approx(1.0, abs=1e-3)
    assert roles.induction[0, 0].item() < 0.02
    assert roles.duplicate_token[0, 0].item() < 0.02


def test_hand_built_induction_circuit_scores_high_on_induction():
    half = T_MAX // 2
    roles = head_roles(induction_circuit(), half=half, batch=16, seed=0)
    # Expected from the definition: in the second copy, query t's token occurred earlier wherever the
    # random first copy repeats it; the head splits its weight over every key whose previous token matches
    # (position 0 counts its own token as "previous", having none).
    seqs = repeated_tokens(VOCAB, half, 16, 0)
    expected = []
    for seq in seqs.tolist():
        previous = [seq[0], *seq[:-1]]
        for t in range(half, 2 * half):
            matches = [s for s in range(t + 1) if previous[s] == seq[t]]
            expected.append((t - half + 1 in matches) / len(matches))
    assert roles.induction[1, 0].item() == pytest.approx(sum(expected) / len(expected), abs=1e-3)
    assert roles.induction[1, 0].item() > 0.8
    assert roles.previous_token[1, 0].item() < 0.2


def test_scores_follow_their_definitions_on_a_random_model():
    model = random_gpt(3)
    half = 10
    roles = head_roles(model, half=half, batch=4, seed=5)
    seqs = repeated_tokens(model.config.vocab_size, half, 4, 5)
    for layer, att in enumerate(model.attention_weights(seqs)):  # (B, nh, T, T)
        for head in range(model.config.n_head):
            a = att[:, head]
            prev = torch.stack([a[:, t, t - 1] for t in range(1, 2 * half)], 1).mean()
            ind = torch.stack([a[:, t, t - half + 1] for t in range(half, 2 * half)], 1).mean()
            dup = torch.stack([a[:, t, t - half] for t in range(half, 2 * half)], 1).mean()
            assert roles.previous_token[layer, head].item() == pytest.approx(prev.item(), abs=1e-6)
            assert roles.induction[layer, head].item() == pytest.approx(ind.item(), abs=1e-6)
            assert roles.duplicate_token[layer, head].item() == pytest.approx(dup.item(), abs=1e-6)


# ---- ablation: weight surgery in place of hooks --------------------------------------------------------


def plain_loss(model: GPT, windows: torch.Tensor) -> float:
    with torch.no_grad():
        logits, _ = model(windows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()


def test_zero_ablation_equals_removing_the_heads_projection_columns():
    model = random_gpt(4)
    windows = torch.randint(53, (6, 25), generator=torch.Generator().manual_seed(0))
    result = ablate(model, windows, "zero", batch_size=4)
    assert result.base_loss == pytest.approx(plain_loss(model, windows), abs=1e-5)
    hs = model.config.head_size
    for layer, head in [(0, 0), (1, 3), (2, 1)]:
        surgery = random_gpt(4)
        with torch.no_grad():  # head h's output only reaches the stream through these columns
            surgery.transformer.h[layer].attn.c_proj.weight[:, head * hs : (head + 1) * hs] = 0
        expected = plain_loss(surgery, windows) - result.base_loss
        assert result.heads[layer, head].item() == pytest.approx(expected, abs=1e-5)
    surgery = random_gpt(4)
    with torch.no_grad():
        surgery.transformer.h[2].mlp.c_proj.weight.zero_()
        surgery.transformer.h[2].mlp.c_proj.bias.zero_()
    assert result.mlps[2].item() == pytest.approx(plain_loss(surgery, windows) - result.base_loss, abs=1e-5)


def test_mean_ablation_equals_folding_the_heads_mean_into_the_bias():
    model = random_gpt(5)
    windows = torch.randint(53, (6, 25), generator=torch.Generator().manual_seed(1))
    result = ablate(model, windows, "mean", batch_size=4)
    layer, head, hs = 1, 2, model.config.head_size
    cols = slice(head * hs, (head + 1) * hs)
    attn = model.transformer.h[layer].attn
    seen = []  # the head's outputs, read by a hook written here
    handle = attn.c_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0][..., cols]))
    plain_loss(model, windows)
    handle.remove()
    mean = torch.cat([s.reshape(-1, hs) for s in seen]).mean(0)  # (hs,)
    surgery = random_gpt(5)
    with torch.no_grad():  # the head outputs its mean everywhere: a constant through c_proj
        proj = surgery.transformer.h[layer].attn.c_proj
        proj.bias += proj.weight[:, cols] @ mean
        proj.weight[:, cols] = 0
    expected = plain_loss(surgery, windows) - result.base_loss
    assert result.heads[layer, head].item() == pytest.approx(expected, abs=1e-5)


# ---- activation patching -----------------------------------------------------------------------------


def manual_stream(model: GPT, ids: list[int], patch: dict[tuple[int, int], torch.Tensor] | None = None):
    """The forward pass spelled out (learned positions, LayerNorm): the stream entering each block and the
    final norm, with optional overwrites {(layer, position): (C,)}; returns (stream, last logits)."""
    patch = patch or {}
    idx = torch.tensor(ids)
    x = model.transformer.wte.weight[idx] + model.transformer.wpe.weight[: len(ids)]  # (T, C)
    stream = []
    blocks = list(model.transformer.h)
    for layer in range(len(blocks) + 1):
        x = x.clone()
        for (at_layer, position), value in patch.items():
            if at_layer == layer:
                x[position] = value
        stream.append(x)
        if layer == len(blocks):
            break
        b, a = blocks[layer], blocks[layer].attn
        q, k, v = a.c_attn(b.ln_1(x)).split(model.config.n_embd, dim=-1)
        q, k, v = (z.view(len(ids), a.n_head, -1).transpose(0, 1) for z in (q, k, v))  # (nh, T, hs)
        scores = q @ k.transpose(-2, -1) / math.sqrt(a.head_size)
        scores = scores.masked_fill(torch.ones(len(ids), len(ids)).triu(1).bool(), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(0, 1).reshape(len(ids), -1)
        x = x + a.c_proj(y)
        x = x + b.mlp(b.ln_2(x))
    return stream, model.lm_head(model.transformer.ln_f(x))[-1]


@torch.no_grad()
def test_patching_matches_a_forward_pass_patched_by_hand():
    model = random_gpt(6)
    clean = torch.randint(53, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    corrupted = clean.copy()
    corrupted[4] = (clean[4] + 7) % 53
    answer, wrong = 5, 9
    result = activation_patching(model, clean, corrupted, answer, wrong)
    clean_stream, clean_last = manual_stream(model, clean)
    _, corrupted_last = manual_stream(model, corrupted)
    clean_diff = (clean_last[answer] - clean_last[wrong]).item()
    corrupted_diff = (corrupted_last[answer] - corrupted_last[wrong]).item()
    assert result.clean_diff == pytest.approx(clean_diff, abs=1e-4)
    assert result.corrupted_diff == pytest.approx(corrupted_diff, abs=1e-4)
    assert result.recovered.shape == (4, 12)
    for layer, position in [(0, 4), (1, 4), (2, 7), (3, 11), (1, 0)]:
        _, last = manual_stream(model, corrupted, {(layer, position): clean_stream[layer][position]})
        expected = ((last[answer] - last[wrong]).item() - corrupted_diff) / (clean_diff - corrupted_diff)
        assert result.recovered[layer, position].item() == pytest.approx(expected, abs=1e-4)
    # where the two prompts agree nothing differs before the change reaches the position: nothing back
    assert result.recovered[0, :4].abs().max().item() < 1e-5
    assert result.recovered[0, 4].item() == pytest.approx(1.0, abs=1e-4)  # the changed token carries it all
    assert result.recovered[3, 11].item() == pytest.approx(1.0, abs=1e-4)  # the final stream is the output


@torch.no_grad()
def test_patching_every_position_recovers_all_and_patching_none_nothing():
    model = random_gpt(7)
    clean = torch.randint(53, (10,), generator=torch.Generator().manual_seed(4)).tolist()
    corrupted = torch.randint(53, (10,), generator=torch.Generator().manual_seed(5)).tolist()
    answer, wrong = 1, 2
    result = activation_patching(model, clean, corrupted, answer, wrong)
    clean_stream, _ = manual_stream(model, clean)
    everywhere = torch.arange(10)
    for layer in range(4):
        with patch_stream(model, layer, torch.zeros(10, dtype=torch.long), everywhere, clean_stream[layer]):
            diff = logit_diff(model(torch.tensor([corrupted]))[0], answer, wrong).item()
        recovered = (diff - result.corrupted_diff) / (result.clean_diff - result.corrupted_diff)
        assert recovered == pytest.approx(1.0, abs=1e-4)
    unpatched = logit_diff(model(torch.tensor([corrupted]))[0], answer, wrong).item()
    assert unpatched == pytest.approx(result.corrupted_diff, abs=1e-6)  # the hooks are gone


def test_unequal_prompts_and_indistinguishable_answers_are_refused():
    model = random_gpt(8)
    with pytest.raises(ValueError, match="same token length"):
        activation_patching(model, [1, 2, 3], [1, 2], 4, 5)
    with pytest.raises(ValueError, match="nothing to recover"):
        activation_patching(model, [1, 2, 3], [1, 2, 3], 4, 5)


def test_analyses_use_the_models_own_numbers_and_leave_its_mode_alone():
    """Dropout would make every number noisy: each analysis runs in eval mode and restores the mode."""
    with_dropout = random_gpt(9, dropout=0.5)
    plain = random_gpt(9, dropout=0.0)  # the same weights (same seed), no dropout to switch off
    ids = torch.randint(53, (12,), generator=torch.Generator().manual_seed(6)).tolist()
    windows = torch.randint(53, (4, 25), generator=torch.Generator().manual_seed(7))
    with_dropout.train()
    torch.testing.assert_close(logit_lens(with_dropout, ids).probs, logit_lens(plain, ids).probs)
    assert head_roles(with_dropout, half=6).as_dict() == head_roles(plain, half=6).as_dict()
    assert ablate(with_dropout, windows).base_loss == pytest.approx(
        ablate(plain, windows).base_loss, abs=1e-6
    )
    patched = activation_patching(with_dropout, ids, [*ids[:5], 1, *ids[6:]], 2, 3).recovered
    torch.testing.assert_close(
        patched, activation_patching(plain, ids, [*ids[:5], 1, *ids[6:]], 2, 3).recovered
    )
    assert with_dropout.training
