"""Rotary positions: a rotation per position whose q.k depends only on the distance."""

from __future__ import annotations

import math

import pytest
import torch

from mini_gpt.model.rope import apply_rotary, rotary_tables


def test_scores_depend_only_on_relative_position():
    hs = 8
    cos, sin = rotary_tables(hs, 32)
    q, k = torch.randn(hs), torch.randn(hs)

    def score(p, s):
        qp = apply_rotary(q.view(1, 1, 1, hs), cos[p : p + 1], sin[p : p + 1])
        ks = apply_rotary(k.view(1, 1, 1, hs), cos[s : s + 1], sin[s : s + 1])
        return (qp * ks).sum().item()

    assert score(5, 3) == pytest.approx(score(12, 10), abs=1e-5)
    assert score(20, 0) == pytest.approx(score(25, 5), abs=1e-5)
    assert abs(score(5, 3) - score(5, 4)) > 1e-4


def test_rotation_matches_complex_multiplication():
    """Channel pairs (i, i + hs/2) rotate by angle p * 10000^(-2i/hs), as complex numbers do."""
    hs, p = 6, 7
    cos, sin = rotary_tables(hs, 10)
    x = torch.randn(hs)
    out = apply_rotary(x.view(1, 1, 1, hs), cos[p : p + 1], sin[p : p + 1]).view(hs)
    for i in range(hs // 2):
        theta = p * 10000 ** (-2 * i / hs)
        z = complex(x[i].item(), x[i + hs // 2].item()) * complex(math.cos(theta), math.sin(theta))
        assert out[i].item() == pytest.approx(z.real, abs=1e-5)
        assert out[i + hs // 2].item() == pytest.approx(z.imag, abs=1e-5)


def test_odd_head_size_rejected():
    with pytest.raises(ValueError, match="even"):
        rotary_tables(5, 4)
