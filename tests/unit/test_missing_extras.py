"""A feature whose optional extra is not installed: one line with the `pip install -e ".[extra]"` to run,
never a traceback or a ModuleNotFoundError inside the line. Each test hides the package (None in
sys.modules makes its import fail) and drops the modules that imported it, then restores both."""

from __future__ import annotations

import importlib
import sys

import pytest

from mini_gpt.data.sources import Source, iter_texts
from mini_gpt.errors import MiniGPTError


def hide(monkeypatch: pytest.MonkeyPatch, *packages: str, forget: tuple[str, ...] = ()) -> None:
    for name in packages:
        monkeypatch.setitem(sys.modules, name, None)
    for name in forget:
        monkeypatch.delitem(sys.modules, name, raising=False)
        # `from package import module` finds a module imported earlier as the package's attribute.
        parent, _, child = name.rpartition(".")
        monkeypatch.delattr(importlib.import_module(parent), child, raising=False)


def test_parquet_without_pyarrow(monkeypatch, tmp_path) -> None:
    hide(monkeypatch, "pyarrow", "pyarrow.parquet")
    path = tmp_path / "a.parquet"
    path.write_bytes(b"PAR1")  # never opened: the import fails first
    source = Source("a.parquet", None, "train", "text", "parquet", (str(path),), "f", None)
    with pytest.raises(MiniGPTError) as err:
        next(iter_texts(source))
    msg = str(err.value)
    assert 'pip install -e ".[datasets]"' in msg and "ModuleNotFound" not in msg and "\n" not in msg


def test_harness_without_lm_eval(monkeypatch, capsys) -> None:
    hide(monkeypatch, "lm_eval", forget=("mini_gpt.eval.harness",))
    from mini_gpt.cli.harness import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "mini-gpt", "--tasks", "arc_easy"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and 'pip install -e ".[eval]"' in line


def test_serve_without_fastapi(monkeypatch) -> None:
    hide(monkeypatch, "fastapi", "uvicorn")
    from mini_gpt.cli.serve import build
    from mini_gpt.conf.tools import ServeConfig

    with pytest.raises(MiniGPTError) as err:
        build(ServeConfig(ckpt="never-read.ckpt"))
    msg = str(err.value)
    assert 'pip install -e ".[serve]"' in msg and "ModuleNotFound" not in msg and "\n" not in msg
