"""A run's overrides, and the config of a resumed run: `python train.py ckpt_path=.../last.ckpt [key=value]`.

Each checkpoint records the overrides that composed its run's config (`run_overrides`) beside the config
itself (`run_config`, unresolved). Resuming composes conf/ again from the saved overrides followed by the
command line's, so the command line wins and everything else continues as the run was started; what
differs from the trained config is printed (`trainer.max_steps: 500 -> 900`) and the new run directory's
`.hydra/config.yaml` records the config that runs. A checkpoint without overrides resumes its saved config
with the command line's `key=value` changes applied (no group choices). The checkpoint, the run
directory and `init_from` are always this process's (`_NEVER_RESTORED`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from mini_gpt.conf import compose
from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import read_checkpoint
from mini_gpt.train.run import launcher_rank

__all__ = ["explicit_model_keys", "resumed_config", "run_overrides", "saved_run_config"]

_RUN_CONFIG_KEY = "run_config"  # the checkpoint entry holding the run's unresolved config
_RUN_OVERRIDES_KEY = "run_overrides"  # ... and the overrides that composed it (a list of strings)
# Always this process's: the checkpoint, the new run dir, and init_from (a resumed run's weights come from
# the checkpoint; a fine-tuning run's adapters and frozen parts are rebuilt from its record there).
_NEVER_RESTORED = ("ckpt_path", "paths.run_dir", "init_from")
_SAVED_CONFIG = "_resumed_run"  # ConfigStore name of a saved config that has no overrides
_MISSING = object()


def _compose_run(
    overrides: Sequence[str], config_name: str = "train", hydra_node: bool = False
) -> DictConfig:
    """Compose `config_name` with `overrides`; inside train.py's Hydra job through that job's Hydra (which
    refuses a second initialization), elsewhere as the tools do. A refused override is one line."""
    try:
        if GlobalHydra.instance().is_initialized():
            return hydra.compose(config_name, list(overrides), return_hydra_config=hydra_node)
        return compose(overrides, config_name, hydra=hydra_node)
    except HydraException as err:
        first = str(err).strip().splitlines()[0]
        raise MiniGPTError(f"cannot compose the resumed run's config: {first}") from None


def _keys(overrides: Sequence[str]) -> list[str]:
    """The key (or group) each override sets, as Hydra parses it (`~a.b` -> a.b, `+x=1` -> x)."""
    return [o.key_or_group for o in OverridesParser.create().parse_overrides(list(overrides))]


def _is_hydra(key: str) -> bool:
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def _restorable(overrides: Sequence[str]) -> list[str]:
    """The saved overrides a resume re-applies: no hydra.* ones and none of `_NEVER_RESTORED`."""
    return [
        o for o, key in zip(overrides, _keys(overrides)) if not (_is_hydra(key) or key in _NEVER_RESTORED)
    ]


def run_overrides(cfg: DictConfig) -> list[str] | None:
    """The overrides that compose `cfg` from conf/, as its checkpoints record them: Hydra's task overrides,
    after the resumed checkpoint's own; None outside a Hydra run or resuming a checkpoint that has none."""
    if not HydraConfig.initialized():
        return None
    task = list(HydraConfig.get().overrides.task)
    if cfg.get("ckpt_path") is None:
        return task
    saved = read_checkpoint(Path(cfg.ckpt_path).expanduser().resolve()).get(_RUN_OVERRIDES_KEY)
    return None if saved is None else [*_restorable(saved), *task]


def explicit_model_keys(cfg: DictConfig) -> dict[str, Any]:
    """The model keys this run sets on purpose (with init_from they must fit the source): all of them when
    the model config is chosen (`model=NAME`, an experiment's `override /model`), else those named on the
    command line or differing from the default composition's. Empty without init_from or outside Hydra."""
    if not HydraConfig.initialized() or not cfg.get("init_from"):
        return {}
    model = OmegaConf.to_container(cfg.model, resolve=True)
    assert isinstance(model, dict)
    default = _compose_run((), hydra_node=True)
    if HydraConfig.get().runtime.choices.get("model") != default.hydra.runtime.choices.get("model"):
        return model
    keys = set(_keys(HydraConfig.get().overrides.task))
    if "model" in keys:
        return model
    return {k: v for k, v in model.items() if f"model.{k}" in keys or v != default.model.get(k, _MISSING)}


