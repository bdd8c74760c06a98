"""Optimizer groups, AdamW/Muon construction and the LR schedule, against hand-written references."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from mini_gpt.conf import checked_config
from mini_gpt.conf.train import OptimConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.train.optim import (
    CombinedOptimizer,
    build_optimizer,
    build_scheduler,
    lr_at,
    param_groups,
)


def _model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=17, block_size=16, **overrides))


@pytest.mark.parametrize(
    ("step", "schedule", "expected"),
    [
        # lr=1.0, min_lr=0.1, warmup=10, decay_steps=110 (100 decay steps), by the textbook formulas
        (0, "cosine", 1.0 / 10),
        (4, "cosine", 5.0 / 10),
        (9, "cosine", 1.0),
        (10, "cosine", 1.0),
        (60, "cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))),
        (35, "cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25))),
        (110, "cosine", 0.1),
        (500, "cosine", 0.1),
        (60, "linear", 0.1 + 0.9 * 0.5),
        (85, "linear", 0.1 + 0.9 * 0.25),
        (500, "linear", 0.1),
        (3, "constant", 0.4),
        (500, "constant", 1.0),
    ],
)
def test_lr_schedule_matches_formula(step: int, schedule: str, expected: float) -> None:
    assert lr_at(step, 1.0, 0.1, 10, 110, schedule) == pytest.approx(expected, rel=1e-12)


def test_lambda_lr_follows_schedule_per_optimizer_step() -> None:
    model = _model()
    cfg = OptimConfig(lr=2e-3, min_lr_ratio=0.1, warmup_steps=5, schedule="cosine")
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, max_steps=50)
    seen = []
    for _ in range(60):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [lr_at(s, 2e-3, 2e-4, 5, 50, "cosine") for s in range(60)]
    assert seen == pytest.approx(expected, rel=1e-9)


def test_weight_decay_groups() -> None:
    model = _model(tie_weights=False)
    groups = param_groups(model, weight_decay=0.1)
    decay = {n for n, _ in groups["decay"]}
    no_decay = {n for n, _ in groups["no_decay"]}
    # Independent reference: every Linear weight decays; everything else does not.
    linear_weights = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert decay == linear_weights
    assert "lm_head.weight" in decay
    assert {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight"} <= no_decay
    assert all(n.endswith(".bias") or "ln" in n or "wte" in n or "wpe" in n for n in no_decay)
    assert decay.isdisjoint(no_decay)
    assert len(decay) + len(no_decay) == len(list(model.parameters()))


def test_embeddings_decay_when_configured_and_tied_weight_counted_once() -> None:
    model = _model()  # lm_head tied to wte
    groups = param_groups(model, weight_decay=0.1, decay_embeddings=True)
    names = [n for g in groups.values() for n, _ in g]
    assert len(names) == len(set(id(p) for p in model.parameters()))
    assert {"transformer.wte.weight", "transformer.wpe.weight"} <= {n for n, _ in groups["decay"]}
    opt = build_optimizer(model, OptimConfig(weight_decay=0.1, decay_embeddings=False))
    by_name = {g["group"]: g for g in opt.param_groups}
    assert by_name["decay"]["weight_decay"] == 0.1
    assert by_name["no_decay"]["weight_decay"] == 0.0
    wte = model.transformer.wte.weight
    assert any(p is wte for p in by_name["no_decay"]["params"])


def test_adamw_uses_fused_or_foreach() -> None:
    opt = build_optimizer(_model(), OptimConfig())
    assert isinstance(opt, torch.optim.AdamW)
    assert all(g["fused"] or g["foreach"] for g in opt.param_groups)


def test_muon_takes_hidden_matrices_only_and_state_round_trips() -> None:
    model = _model()
    cfg = OptimConfig(name="muon", lr=1e-3, muon_lr=0.02)
    opt = build_optimizer(model, cfg)
    assert isinstance(opt, CombinedOptimizer)
    muon_group = next(g for g in opt.param_groups if g["group"] == "muon")
    hidden = {
        id(m.weight) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".h." in name
    }
    assert {id(p) for p in muon_group["params"]} == hidden
    assert muon_group["lr"] == 0.02
    sched = build_scheduler(opt, cfg, max_steps=20)
    x = torch.randint(0, 17, (2, 8))

    def step(o: torch.optim.Optimizer, s: object) -> None:
        model(x)[0].logsumexp(-1).mean().backward()
        o.step()
        o.zero_grad()
        s.step()  # type: ignore[attr-defined]

    for _ in range(3):
        step(opt, sched)
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    saved_sched = copy.deepcopy(sched.state_dict())
    step(opt, sched)
    after_one = copy.deepcopy(model.state_dict())
    # Restore into fresh objects: the next step must reproduce exactly.
    model.load_state_dict(saved_model)
    opt2 = build_optimizer(model, cfg)
    sched2 = build_scheduler(opt2, cfg, max_steps=20)
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(saved_sched)
    assert opt2.optimizers[1].state is opt2.state  # children see the restored state
    step(opt2, sched2)
    for k, v in after_one.items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=0, atol=0)


def test_config_errors_are_one_line_user_errors() -> None:
    with pytest.raises(MiniGPTError, match=r"optim\.name"):
        OptimConfig(name="sgd")
    with pytest.raises(MiniGPTError, match=r"min_lr_ratio=1.5 must be in \[0, 1\]"):
        OptimConfig(lr=1e-3, min_lr_ratio=1.5)
    # A typo, or the old absolute min_lr, lists the keys there are (min_lr_ratio among them).
    for typo in ("lrr", "min_lr"):
        with pytest.raises(
            MiniGPTError, match=rf"^optim: unknown key '{typo}'; the keys are name, lr, min_lr_ratio"
        ):
            checked_config(OptimConfig, {"lr": 1e-3, typo: 2}, "optim")
