"""mini_gpt.train.muon: bit-equal to torch.optim.Muon in bfloat16, and its float32 Newton-Schulz against a
float64 quintic iteration written out here."""

from __future__ import annotations

import pytest
import torch

from mini_gpt.conf.train import OptimConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.train.muon import Muon


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=gen)) for shape in [(24, 8), (8, 24), (16, 16)]]


def _run(opt_cls: type, params: list[torch.nn.Parameter], steps: int = 4, **kwargs: object) -> None:
    opt = opt_cls(params, **kwargs)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw"])
def test_bfloat16_equals_torch_muon(nesterov: bool, adjust_lr_fn: str | None) -> None:
    kwargs = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    ours, theirs = _params(), _params()
    _run(Muon, ours, ns_dtype="bfloat16", **kwargs)
    _run(torch.optim.Muon, theirs, **kwargs)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def _reference_step(
    w: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor, lr: float, weight_decay: float = 0.0
) -> torch.Tensor:
    """One Nesterov Muon step in float64: momentum 0.95, the quintic (3.4445, -4.7750, 2.0315) x 5, lr x
    sqrt(max(1, rows/cols)); decoupled decay: the weights shrink by lr x weight_decay first."""
    buf.mul_(0.95).add_(grad, alpha=0.05)
    g = 0.05 * grad + 0.95 * buf
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / torch.linalg.matrix_norm(x)
    for _ in range(5):
        a = x @ x.T
        x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
    x = x.T if g.shape[0] > g.shape[1] else x
    return w * (1 - lr * weight_decay) - lr * max(1.0, w.shape[0] / w.shape[1]) ** 0.5 * x


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])  # 0.1: the 10-minute record's optim.muon_weight_decay
def test_float32_follows_a_float64_reference_closer_than_bfloat16(weight_decay: float) -> None:
    expected = [p.detach().double() for p in _params()]
    bufs = [torch.zeros_like(p) for p in expected]
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        for i, p in enumerate(expected):
            grad = torch.randn(p.shape, generator=gen).double()
            expected[i] = _reference_step(p, grad, bufs[i], 0.02, weight_decay)
    errors = {}
    for dtype in ("float32", "bfloat16"):
        params = _params()
        _run(Muon, params, ns_dtype=dtype, lr=0.02, weight_decay=weight_decay)
        pairs = zip(params, expected, strict=True)
        errors[dtype] = max((p.double() - e).abs().max().item() for p, e in pairs)
    assert errors["float32"] < 1e-5
    assert errors["bfloat16"] > 1e-4  # the reference can tell the two apart


def test_auto_is_float32_on_a_cpu_without_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mini_gpt.train.muon.cpu_has_native_bf16", lambda: False)
    assert Muon(_params(), ns_dtype="auto").dtype_for(torch.device("cpu")) == torch.float32
    assert Muon(_params(), ns_dtype="auto").dtype_for(torch.device("meta", 0)) == torch.bfloat16  # not a CPU
    monkeypatch.setattr("mini_gpt.train.muon.cpu_has_native_bf16", lambda: True)
    assert Muon(_params(), ns_dtype="auto").dtype_for(torch.device("cpu")) == torch.bfloat16
    assert Muon(_params(), ns_dtype="float32").dtype_for(torch.device("meta", 0)) == torch.float32


def test_checkpoint_state_loads_into_torch_muon_and_back() -> None:
    ours = Muon(_params(), ns_dtype="float32")
    _run(Muon, list(ours.param_groups[0]["params"]), steps=1)
    theirs = torch.optim.Muon(_params())
    theirs.load_state_dict(ours.state_dict())
    assert ours.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]


def test_unknown_dtype_is_one_error() -> None:
    with pytest.raises(MiniGPTError, match=r"optim\.muon_ns_dtype"):
        OptimConfig(muon_ns_dtype="float16")