def saved_run_config(ckpt_path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the run's config, where it was found) from the checkpoint, else `.hydra/config.yaml` of the run
    directory holding `checkpoints/<ckpt>`; (None, "") when neither exists (a checkpoint from elsewhere)."""
    saved = read_checkpoint(ckpt_path).get(_RUN_CONFIG_KEY)  # memory-mapped: the weights stay on disk
    if isinstance(saved, dict):
        return saved, "the checkpoint"
    beside = ckpt_path.parent.parent / ".hydra" / "config.yaml"
    if ckpt_path.parent.name == "checkpoints" and beside.is_file():
        return OmegaConf.to_container(OmegaConf.load(beside), resolve=False), str(beside)  # type: ignore[return-value]
    return None, ""


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _config_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """`key: old -> new` for every leaf that differs (added: `(unset)`), ckpt_path and the run dir aside.
    A key added since the run with a null value (a newer version's option, off) is not a change."""
    old, new = dict(_leaves(before)), dict(_leaves(after))
    lines = []
    for key in [*old, *(k for k in new if k not in old)]:
        if key in _NEVER_RESTORED or old.get(key, _MISSING) == new.get(key, _MISSING):
            continue
        if key not in old and new[key] is None:
            continue
        show = [("(unset)" if v is _MISSING else repr(v) if isinstance(v, str) else str(v)) for v in
                (old.get(key, _MISSING), new.get(key, _MISSING))]  # fmt: skip
        lines.append(f"{key}: {show[0]} -> {show[1]}")
    return lines


def _on_saved_config(saved: Mapping[str, Any], overrides: Sequence[str]) -> DictConfig:
    """`saved` with the `key=value` overrides applied by Hydra (a checkpoint that records no overrides)."""
    ConfigStore.instance().store(name=_SAVED_CONFIG, node=dict(saved))
    try:
        return _compose_run(overrides, _SAVED_CONFIG)
    except MiniGPTError as err:
        raise MiniGPTError(
            f"{err} (this checkpoint records no overrides: resuming it takes key=value changes only)"
        ) from None


def resumed_config(cfg: DictConfig, overrides: Sequence[str] | None = None) -> DictConfig:
    """The config to run: `cfg` itself for a fresh run; for `ckpt_path=...` the run's saved overrides
    followed by the command line's `overrides` (default: Hydra's task overrides), composed again. Rank 0
    prints the changes and saves the config in the run directory's `.hydra/config.yaml` (in a Hydra job)."""
    ckpt = cfg.get("ckpt_path")
    if ckpt is None:
        return cfg
    ckpt_path = Path(ckpt).expanduser().resolve()
    if not ckpt_path.is_file():
        raise MiniGPTError(f"ckpt_path={ckpt_path} does not exist; pass an existing .ckpt to resume")
    in_hydra = HydraConfig.initialized()
    if overrides is None:
        overrides = list(HydraConfig.get().overrides.task) if in_hydra else []
    new = [o for o, key in zip(overrides, _keys(overrides)) if not _is_hydra(key)]
    announce = launcher_rank() == 0
    saved_overrides = read_checkpoint(ckpt_path).get(_RUN_OVERRIDES_KEY)
    saved, source = saved_run_config(ckpt_path)
    if saved_overrides is not None:
        restored = _compose_run([*_restorable(saved_overrides), *new])
        how = "its run's overrides and the command line's"
    elif saved is not None:
        restored = _on_saved_config(saved, new)
        how = f"its run's config (from {source}) and the command line's key=value changes"
    else:
        if announce:
            print(f"resuming {ckpt_path}: it carries no run config; training with the command line's config")
        return cfg
    now = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(now, dict)
    for key in _NEVER_RESTORED:  # this process's, whatever the saved run had
        section, _, leaf = key.rpartition(".")
        OmegaConf.update(restored, key, (now.get(section, {}) if section else now).get(leaf), merge=False)
    if announce:
        after = OmegaConf.to_container(restored, resolve=False)
        changes = _config_changes(saved if saved is not None else {}, after)  # type: ignore[arg-type]
        what = "\n".join(f"  {line}" for line in changes) or "  (none: the run continues as it was started)"
        print(f"resuming {ckpt_path} with {how}; changes from the run's config:\n{what}")
        subdir = HydraConfig.get().output_subdir if in_hydra else None
        if subdir is not None:  # the run directory records the config that runs, not the command line's
            OmegaConf.save(restored, Path(HydraConfig.get().runtime.output_dir) / subdir / "config.yaml")
    return restored
