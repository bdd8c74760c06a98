"""`mini-gpt sweep`'s pieces without training: the search space grammar, the optimizer-aware search of
lr_search, the stored study's search-space check, pruners, the pruning report, the trials table, and the
FLOP budget's step count."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
import torch
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from mini_gpt.errors import MiniGPTError
from mini_gpt.train.run import budget_steps, flops_per_token
from mini_gpt.train.sweep import (
    ReportValLoss,
    StudySettings,
    distribution,
    make_pruner,
    open_study,
    searched_params,
    study_settings,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("interval(0.0, 0.3)", FloatDistribution(0.0, 0.3)),
        ("tag(log, interval(1e-4, 3e-2))", FloatDistribution(1e-4, 3e-2, log=True)),
        ("choice(0, 25, 50)", CategoricalDistribution((0, 25, 50))),
        ("range(2, 6)", IntDistribution(2, 5)),  # Python's range: the end is excluded
        ("range(2, 10, 4)", IntDistribution(2, 6, step=4)),  # 2, 6
    ],
)
def test_hydra_sweep_grammar_becomes_optuna_distributions(spec: str, expected: Any) -> None:
    assert distribution("optim.lr", spec) == expected


@pytest.mark.parametrize("spec", ["0.1", "interval(0.1", "glob(*)"])
def test_a_value_that_is_not_a_search_range_is_one_line(spec: str) -> None:
    with pytest.raises(MiniGPTError, match=r"hparams_search.params.optim.lr="):
        distribution("optim.lr", spec)


def _settings(compose: Any, *overrides: str) -> tuple[StudySettings, Any]:
    cfg = compose(["hparams_search=lr_search", *overrides])
    return study_settings(cfg), cfg


def test_lr_search_searches_the_learning_rates_the_optimizer_uses(compose: Any) -> None:
    settings, muon = _settings(compose)  # the default optimizer: Muon for the matrices, AdamW for the rest
    assert set(searched_params(settings, muon)) == {
        "optim.lr", "optim.muon_lr", "optim.warmup_steps", "model.dropout"
    }  # fmt: skip
    settings, adamw = _settings(compose, "optim=adamw")
    assert set(searched_params(settings, adamw)) == {
        "optim.lr", "optim.weight_decay", "optim.warmup_steps", "model.dropout"
    }  # fmt: skip


def test_search_space_errors_are_one_line(compose: Any) -> None:
    settings, cfg = _settings(compose)
    settings.params["optim.lrr"] = "interval(0.1, 0.2)"
    with pytest.raises(MiniGPTError, match=r"hparams_search.params.optim.lrr: the train config has no key"):
        searched_params(settings, cfg)
    with pytest.raises(MiniGPTError, match=r"hparams_search.n_trials=0 must be >= 1"):
        _settings(compose, "hparams_search.n_trials=0")
    with pytest.raises(MiniGPTError, match=r"needs a search space: add hparams_search=lr_search"):
        study_settings(compose([]))


def test_a_storage_of_another_search_space_is_refused(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    settings = StudySettings("s", str(tmp_path), storage, 3, params={"optim.lr": "interval(0.1, 0.2)"})
    first = open_study(settings, {"optim.lr": FloatDistribution(0.1, 0.2)})
    first.enqueue_trial({"optim.lr": 0.15})
    again = open_study(settings, {"optim.lr": FloatDistribution(0.1, 0.2)})  # the same space: resumes
    assert len(again.trials) == 1
    other = {"optim.lr": FloatDistribution(0.1, 0.2), "model.dropout": FloatDistribution(0, 1)}
    with pytest.raises(MiniGPTError, match=r"study .s. in .* searches optim.lr, not model.dropout, optim.lr"):
        open_study(settings, other)


def test_a_study_of_other_fixed_overrides_is_refused(tmp_path: Path) -> None:
    """docs/sweeps.md's examples, run in order: the second (another recipe, another length) must not join
    the first's study; more trials, another logger or a second worker's same command continue it."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    settings = StudySettings(
        "lr_search", str(tmp_path), storage, 3, params={"optim.lr": "interval(0.1, 0.2)"}
    )
    space = {"optim.lr": FloatDistribution(0.1, 0.2)}
    first = ["hparams_search=lr_search", "experiment=shakespeare_char_cpu", "trainer.max_steps=20"]
    open_study(settings, space, first)
    same = ["+trainer.max_steps=20", "hparams_search=lr_search", "experiment=shakespeare_char_cpu",
            "hparams_search.n_trials=50", "logger=csv", f"paths.output_dir={tmp_path}"]  # fmt: skip
    open_study(settings, space, same)
    with pytest.raises(MiniGPTError) as info:
        open_study(settings, space, ["hparams_search=lr_search", "trainer.max_steps=1000"])
    assert str(info.value) == (
        f"the study 'lr_search' in {storage} trains its trials with experiment=shakespeare_char_cpu "
        "trainer.max_steps=20, not trainer.max_steps=1000: give this sweep its own "
        "hparams_search.study_name, or repeat those overrides to continue the study"
    )


