"""conf: every tool's --help shows that tool's own keys with their comments, and only real groups; the
output-directory guard Hydra runs before it creates a run directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mini_gpt.conf import CONF_DIR
from mini_gpt.conf.guards import WritableOutputDir, check_writable

REPO = Path(__file__).resolve().parents[1]


def _help(*argv: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, *argv, "--help"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""
    return proc.stdout


def _own_keys(config_name: str) -> dict[str, str]:
    """{top-level key: its comment} read from the YAML text (the reference, independent of the help)."""
    content = yaml.safe_load((CONF_DIR / f"{config_name}.yaml").read_text())
    keys = {k for k in content if k not in ("defaults", "hydra")}
    comments = {}
    for line in (CONF_DIR / f"{config_name}.yaml").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in keys and not line.startswith((" ", "#")):
            comments[key] = line.split(" #", 1)[1].strip() if " #" in line else ""
    assert set(comments) == keys
    return comments


@pytest.mark.parametrize("tool", ["generate", "export", "visualize"])
def test_tool_help_lists_its_own_keys_with_comments(tool: str, tmp_path: Path) -> None:
    out = _help("-m", f"mini_gpt.{tool}", cwd=tmp_path)
    lines = out.splitlines()
    for key, comment in _own_keys(tool).items():
        line = next((x for x in lines if x.startswith(f"{key}:")), None)
        assert line is not None, (key, out)
        assert comment in line
    # nothing of the training config or of Hydra's plumbing
    train_groups = {d.name for d in CONF_DIR.iterdir() if d.is_dir() and not d.name.startswith("_")}
    assert not [x for x in lines if x.split(":")[0].strip() in train_groups - set(_own_keys(tool))]
    assert "Configuration groups" not in out and "Powered by Hydra" not in out
    assert "hydra" not in out.lower().replace("hydra_", "")


def test_train_help_lists_the_groups_of_its_defaults_and_no_sweep(tmp_path: Path) -> None:
    out = _help(str(REPO / "train.py"), cwd=tmp_path)
    defaults = yaml.safe_load((CONF_DIR / "train.yaml").read_text())["defaults"]
    groups = [next(iter(e)) for e in defaults if isinstance(e, dict) and next(iter(e)) != "hydra"]
    listed = {}
    for line in out.split("Options of each group", 1)[1].splitlines()[1:]:
        if line.startswith("  ") and ":" in line:
            group, options = line.strip().split(":", 1)
            listed[group] = [o.strip() for o in options.split(",")]
    assert listed == {g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml")) for g in groups}
    assert "sweep" not in listed and (CONF_DIR / "sweep").is_dir()  # W&B sweep specs are no Hydra group
    for key, comment in _own_keys("train").items():
        assert any(x.startswith(f"{key}:") for x in out.splitlines()), key
        assert comment in out


def test_writable_output_dir_passes(tmp_path: Path) -> None:
    check_writable(tmp_path / "outputs" / "train" / "runs" / "x", "hydra.run.dir")  # no exit
    assert not (tmp_path / "outputs").exists()  # only checked, never created


def test_read_only_output_dir_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    # Simulated: tests run as root, which may write anywhere except on a read-only file system.
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    with pytest.raises(SystemExit) as info:
        check_writable(tmp_path / "outputs" / "run", "hydra.run.dir")
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: cannot create the output directory {tmp_path / 'outputs' / 'run'}: {tmp_path} is read-only "
        "or not writable by you; set paths.output_dir=... (or hydra.run.dir=...) to a writable directory"
    ]


def test_output_dir_under_a_file_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        check_writable(tmp_path / "file" / "run", "hydra.sweep.dir")
    assert f"{tmp_path / 'file'} is not a directory" in capsys.readouterr().err


def test_train_config_runs_the_guard(compose) -> None:
    cfg = compose(["model=tiny"], hydra=True)
    targets = [c["_target_"] for c in cfg.hydra.callbacks.values()]
    assert f"{WritableOutputDir.__module__}.{WritableOutputDir.__name__}" in targets


def test_configs_sit_at_the_top_of_the_checkout() -> None:
    assert CONF_DIR == REPO / "conf" and (CONF_DIR / "train.yaml").is_file()


def test_the_wheel_lists_every_package_and_ships_conf() -> None:
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "mini_gpt").rglob("__init__.py")
    }
    assert on_disk | {"mini_gpt.configs"} == set(setuptools["packages"])
    assert setuptools["package-dir"] == {"mini_gpt.configs": "conf"}
