"""Shared test fixtures (the repository's own copies of the read-only corpora, the prepared char data,
Hydra config composition, torch threads) and the tier markers.

Everything a test reads ships with the repository (data/), so `pytest` passes on a plain clone with
no network and nothing beside the checkout.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from helpers import REPO

# Published hashes (karpathy/char-rnn's input.txt; tiktoken's pin for r50k_base.tiktoken).
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"

# Tests never talk to W&B's servers or block on a login prompt.
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")


def _repo_file(relative: str, sha256: str) -> Path:
    path = REPO / relative
    if not path.is_file():  # a loud failure, never a silent skip
        pytest.fail(f"missing {path}: it ships with the repository; restore it with `git checkout -- data/`")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        pytest.fail(f"{path} has sha256 {digest}, expected {sha256}; restore it with `git checkout -- data/`")
    return path


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    """The standard 1,115,394-character tiny Shakespeare corpus (read-only)."""
    return _repo_file("data/tinyshakespeare/input.txt", SHAKESPEARE_SHA256)


@pytest.fixture(scope="session")
def gpt2_bpe_file() -> Path:
    """GPT-2's BPE ranks in tiktoken's format (read-only)."""
    return _repo_file("data/tokenizers/gpt2.tiktoken", GPT2_RANKS_SHA256)


@pytest.fixture(scope="session")
def char_data_dir(tmp_path_factory: pytest.TempPathFactory, shakespeare_path: Path) -> Path:
    """Tiny Shakespeare prepared for the char model once per session, in a private cache folder."""
    from mini_gpt.data import DataConfig, prepare_data

    root = tmp_path_factory.getbasetemp() / "mini_gpt_char_cache"
    prepare_data(DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(root)))
    return root


@pytest.fixture(scope="session")
def compose():
    """`compose(overrides, config_name="train", hydra=False)`: the config a tool would run with, from
    the package's configs (mini_gpt.conf), exactly as the tools compose it."""
    from mini_gpt.conf import compose

    return compose


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Per-machine measurements (the CPU's peak FLOP/s for MFU) go to a session folder, not ~/.cache."""
    before = os.environ.get("MINI_GPT_CACHE_DIR")
    os.environ["MINI_GPT_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if before is None:
        os.environ.pop("MINI_GPT_CACHE_DIR", None)
    else:
        os.environ["MINI_GPT_CACHE_DIR"] = before


@pytest.fixture(scope="session", autouse=True)
def one_thread_in_child_processes():
    """The commands tests start run torch on one thread: on a machine busy with other work (pytest
    itself, a build beside it) their stderr would otherwise carry the busy-machine note (tested on its
    own), and two threads next to pytest's on two cores only wait for each other."""
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    if before is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = before


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a test module's torch ops on one thread, then restore the previous setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The tiers are folders: tests/unit (no Trainer, no subprocess; the fast tier), tests/integration and
# tests/e2e, whose tests are marked here so `-m "not slow"` or `-m e2e` select by tier.
TIER_MARKERS = {"integration": ("integration", "slow"), "e2e": ("e2e", "slow")}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in TIER_MARKERS.get(item.path.parent.name, ()):
            item.add_marker(marker)
