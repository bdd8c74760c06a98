"""The tier markers follow the folders, so `-m "not slow"` is exactly tests/unit (checked on whatever this
session collected: the whole suite in CI)."""

from __future__ import annotations

import pytest

EXPECTED = {
    "unit": set(),
    "integration": {"integration", "slow"},
    "e2e": {"e2e", "slow"},
    "learn": {"learn", "slow"},  # docs/learn: the guide's chapters (docs/learn/conftest.py marks them)
}


def test_every_collected_test_carries_its_folders_markers(request: pytest.FixtureRequest) -> None:
    tiers = set()
    for item in request.session.items:
        tier = item.path.parent.name
        assert tier in EXPECTED, (
            f"{item.nodeid}: tests live in tests/unit, tests/integration, tests/e2e or docs/learn"
        )
        markers = {m.name for m in item.iter_markers()} & {"unit", "integration", "e2e", "learn", "slow"}
        assert markers == EXPECTED[tier], f"{item.nodeid} is marked {sorted(markers)}"
        tiers.add(tier)
    assert "unit" in tiers
