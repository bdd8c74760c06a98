"""resume: a run's overrides are recorded; a resumed run composes its saved overrides + the new ones."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from mini_gpt.errors import MiniGPTError
from mini_gpt.train.resume import explicit_model_keys, read_resume, resumed_config, run_overrides

# What read_resume requires of a checkpoint to resume (the optimizer and loop state), empty here.
TRAINING_STATE = {"optimizer_states": [], "loops": {}}

FIRST = ["model=tiny", "optim.lr=7e-3", "trainer.max_steps=6", "seed=7"]


@contextmanager
def hydra_job(compose: Any, overrides: list[str]) -> Iterator[DictConfig]:
    """The job config of `python train.py OVERRIDES`, with HydraConfig set as hydra.main sets it."""
    full = compose(overrides, hydra=True)
    HydraConfig.instance().set_config(full)
    try:
        yield compose(overrides)
    finally:
        HydraConfig.instance().cfg = None


def _checkpoint(path: Path, compose: Any, overrides: list[str] | None, record: bool = True) -> Path:
    """A checkpoint as training writes it: the run's plain unresolved config, and its overrides."""
    config = OmegaConf.to_container(compose(overrides or []), resolve=False)
    torch.save(
        {**TRAINING_STATE, "run_config": config, **({"run_overrides": overrides} if record else {})}, path
    )
    return path


def _resume(compose: Any, ckpt: Path, *overrides: str) -> DictConfig:
    args = [*overrides, f"ckpt_path={ckpt}"]
    return resumed_config(compose(args), read_resume(str(ckpt)), args)


def test_resume_composes_the_saved_overrides_then_the_new(
    compose: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = [*FIRST, "paths.run_dir=/runs/a", "hydra.run.dir=/runs/a", "init_from=gpt2"]
    ckpt = _checkpoint(tmp_path / "last.ckpt", compose, saved)
    restored = _resume(compose, ckpt, "trainer.max_steps=9")
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"resuming {ckpt} with its run's overrides and the command line's; changes from the run's config:",
        "  trainer.max_steps: 6 -> 9",
    ]
    assert restored.trainer.max_steps == 9
    # what the command line did not name continues as the run was started, not the defaults
    assert restored.optim.lr == 7e-3 and compose([]).optim.lr != 7e-3
    assert restored.seed == 7
    assert restored.model.n_layer == compose(["model=tiny"]).model.n_layer != compose([]).model.n_layer
    # the checkpoint, the run directory and init_from are this process's, never the old run's
    assert restored.ckpt_path == str(ckpt) and restored.init_from is None
    assert OmegaConf.to_container(restored.paths)["run_dir"] == "${hydra:runtime.output_dir}"


def test_groups_recipes_and_deletions_compose_as_one_command_line(compose: Any, tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "last.ckpt", compose, FIRST)
    # a group choice: the saved trainer.max_steps=6 still applies on top of it, as on one command line
    cpu = _resume(compose, ckpt, "trainer=cpu")
    assert cpu.trainer.accelerator == "cpu" != compose([]).trainer.accelerator
    assert cpu.trainer.max_steps == 6
    # a recipe: its own keys, except what a saved override sets (its model choice and max_steps lose to
    # the saved model=tiny and trainer.max_steps=6; seed=7 stays: the recipe does not set it)
    recipe = compose(["experiment=shakespeare_char_cpu"])
    run = _resume(compose, ckpt, "experiment=shakespeare_char_cpu")
    assert run.trainer.val_check_interval == recipe.trainer.val_check_interval
    assert recipe.trainer.val_check_interval != compose([]).trainer.val_check_interval
    tiny = compose(["model=tiny"]).model.n_layer
    assert (run.trainer.max_steps, run.seed, run.model.n_layer) == (6, 7, tiny)
    assert "sample_text" not in _resume(compose, ckpt, "~callbacks.sample_text").callbacks


