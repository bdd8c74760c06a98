"""The automatic validation share of `data=hf` (val_fraction: null): enough documents for the default
val estimate, within its stated bounds."""

from __future__ import annotations

import pytest

from mini_gpt.data.split import (
    AUTO_VAL_FRACTION_MAX,
    AUTO_VAL_FRACTION_MIN,
    AUTO_VAL_TOKENS,
    auto_val_fraction,
    chars_to_decide,
)


def test_auto_val_fraction_holds_the_estimate_within_bounds() -> None:
    assert AUTO_VAL_FRACTION_MIN == 0.001 and AUTO_VAL_FRACTION_MAX == 0.1  # the documented bounds
    assert auto_val_fraction(2_300_000, 4) == 0.1  # a 2.3 MB corpus: the cap, not 4 documents
    assert auto_val_fraction(100_000_000, 4) == pytest.approx(AUTO_VAL_TOKENS * 4 / 100_000_000)  # 0.52%
    assert auto_val_fraction(10**11, 4) == 0.001  # a big corpus keeps the old default
    assert auto_val_fraction(0, 1) == 0.1
    # one character per token (char tokenizer): a tenth of the characters suffices sooner
    assert auto_val_fraction(5_000_000, 1) == pytest.approx(AUTO_VAL_TOKENS / 5_000_000)


def test_counting_can_stop_where_the_minimum_share_is_enough() -> None:
    limit = chars_to_decide(4)
    assert auto_val_fraction(limit, 4) == AUTO_VAL_FRACTION_MIN
    assert auto_val_fraction(limit - 10_000, 4) > AUTO_VAL_FRACTION_MIN
