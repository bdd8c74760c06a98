"""The config of a resumed run: `python train.py ckpt_path=.../last.ckpt [key=value ...]`.

A run's config is saved in each of its checkpoints (`checkpoint["run_config"]`) and beside them
(`<run dir>/.hydra/config.yaml`), unresolved, so `${paths.run_dir}` and friends follow the new run.
Resuming restores that config and applies on top of it only what the command line names: a key
(`trainer.max_steps=900`), a whole group (`trainer=cpu`), or the keys a global recipe sets
(`experiment=...`, `debug=...`); everything else continues as the run was started. The changes are
printed, one line per key (`trainer.max_steps: 500 -> 900`), and the new run directory's
`.hydra/config.yaml` is rewritten with the config that actually runs.

Whether the checkpoint fits the config (model shape, tokenizer) is checked where checkpoints are read;
here only the config is decided.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mini_gpt.conf import CONF_DIR
from mini_gpt.errors import MiniGPTError

__all__ = ["RUN_CONFIG_KEY", "config_changes", "restore_run_config", "resumed_config", "saved_run_config"]

RUN_CONFIG_KEY = "run_config"  # the checkpoint entry holding the run's unresolved config
# Always this process's: the checkpoint, the new run dir, and init_from (a resumed run's weights come from
# the checkpoint; a fine-tuning run's adapters and frozen parts are rebuilt from its record there).
_NEVER_RESTORED = ("ckpt_path", "paths.run_dir", "init_from")
_MISSING = object()


def saved_run_config(ckpt_path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the run's config, where it was found) from the checkpoint, else `.hydra/config.yaml` of the run
    directory holding `checkpoints/<ckpt>`; (None, "") when neither exists (a checkpoint from elsewhere)."""
    from mini_gpt.checkpoint import read_checkpoint

    ckpt = read_checkpoint(ckpt_path)  # memory-mapped: the weights stay on disk
    saved = ckpt.get(RUN_CONFIG_KEY)
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


def _global_group_keys(group: str, option: str) -> list[str] | None:
    """The config paths a `# @package _global_` group option (experiment=, debug=, ...) sets; None for an
    ordinary group or an unknown option."""
    path = CONF_DIR / group / f"{option}.yaml"
    if not path.is_file() or "@package _global_" not in path.read_text():
        return None
    content = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert isinstance(content, dict)
    keys = []
    for entry in content.pop("defaults", None) or []:  # `override /model: baby` replaces a whole group
        if isinstance(entry, dict):
            keys += [k.split()[-1].lstrip("/") for k in entry if k.split()[-1].lstrip("/") != "_self_"]
    content.pop("hydra", None)
    return keys + [key for key, _ in _leaves(content) if key]


def _touched(overrides: Sequence[str]) -> list[str]:
    """The config paths the command-line overrides set, in order (hydra.* and ckpt_path left out)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    paths: list[str] = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        value = override.value() if not override.is_delete() else None
        glob = _global_group_keys(key, value) if isinstance(value, str) and "." not in key else None
        paths += glob if glob is not None else [key.replace("/", ".")]
    return [p for p in paths if p not in _NEVER_RESTORED]


def _select(container: dict[str, Any], path: str) -> Any:
    node: Any = container
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _assign(container: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = container
    for part in parents:
        node = node.setdefault(part, {})
    if value is _MISSING:
        node.pop(last, None)
    else:
        node[last] = value


def restore_run_config(
    saved: Mapping[str, Any], current: DictConfig, overrides: Sequence[str]
) -> tuple[DictConfig, list[str]]:
    """(`saved` with the paths `overrides` set taken from `current`, the changes as lines `key: a -> b`).

    `current` is what the command line composed (defaults + overrides); `saved` the run's config.
    """
    import copy

    now = OmegaConf.to_container(current, resolve=False)
    assert isinstance(now, dict)
    restored = copy.deepcopy(dict(saved))
    for path in [*_touched(overrides), *_NEVER_RESTORED]:
        value = _select(now, path)
        _assign(restored, path, value if value is _MISSING else copy.deepcopy(value))
    return OmegaConf.create(restored), config_changes(saved, restored)


def config_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """`key: old -> new` for every leaf that differs (added: `(unset)`), ckpt_path and the run dir aside."""
    old, new = dict(_leaves(before)), dict(_leaves(after))
    lines = []
    for key in [*old, *(k for k in new if k not in old)]:
        if key in _NEVER_RESTORED or old.get(key, _MISSING) == new.get(key, _MISSING):
            continue
        show = [("(unset)" if v is _MISSING else repr(v) if isinstance(v, str) else str(v)) for v in
                (old.get(key, _MISSING), new.get(key, _MISSING))]  # fmt: skip
        lines.append(f"{key}: {show[0]} -> {show[1]}")
    return lines


def resumed_config(cfg: DictConfig, overrides: Sequence[str] | None = None) -> DictConfig:
    """The config to run: `cfg` itself for a fresh run; for `ckpt_path=...` the run's saved config with
    only the command line's `overrides` (default: Hydra's task overrides) applied. Rank 0 prints the
    changes and saves the config in the run directory's `.hydra/config.yaml` (inside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    from mini_gpt.training import launcher_rank

    ckpt = cfg.get("ckpt_path")
    if ckpt is None:
        return cfg
    ckpt_path = Path(ckpt).expanduser().resolve()
    if not ckpt_path.is_file():
        raise MiniGPTError(f"ckpt_path={ckpt_path} does not exist; pass an existing .ckpt to resume")
    in_hydra = HydraConfig.initialized()
    if overrides is None:
        overrides = list(HydraConfig.get().overrides.task) if in_hydra else []
    announce = launcher_rank() == 0
    saved, source = saved_run_config(ckpt_path)
    if saved is None:
        if announce:
            print(f"resuming {ckpt_path}: it carries no run config; training with the command line's config")
        return cfg
    restored, changes = restore_run_config(saved, cfg, overrides)
    if announce:
        what = "\n".join(f"  {line}" for line in changes) or "  (none: the run continues as it was started)"
        print(f"resuming {ckpt_path} with its run's config (from {source}); command-line changes:\n{what}")
        subdir = HydraConfig.get().output_subdir if in_hydra else None
        if subdir is not None:  # the run directory records the config that runs, not the command line's
            OmegaConf.save(restored, Path(HydraConfig.get().runtime.output_dir) / subdir / "config.yaml")
    return restored
