"""LoRA through peft on our GPT: what trains, the parameter count, merging, tied weights."""

from __future__ import annotations

import pytest
import torch

from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.lora import LoraSpec, add_lora, has_lora_weights, merge_lora
from mini_gpt.model.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=61, block_size=16, n_layer=2, n_head=2, n_embd=16)
TARGETS = tuple(
    f"transformer.h.{i}.{m}"
    for i in range(2)
    for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
)


def _adapted(spec: LoraSpec | None = None) -> tuple[GPT, GPT]:
    spec = spec or LoraSpec(TARGETS, rank=4, alpha=8.0, dropout=0.0)
    torch.manual_seed(0)
    base = GPT(CONFIG)
    model = GPT(CONFIG)
    model.load_state_dict(base.state_dict())
    add_lora(model, spec)
    with torch.no_grad():  # B starts at zero; give the adapters something to merge
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)
    return base, model


def test_only_adapters_train_and_count_is_r_times_in_plus_out() -> None:
    _, model = _adapted()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    C, r = CONFIG.n_embd, 4
    # per block: c_attn C->3C, attn.c_proj C->C, c_fc C->4C, mlp.c_proj 4C->C; A is (r, in), B is (out, r)
    expected = CONFIG.n_layer * r * ((C + 3 * C) + (C + C) + (C + 4 * C) + (4 * C + C))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    assert has_lora_weights(model.state_dict()) and not has_lora_weights(GPT(CONFIG).state_dict())


def test_starts_at_the_base_model() -> None:
    torch.manual_seed(0)
    base = GPT(CONFIG)
    model = GPT(CONFIG)
    model.load_state_dict(base.state_dict())
    add_lora(model, LoraSpec(TARGETS, dropout=0.0))
    idx = torch.randint(0, CONFIG.vocab_size, (2, 8))
    assert torch.equal(model(idx)[0], base(idx)[0])  # B = 0: exactly the pretrained function


def test_merge_equals_adapter_model_and_plain_math() -> None:
    base, model = _adapted()
    idx = torch.randint(0, CONFIG.vocab_size, (2, 12))
    merged = merge_lora(CONFIG, LoraSpec(TARGETS, rank=4, alpha=8.0, dropout=0.0), model.state_dict())
    assert type(merged) is GPT and not has_lora_weights(merged.state_dict())
    assert merged.lm_head.weight is merged.transformer.wte.weight
    torch.testing.assert_close(merged(idx)[0], model(idx)[0], atol=1e-5, rtol=0)
    # W' = W + (alpha / r) B A, written out for one projection
    sd = model.state_dict()
    prefix = "transformer.h.1.mlp.c_fc"
    W = sd[f"{prefix}.base_layer.weight"]
    A, B = sd[f"{prefix}.lora_A.default.weight"], sd[f"{prefix}.lora_B.default.weight"]
    torch.testing.assert_close(merged.state_dict()[f"{prefix}.weight"], W + (8.0 / 4) * B @ A)
    assert torch.equal(merged.transformer.wte.weight, base.transformer.wte.weight)


def test_subset_of_targets_and_bad_inputs() -> None:
    _, model = _adapted(LoraSpec(("transformer.h.1.attn.c_attn",), rank=2, dropout=0.0))
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == [
        "transformer.h.1.attn.c_attn.lora_A.default.weight",
        "transformer.h.1.attn.c_attn.lora_B.default.weight",
    ]
    with pytest.raises(MiniGPTError, match=r"transformer\.h\.7\.attn\.c_attn.*do not exist"):
        add_lora(GPT(CONFIG), LoraSpec(("transformer.h.7.attn.c_attn",)))
    _, adapted = _adapted()
    with pytest.raises(
        MiniGPTError, match=r"do not match the recorded adapters \(missing .*mlp\.c_fc\.weight"
    ):
        merge_lora(CONFIG, LoraSpec(TARGETS[:2], rank=4), adapted.state_dict())
    with pytest.raises(MiniGPTError, match=r"do not match the recorded adapters.*size mismatch"):
        merge_lora(CONFIG, LoraSpec(TARGETS, rank=8), adapted.state_dict())
    assert LoraSpec.from_dict(LoraSpec(TARGETS).to_dict()) == LoraSpec(TARGETS)


@pytest.mark.parametrize("name", ["muon", "adamw"])
def test_lora_trains_with_either_optimizer(name: str) -> None:
    """Under Muon every adapter is a hidden matrix and AdamW owns nothing: the optimizer must still build
    (torch refuses an empty parameter list), own each adapter exactly once, and move the adapters."""
    from mini_gpt.conf.train import OptimConfig
    from mini_gpt.train.optim import build_optimizer

    _, model = _adapted()
    opt = build_optimizer(model, OptimConfig(name=name, warmup_steps=0))
    owned = [id(p) for g in opt.param_groups for p in g["params"]]
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    assert sorted(owned) == sorted(trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.randint(0, CONFIG.vocab_size, (2, 8)))[0].logsumexp(-1).mean().backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {n for n, p in model.named_parameters() if p.requires_grad}
