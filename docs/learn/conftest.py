"""Runs the guide's chapters as tests: each chapter's ```python blocks in order, in one namespace, with Sybil
(a pytest plugin that reads code blocks out of Markdown and reports a failing one by file and line). A
chapter's numbers are asserted in its blocks, so the guide cannot drift from the code.

Pictures go to a temporary folder; `MINI_GPT_LEARN_FIGURES=docs/img/learn pytest docs/learn` rewrites the
checked-in ones."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

_SCRATCH = Path(tempfile.mkdtemp(prefix="mini-gpt-learn-"))
_saved_env: dict[str, str | None] = {}


def _start_chapter(namespace: dict[str, Any]) -> None:
    namespace["figures"] = Path(os.environ.get("MINI_GPT_LEARN_FIGURES") or _SCRATCH)  # a chapter's pictures
    # A reader prepares data/ in the checkout, as `python train.py` does; the tests use a scratch folder.
    _saved_env["MINI_GPT_DATA_DIR"] = os.environ.get("MINI_GPT_DATA_DIR")
    os.environ["MINI_GPT_DATA_DIR"] = os.environ.get("MINI_GPT_DATA_DIR") or str(_SCRATCH / "data")


def _end_chapter(namespace: dict[str, Any]) -> None:
    for key, value in _saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser()], patterns=["*.md"], setup=_start_chapter, teardown=_end_chapter
).pytest()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent == Path(__file__).parent:  # chapters train small models: not the unit tier
            item.add_marker("learn")
            item.add_marker("slow")
