"""Shared test fixtures: the read-only corpora, Hydra config composition, torch threads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# CI clones the repo with ../shared beside it; MINI_GPT_SHARED_DATA points elsewhere if needed.
SHARED_DATA = Path(os.environ.get("MINI_GPT_SHARED_DATA", REPO.parent / "shared" / "data"))

# Tests never talk to W&B's servers or block on a login prompt.
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")


def _shared_file(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.is_file():  # a loud failure, never a silent skip
        pytest.fail(f"missing shared test data {path}; set MINI_GPT_SHARED_DATA to the shared/data folder")
    return path


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    """The standard 1,115,394-character tiny Shakespeare corpus (read-only)."""
    return _shared_file("tinyshakespeare", "input.txt")


@pytest.fixture(scope="session")
def gpt2_bpe_file() -> Path:
    """GPT-2's BPE ranks in tiktoken's format (read-only)."""
    return _shared_file("tokenizers", "gpt2.tiktoken")


@pytest.fixture(scope="session")
def compose():
    """`compose(overrides, config_name="train", hydra=False)`: the config a tool would run with, from
    the package's configs (mini_gpt.conf), exactly as the tools compose it."""
    from mini_gpt.conf import compose

    return compose


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a test module's torch ops on one thread, then restore the previous setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