def test_pruners_by_name() -> None:
    median = make_pruner({"name": "median", "median": {"n_startup_trials": 4}})
    assert isinstance(median, optuna.pruners.MedianPruner)
    assert isinstance(make_pruner({"name": "successive_halving"}), optuna.pruners.SuccessiveHalvingPruner)
    assert isinstance(make_pruner({"name": "none"}), optuna.pruners.NopPruner)
    with pytest.raises(MiniGPTError, match=r"pruner.name='hyperband' must be one of median, successive_halv"):
        make_pruner({"name": "hyperband"})
    with pytest.raises(MiniGPTError, match=r"bad hparams_search.pruner.median"):
        make_pruner({"name": "median", "median": {"n_startup": 1}})


def _trainer(step: int, loss: float) -> SimpleNamespace:
    metrics = {"val/loss": torch.tensor(loss)}
    return SimpleNamespace(
        callback_metrics=metrics, sanity_checking=False, global_step=step, should_stop=False
    )


def test_report_stops_the_fit_of_a_trial_worse_than_the_median() -> None:
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0))
    good = study.ask()
    good.report(1.0, step=10)
    study.tell(good, 1.0)

    better, worse = ReportValLoss(study.ask()), ReportValLoss(study.ask())
    trainer = _trainer(10, 0.5)
    better.on_validation_end(trainer, None)
    assert (trainer.should_stop, better.pruned_at) == (False, None)
    trainer = _trainer(10, 2.0)
    worse.on_validation_end(trainer, None)
    assert (trainer.should_stop, worse.pruned_at) == (True, 10)
    assert worse.trial.study.trials[2].intermediate_values == {10: 2.0}


def test_trials_table_shows_four_significant_digits(tmp_path: Path) -> None:
    from mini_gpt.train.sweep import study_table

    study = optuna.create_study()
    lr = FloatDistribution(1e-4, 1e-1, log=True)
    for value, params in [(2.5, 0.0012345678901234567), (1.25, 0.031234567890123456)]:
        study.add_trial(optuna.trial.create_trial(params={"optim.lr": params}, distributions={"optim.lr": lr},
                                                  value=value))  # fmt: skip
    header, rows = study_table(study, tmp_path)
    assert header == ["trial", "optim.lr", "state", "best_val_loss", "steps", "wall_seconds", "best"]
    assert rows == [
        ["0", "0.001235", "complete", "2.5000", "-", "-", ""],
        ["1", "0.03123", "complete", "1.2500", "-", "-", "*"],
    ]


def test_budget_steps_from_flops_per_token() -> None:
    from mini_gpt.model.gpt import GPTConfig

    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=65, block_size=64, bias=True)
    # 6 x non-embedding parameters (per layer: 2 layernorms, qkv, proj, fc, fc-proj; the final layernorm;
    # the tied head, which is a weight matrix) + 12 x n_layer x n_embd x T, written out by hand
    d = 32
    layer = 2 * (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    non_embedding = 2 * layer + 2 * d + 65 * d
    expected = 6 * non_embedding + 12 * 2 * d * 64
    assert flops_per_token(config) == expected
    assert budget_steps(1e9, 1000.0, 768) == 1302  # floor(1e9 / 768_000)
    with pytest.raises(MiniGPTError, match=r"trainer.max_flops=1e\+05 is less than one optimizer step"):
        budget_steps(1e5, 1000.0, 768)


def test_a_missing_sweep_extra_is_one_line_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from mini_gpt.train.sweep import require_optuna

    monkeypatch.setitem(__import__("sys").modules, "optuna", None)  # `import optuna` raises ImportError
    with pytest.raises(MiniGPTError) as err:
        require_optuna()
    assert str(err.value) == (
        'mini-gpt sweep needs Optuna, which is not installed; run pip install -e ".[sweep]"'
    )


def test_wandb_runs_of_a_study_are_named_per_trial_and_grouped(compose: Any) -> None:
    from mini_gpt.train.sweep import wandb_trial_names

    cfg = compose(["hparams_search=lr_search"])  # the default logger: W&B
    assert wandb_trial_names(cfg, 3) == ["logger.wandb.name=trial-3", "logger.wandb.group=sweep-lr_search"]
    named = compose(["hparams_search=lr_search", "logger.wandb.group=mine"])
    assert wandb_trial_names(named, 3) == ["logger.wandb.name=trial-3"]
    assert wandb_trial_names(compose(["hparams_search=lr_search", "logger=csv"]), 3) == []
