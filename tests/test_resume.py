"""resume: a resumed run gets its own saved config plus only what the command line names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from mini_gpt.conf import CONF_DIR
from mini_gpt.errors import MiniGPTError
from mini_gpt.resume import restore_run_config, resumed_config, saved_run_config

CKPT = "ckpt_path=/runs/a/checkpoints/last.ckpt"


def _saved(compose: Any, overrides: list[str]) -> dict[str, Any]:
    """A run's config as training saves it: plain and unresolved."""
    return OmegaConf.to_container(compose(overrides), resolve=False)  # type: ignore[return-value]


def test_restores_the_run_and_applies_only_the_named_keys(compose: Any) -> None:
    saved = _saved(compose, ["model=tiny", "optim.lr=7e-3", "trainer.max_steps=6", "seed=7"])
    overrides = ["trainer.max_steps=9", CKPT]
    restored, changes = restore_run_config(saved, compose(overrides), overrides)
    assert changes == ["trainer.max_steps: 6 -> 9"]
    assert restored.trainer.max_steps == 9
    # what the command line did not name continues as the run was started, not the defaults
    assert restored.optim.lr == 7e-3 and compose([]).optim.lr != 7e-3
    assert restored.seed == 7
    assert restored.model.n_layer == compose(["model=tiny"]).model.n_layer != compose([]).model.n_layer
    assert restored.ckpt_path == "/runs/a/checkpoints/last.ckpt"


def test_a_group_override_replaces_the_whole_group(compose: Any) -> None:
    saved = _saved(compose, ["trainer.max_steps=6", "trainer.log_every_n_steps=1"])
    overrides = ["trainer=cpu", CKPT]
    current = compose(overrides)
    restored, changes = restore_run_config(saved, current, overrides)
    trainer = OmegaConf.to_container(current.trainer, resolve=False)
    assert OmegaConf.to_container(restored.trainer, resolve=False) == trainer
    differ = {f"trainer.{k}" for k, v in saved["trainer"].items() if trainer.get(k) != v}
    assert differ >= {"trainer.max_steps", "trainer.log_every_n_steps"}
    assert {line.split(":")[0] for line in changes} == differ
    assert f"trainer.max_steps: 6 -> {trainer['max_steps']}" in changes


def test_a_global_recipe_sets_its_own_keys_only(compose: Any) -> None:
    recipe = yaml.safe_load((CONF_DIR / "experiment" / "shakespeare_char_cpu.yaml").read_text())
    saved = _saved(compose, ["seed=7", "trainer.max_steps=6"])
    overrides = ["experiment=shakespeare_char_cpu", CKPT]
    restored, _ = restore_run_config(saved, compose(overrides), overrides)
    assert restored.trainer.max_steps == recipe["trainer"]["max_steps"]
    assert restored.seed == 7  # the recipe does not set the seed: the run's own stays
    assert "seed" not in recipe


def test_deleting_a_key_and_the_new_run_dir(compose: Any) -> None:
    saved = _saved(compose, ["paths.run_dir=/runs/a"])
    overrides = ["~callbacks.sample_text", CKPT]
    restored, changes = restore_run_config(saved, compose(overrides), overrides)
    assert "sample_text" not in restored.callbacks
    assert any(line.startswith("callbacks.sample_text.prompt:") and "(unset)" in line for line in changes)
    # the run directory is always this process's (Hydra's), never the old run's
    assert OmegaConf.to_container(restored.paths)["run_dir"] == "${hydra:runtime.output_dir}"


def test_saved_config_from_the_checkpoint_else_beside_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("seed: 5\ntrainer:\n  max_steps: 3\n")
    with_config = run / "checkpoints" / "a.ckpt"
    torch.save({"global_step": 2, "run_config": {"seed": 9}}, with_config)
    assert saved_run_config(with_config) == ({"seed": 9}, "the checkpoint")
    without = run / "checkpoints" / "b.ckpt"
    torch.save({"global_step": 2}, without)
    config, source = saved_run_config(without)
    assert config == {"seed": 5, "trainer": {"max_steps": 3}}
    assert source == str(run / ".hydra" / "config.yaml")
    elsewhere = tmp_path / "c.ckpt"
    torch.save({"global_step": 2}, elsewhere)
    assert saved_run_config(elsewhere) == (None, "")


def test_resumed_config_announces_the_changes(
    compose: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "last.ckpt"
    torch.save({"run_config": _saved(compose, ["trainer.max_steps=6"])}, ckpt)
    overrides = ["trainer.max_steps=9", "optim.lr=1e-3", f"ckpt_path={ckpt}"]
    cfg = resumed_config(compose(overrides), overrides)
    assert cfg.trainer.max_steps == 9
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"resuming {ckpt} with its run's config (from the checkpoint); command-line changes:"
    default_lr = compose([]).optim.lr
    assert out[1:] == [f"  optim.lr: {default_lr} -> 0.001", "  trainer.max_steps: 6 -> 9"]
    fresh = compose(["trainer.max_steps=9"])
    assert resumed_config(fresh, []) is fresh  # no ckpt_path: nothing to restore
    with pytest.raises(MiniGPTError, match=r"does not exist; pass an existing \.ckpt to resume"):
        resumed_config(compose([f"ckpt_path={tmp_path / 'nope.ckpt'}"]), [])
