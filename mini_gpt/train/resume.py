"""Resuming (`ckpt_path=`): the run's saved overrides, then the command line's, composed again
(docs/training.md#checkpoints-and-resuming). A checkpoint without overrides takes `key=value` changes only."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from mini_gpt.conf import compose
from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import read_checkpoint, require_training_state
from mini_gpt.train.distributed import launcher_rank

# Always this process's (a fine-tuning run's adapters come from the checkpoint's record, not init_from).
_NEVER_RESTORED = ("ckpt_path", "paths.run_dir", "init_from")
_SAVED_CONFIG = "_resumed_run"  # ConfigStore name of a saved config that has no overrides
_MISSING = object()


@dataclass(frozen=True)
class Resume:
    """A checkpoint to resume from, read once (memory-mapped: the weights stay on disk)."""

    path: Path
    step: int
    meta: dict[str, Any]  # the `mini_gpt` entry: model config, tokenizer, finetune record
    run_config: dict[str, Any] | None  # the run's config, unresolved (None: a checkpoint from elsewhere)
    run_overrides: list[str] | None  # the overrides that composed it (None: not a Hydra run's)
    config_source: str = "the checkpoint"  # where run_config came from


def checkpoint_path(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser().resolve()
    if not path.is_file():
        raise MiniGPTError(f"ckpt_path={path} does not exist; pass an existing .ckpt to resume")
    return path


def read_resume(value: str | None, init_from: str | None = None) -> Resume | None:
    """The checkpoint `ckpt_path=` names, read once; None for a fresh run."""
    if (path := checkpoint_path(value)) is None:
        return None
    if init_from:
        raise MiniGPTError(
            "ckpt_path= resumes a run and init_from= starts a new one from pretrained weights; pass one "
            "of them (to resume a fine-tuning run, add init_from=null)"
        )
    ckpt = read_checkpoint(path)
    require_training_state(ckpt, path)
    saved, source = ckpt.get("run_config"), "the checkpoint"
    beside = path.parent.parent / ".hydra" / "config.yaml"  # a run directory's record of its config
    if not isinstance(saved, dict) and path.parent.name == "checkpoints" and beside.is_file():
        saved, source = OmegaConf.to_container(OmegaConf.load(beside), resolve=False), str(beside)
    return Resume(
        path=path, step=int(ckpt.get("global_step", 0)), run_overrides=ckpt.get("run_overrides"),
        meta=meta if isinstance(meta := ckpt.get("mini_gpt"), dict) else {},
        run_config=saved if isinstance(saved, dict) else None, config_source=source,
    )  # fmt: skip


def _compose_run(
    overrides: Sequence[str], config_name: str = "train", hydra_node: bool = False
) -> DictConfig:
    """Compose `config_name` with `overrides` (inside a Hydra job through its Hydra: no second init)."""
    try:
        if GlobalHydra.instance().is_initialized():
            return hydra.compose(config_name, list(overrides), return_hydra_config=hydra_node)
        return compose(overrides, config_name, hydra=hydra_node)
    except Exception as err:
        first = " ".join(str(err.__cause__ or err).strip().splitlines()[0].split())
        raise MiniGPTError(f"cannot compose the resumed run's config: {first}") from None


def _keys(overrides: Sequence[str]) -> list[str]:
    """The key (or group) each override sets, as Hydra parses it (`~a.b` -> a.b, `+x=1` -> x)."""
    return [o.key_or_group for o in OverridesParser.create().parse_overrides(list(overrides))]


def _without(overrides: Sequence[str], keys: Sequence[str] = ()) -> list[str]:
    """`overrides` less the hydra.* ones and those that set one of `keys`."""
    pairs = zip(overrides, _keys(overrides))  # hydra's own: hydra, hydra.run.dir, hydra/launcher
    return [o for o, key in pairs if key.split(".")[0].split("/")[0] != "hydra" and key not in keys]


def run_overrides(cfg: DictConfig, resume: Resume | None) -> list[str] | None:
    """The overrides that compose `cfg`, for its checkpoints: the resumed checkpoint's, then Hydra's."""
    if not HydraConfig.initialized():
        return None
    task = list(HydraConfig.get().overrides.task)
    if resume is None:
        return task
    return None if resume.run_overrides is None else [*_without(resume.run_overrides, _NEVER_RESTORED), *task]


def explicit_model_keys(cfg: DictConfig) -> dict[str, Any]:
    """The model keys this run sets on purpose, which must fit init_from's source: all of them when a
    model config is chosen (`model=NAME`, an experiment), else those named or differing from the default."""
    if not HydraConfig.initialized() or not cfg.get("init_from"):
        return {}
    model: dict[str, Any] = OmegaConf.to_container(cfg.model, resolve=True)  # type: ignore[assignment]
    default, job = _compose_run((), hydra_node=True), HydraConfig.get()
    keys = set(_keys(job.overrides.task))
    if "model" in keys or job.runtime.choices.get("model") != default.hydra.runtime.choices.get("model"):
        return model
    return {k: v for k, v in model.items() if f"model.{k}" in keys or v != default.model.get(k, _MISSING)}


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _config_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """`key: old -> new` per differing leaf; a key added since the run with a null value is no change."""
    old, new = dict(_leaves(before)), dict(_leaves(after))
    pairs = {key: (old.get(key, _MISSING), new.get(key, _MISSING)) for key in {**old, **new}}

    def show(value: Any) -> str:
        return "(unset)" if value is _MISSING else repr(value) if isinstance(value, str) else str(value)

    return [
        f"{key}: {show(a)} -> {show(b)}"
        for key, (a, b) in pairs.items()
        if key not in _NEVER_RESTORED and a != b and (a is not _MISSING or b is not None)
    ]


_LENGTH_KEYS = ("trainer.max_steps", "trainer.max_flops", "trainer.budget_s")  # what ends a run
_BUDGETS = {"trainer.max_flops": ".3g", "trainer.budget_s": "g"}  # each replaces trainer.max_steps when set


def steps_beat_budget(cfg: DictConfig, overrides: Sequence[str], announce: bool = True) -> DictConfig:
    """`cfg` where the last of trainer.max_steps / max_flops / budget_s that `overrides` set wins: the other
    budgets it had (a recipe's) become null (`announce`: rank 0 says so)."""
    given = [k for k in _keys(overrides) if k in _LENGTH_KEYS]
    if not given:
        return cfg
    dropped = [k for k in _BUDGETS if k != given[-1] and OmegaConf.select(cfg, k) is not None]
    if not dropped:
        return cfg
    winner = given[-1]
    cfg = copy.deepcopy(cfg)
    given_value = f"{winner}={OmegaConf.select(cfg, winner):{_BUDGETS.get(winner, '')}}"
    for key in dropped:
        if announce and launcher_rank() == 0:
            value = f"{key}={OmegaConf.select(cfg, key):{_BUDGETS[key]}}"
            print(f"{given_value} given: it replaces {value} (the budget, now null)", flush=True)
        OmegaConf.update(cfg, key, None, merge=False)
    return cfg


def _record(cfg: DictConfig) -> None:
    """`cfg` as the config that ran, in the Hydra job's `.hydra/config.yaml` (where there is one)."""
    job = HydraConfig.get() if HydraConfig.initialized() else None
    if job and job.output_subdir is not None and not OmegaConf.is_missing(job.runtime, "output_dir"):
        OmegaConf.save(cfg, Path(job.runtime.output_dir) / job.output_subdir / "config.yaml")


def resumed_config(
    cfg: DictConfig, resume: Resume | None, overrides: Sequence[str] | None = None
) -> DictConfig:
    """A resumed run's own config with `overrides` (default: Hydra's) on top, else `cfg` (`steps_beat_budget`
    applied); rank 0 prints the changes and records a changed config in `.hydra/config.yaml`."""
    if overrides is None and not HydraConfig.initialized():
        return cfg
    new = _without(HydraConfig.get().overrides.task if overrides is None else overrides)
    announce = launcher_rank() == 0
    if resume is None:
        run = steps_beat_budget(cfg, new)
        if run is not cfg and announce:
            _record(run)
        return run
    # A budget the run's own config had already given up (said at its start) is no news on resume.
    trainer = (resume.run_config or {}).get("trainer") or {}
    budget = resume.run_config is None or any(trainer.get(k.split(".")[1]) is not None for k in _BUDGETS)
    if resume.run_overrides is not None:
        saved = _without(resume.run_overrides, _NEVER_RESTORED)
        restored = steps_beat_budget(_compose_run([*saved, *new]), [*saved, *new], announce=budget)
        how = "its run's overrides and the command line's"
    elif resume.run_config is not None:  # Hydra applies `new` to the saved config itself
        ConfigStore.instance().store(name=_SAVED_CONFIG, node=dict(resume.run_config))
        try:
            restored = steps_beat_budget(_compose_run(new, _SAVED_CONFIG), new)
        except MiniGPTError as err:
            raise MiniGPTError(
                f"{err} (this checkpoint records no overrides: resuming it takes key=value changes only)"
            ) from None
        how = f"its run's config (from {resume.config_source}) and the command line's key=value changes"
    else:
        if announce:
            print(
                f"resuming {resume.path}: it carries no run config; training with the command line's config"
            )
        return steps_beat_budget(cfg, new)
    now: dict[str, Any] = OmegaConf.to_container(cfg, resolve=False)  # type: ignore[assignment]
    for key in _NEVER_RESTORED:  # this process's, whatever the saved run had
        section, _, leaf = key.rpartition(".")
        OmegaConf.update(restored, key, (now.get(section, {}) if section else now).get(leaf), merge=False)
    if announce:
        after = OmegaConf.to_container(restored, resolve=False)
        changes = _config_changes(resume.run_config or {}, after)  # type: ignore[arg-type]
        what = "\n".join(f"  {line}" for line in changes) or "  (none: the run continues as it was started)"
        print(f"resuming {resume.path} with {how}; changes from the run's config:\n{what}")
        _record(restored)
    return restored