def test_a_checkpoint_without_overrides_resumes_its_saved_config(
    compose: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _checkpoint(tmp_path / "last.ckpt", compose, FIRST, record=False)
    restored = _resume(compose, ckpt, "trainer.max_steps=9", "~callbacks.sample_text")
    assert (restored.trainer.max_steps, restored.optim.lr, restored.seed) == (9, 7e-3, 7)
    assert "sample_text" not in restored.callbacks and restored.ckpt_path == str(ckpt)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"resuming {ckpt} with its run's config (from the checkpoint) and the command line's key=value "
        "changes; changes from the run's config:"
    )
    assert out[1] == "  trainer.max_steps: 6 -> 9"
    assert any(line.startswith("  callbacks.sample_text.prompt:") and "(unset)" in line for line in out)
    with pytest.raises(MiniGPTError, match=r"Could not override 'trainer'.*key=value changes only\)$"):
        _resume(compose, ckpt, "trainer=cpu")


def test_the_checkpoint_is_read_once_into_a_record_with_its_config_else_the_one_beside_it(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("seed: 5\ntrainer:\n  max_steps: 3\n")
    with_config = run / "checkpoints" / "a.ckpt"
    torch.save(
        {**TRAINING_STATE, "global_step": 2, "run_config": {"seed": 9}, "mini_gpt": {"x": 1}}, with_config
    )
    resume = read_resume(str(with_config))
    assert (resume.path, resume.step, resume.meta) == (with_config, 2, {"x": 1})
    assert (resume.run_config, resume.config_source, resume.run_overrides) == (
        {"seed": 9},
        "the checkpoint",
        None,
    )
    without = run / "checkpoints" / "b.ckpt"
    torch.save({**TRAINING_STATE, "global_step": 2}, without)
    resume = read_resume(str(without))
    assert resume.run_config == {"seed": 5, "trainer": {"max_steps": 3}}
    assert resume.config_source == str(run / ".hydra" / "config.yaml")
    elsewhere = tmp_path / "c.ckpt"
    torch.save({**TRAINING_STATE, "global_step": 2}, elsewhere)
    assert read_resume(str(elsewhere)).run_config is None
    assert read_resume(None) is None


def test_no_checkpoint_or_no_saved_config(
    compose: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = compose(["trainer.max_steps=9"])
    assert resumed_config(fresh, None, []) is fresh  # no ckpt_path: nothing to restore
    with pytest.raises(MiniGPTError, match=r"does not exist; pass an existing \.ckpt to resume"):
        read_resume(str(tmp_path / "nope.ckpt"))
    bare = tmp_path / "bare.ckpt"
    torch.save({**TRAINING_STATE, "global_step": 2}, bare)
    cfg = compose([f"ckpt_path={bare}"])
    assert resumed_config(cfg, read_resume(str(bare)), [f"ckpt_path={bare}"]) is cfg
    assert "carries no run config" in capsys.readouterr().out


def test_run_overrides_chain_through_resumes(compose: Any, tmp_path: Path) -> None:
    assert run_overrides(compose(FIRST), None) is None  # library use: no Hydra run, nothing recorded
    with hydra_job(compose, FIRST) as cfg:
        assert run_overrides(cfg, None) == FIRST
    ckpt = _checkpoint(tmp_path / "a.ckpt", compose, [*FIRST, "paths.run_dir=/runs/a"])
    again = ["trainer.max_steps=9", f"ckpt_path={ckpt}"]
    with hydra_job(compose, again) as cfg:
        assert run_overrides(cfg, read_resume(str(ckpt))) == [*FIRST, *again]  # the next resume composes both
    old = _checkpoint(tmp_path / "b.ckpt", compose, FIRST, record=False)
    with hydra_job(compose, [f"ckpt_path={old}"]) as cfg:
        assert run_overrides(cfg, read_resume(str(old))) is None  # what composed that run is unknown


def test_explicit_model_keys(compose: Any) -> None:
    source = "init_from=gpt2"  # a fine-tuning run: the only one whose model keys must fit a source
    assert explicit_model_keys(compose([source, "model.dropout=0.1"])) == {}  # library use
    with hydra_job(compose, ["model.dropout=0.1"]) as cfg:
        assert explicit_model_keys(cfg) == {}  # no init_from: nothing to fit
    with hydra_job(compose, [source]) as cfg:
        assert explicit_model_keys(cfg) == {}
    default_block = compose([]).model.block_size
    with hydra_job(compose, [source, "model.dropout=0.1", f"model.block_size={default_block}"]) as cfg:
        # named on the command line: counted even when the value is the default's
        assert explicit_model_keys(cfg) == {"dropout": 0.1, "block_size": default_block}
    for overrides in (["model=tiny"], ["experiment=shakespeare_char_gpu"]):  # the model config is chosen
        with hydra_job(compose, [source, *overrides]) as cfg:
            assert explicit_model_keys(cfg) == OmegaConf.to_container(cfg.model), overrides
    with hydra_job(compose, ["experiment=finetune_shakespeare"]) as cfg:
        assert explicit_model_keys(cfg) == {}  # the recipe sets no model key: the source's shape stays


def test_a_key_added_since_the_run_with_a_null_value_is_not_a_change() -> None:
    from mini_gpt.train.resume import _config_changes

    before = {"seed": 7, "trainer": {"max_steps": 6}}
    after = {"seed": 7, "threads": None, "trainer": {"max_steps": 9, "new_flag": True}}
    expected = ["trainer.max_steps: 6 -> 9", "trainer.new_flag: (unset) -> True"]
    assert _config_changes(before, after) == expected


BUDGET_RECIPE = "experiment=shakespeare_char_10min"  # sets trainer.budget_s (a time budget)
DROPPED = "trainer.max_steps=1000 given: it replaces trainer.budget_s=600 (the budget, now null)"


def test_a_given_max_steps_beats_a_recipes_budget(compose: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert compose([BUDGET_RECIPE]).trainer.budget_s == 600
    with hydra_job(compose, [BUDGET_RECIPE, "trainer.max_steps=1000"]) as cfg:
        run = resumed_config(cfg, None)
    assert (run.trainer.max_steps, run.trainer.budget_s) == (1000, None)
    assert cfg.trainer.budget_s == 600  # the caller's config is left as it was
    assert capsys.readouterr().out.splitlines() == [DROPPED]
    with hydra_job(compose, [BUDGET_RECIPE]) as cfg:
        assert resumed_config(cfg, None).trainer.budget_s == 600  # no steps given: the budget runs
    # one budget replaces the other: a FLOP budget given over the recipe's time budget, and back
    with hydra_job(compose, [BUDGET_RECIPE, "trainer.max_flops=1e12"]) as cfg:
        run = resumed_config(cfg, None)
    assert (run.trainer.max_flops, run.trainer.budget_s) == (1e12, None)
    assert capsys.readouterr().out.splitlines() == [
        "trainer.max_flops=1e+12 given: it replaces trainer.budget_s=600 (the budget, now null)"
    ]
    with hydra_job(compose, ["trainer.max_flops=1e12", "trainer.budget_s=30"]) as cfg:
        run = resumed_config(cfg, None)
    assert (run.trainer.max_flops, run.trainer.budget_s) == (None, 30)
    assert "it replaces trainer.max_flops=1e+12" in capsys.readouterr().out
    # the later of the two wins, as on one command line
    with hydra_job(compose, ["trainer.max_steps=5", "trainer.max_flops=1e9"]) as cfg:
        assert resumed_config(cfg, None).trainer.max_flops == 1e9
    assert capsys.readouterr().out == ""


def test_a_run_that_gave_max_steps_over_a_budget_resumes_from_the_checkpoint_alone(
    compose: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = [BUDGET_RECIPE, "trainer.max_steps=1000"]
    ckpt = tmp_path / "last.ckpt"
    with hydra_job(compose, saved) as cfg:  # the config the run trained with, as its checkpoint holds it
        ran = OmegaConf.to_container(resumed_config(cfg, None), resolve=False)
    torch.save({**TRAINING_STATE, "global_step": 736, "run_config": ran, "run_overrides": saved}, ckpt)
    capsys.readouterr()
    restored = _resume(compose, ckpt)  # `resume with: ... ckpt_path=...` and nothing else
    assert (restored.trainer.max_steps, restored.trainer.budget_s) == (1000, None)
    assert capsys.readouterr().out.splitlines()[-1] == "  (none: the run continues as it was started)"
    # a budget run resumed with a step count: the steps win, and the change is printed
    longer = _resume(compose, _checkpoint(ckpt, compose, [BUDGET_RECIPE]), "trainer.max_steps=20000")
    assert (longer.trainer.max_steps, longer.trainer.budget_s) == (20000, None)
    assert "  trainer.budget_s: 600.0 -> None" in capsys.readouterr().out.splitlines()
