"""How every verb reads its configuration: its schema dataclass (in Hydra's ConfigStore as `<verb>_schema`)
holds the keys, types, defaults and the comments `--help` shows. A verb has a conf/<verb>.yaml only where
it picks config groups (evaluate's `data: shakespeare_char`) or is train's; the others compose the schema."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar

from mini_gpt.errors import MiniGPTError, exit_on_user_error

T = TypeVar("T")

_PACKAGE_DIR = Path(__file__).resolve().parents[1]
_CHECKOUT = _PACKAGE_DIR.parent
_IN_CHECKOUT = (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "conf" / "train.yaml").is_file()
# A source checkout (editable install) reads conf/ beside the package; a wheel its copy inside the package.
CONF_DIR = _CHECKOUT / "conf" if _IN_CHECKOUT else _PACKAGE_DIR / "configs"
# A checkout keeps outputs/ and data/ in the checkout, an installed package in the working directory.
PROJECT_ROOT = _CHECKOUT if _IN_CHECKOUT else Path.cwd()


def split_free_text(
    argv: Sequence[str] | None, keys: Sequence[str] = ("prompt", "stop")
) -> tuple[list[str], dict[str, Any]]:
    """Free text taken verbatim: Hydra's grammar rejects braces and non-ASCII letters, splits on commas."""
    overrides: list[str] = []
    text: dict[str, Any] = {}
    for arg in sys.argv[1:] if argv is None else argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in keys:
            overrides.append(arg)
        elif key == "stop":
            text.setdefault("stop", []).append(value)
        else:
            text[key] = value
    return overrides, text


def schemas() -> dict[str, type]:
    from mini_gpt.conf import tools
    from mini_gpt.conf.train import TrainConfig

    return {
        "train": TrainConfig,
        "prepare": TrainConfig,  # train.yaml's data node, prepared without training
        "generate": tools.GenerateConfig,
        "evaluate": tools.EvaluateConfig,
        "export": tools.ExportConfig,
        "serve": tools.ServeConfig,
        "attention_maps": tools.AttentionMapsConfig,
        "inspect": tools.InspectConfig,
        "plot": tools.PlotConfig,
        "compare": tools.CompareConfig,
        "tokenizer_train": tools.TokenizerTrainConfig,
        "tokenizer_eval": tools.TokenizerEvalConfig,
    }


@functools.cache
def register() -> None:
    """The schemas and the `${project_root:}` resolver, for Hydra to compose with."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT), replace=True)
    for name, cls in schemas().items():
        ConfigStore.instance().store(name=f"{name}_schema", node=cls)


def compose(overrides: Sequence[str] = (), config_name: str = "train", hydra: bool = False) -> Any:
    """The config `mini-gpt <verb> OVERRIDES` would run with (`hydra=True`: with the `hydra` node)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    # A verb without a YAML composes its schema; any other name (a resumed run's saved config) is itself.
    yaml = (CONF_DIR / f"{config_name}.yaml").is_file()
    primary = f"{config_name}_schema" if config_name in schemas() and not yaml else config_name
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(primary, overrides=list(overrides), return_hydra_config=hydra)


def compose_command_line(config_name: str, overrides: Sequence[str]) -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException

    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if not o.startswith("-")])
        for override in parsed:
            if override.is_sweep_override():  # `tasks=a,b` outside a sweep: a list without brackets
                key, value = override.key_or_group, override.input_line.split("=", 1)[1]
                raise MiniGPTError(
                    f"{config_name}: {key}={value} is ambiguous: write a list in brackets, {key}=[{value}] "
                    f"(quoted for the shell: '{key}=[{value}]')"
                )
        return compose(overrides, config_name)
    except Exception as err:
        # `model=baby` for a config without a model group: to Hydra a group override that matches nothing in
        # the defaults list, to the user a key the config does not have.
        if isinstance(err, ConfigCompositionException):
            for key in (override.partition("=")[0] for override in overrides):
                if (CONF_DIR / key).is_dir() and key not in config_groups(config_name):
                    keys = ", ".join(str(k) for k in compose((), config_name))
                    raise MiniGPTError(f"{config_name}: unknown key {key!r}; the keys are {keys}") from None
        raise config_error(err, config_name) from None


def config_groups(config_name: str) -> list[str]:
    choices = compose((), config_name, hydra=True).hydra.runtime.choices
    return sorted(group for group in choices if group.split("/")[0] != "hydra")


def group_options(group: str) -> str:
    return ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))


_WHAT = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _what(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if type(None) in typing.get_args(hint):
        return f"{_what(args[0])} or null"
    if typing.get_origin(hint) in (tuple, list) or hint in (tuple, list):
        return "a list"
    return _WHAT.get(hint, getattr(hint, "__name__", str(hint)))


def config_error(err: BaseException, config_name: str, schema: Any = None, prefix: str = "") -> MiniGPTError:
    """The one place where what Hydra or OmegaConf refused becomes one line naming the key (`prefix`: where
    the keys sit in the whole config, e.g. `data.`)."""
    from hydra.errors import MissingConfigException
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

    if isinstance(err, MiniGPTError):
        return err
    cause = err.__cause__ or err
    if isinstance(cause, ValueError) and not isinstance(cause, OmegaConfBaseException):
        return MiniGPTError(str(cause))  # a dataclass's own range check (GPTConfig raises plain ValueErrors)
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and "/" in err.missing_cfg_file:
        group, _, option = err.missing_cfg_file.rpartition("/")
        options = group_options(group)
        why = f"{group}={option}: there is no conf/{group}/{option}.yaml; the options are {options}"
    elif isinstance(cause, ConfigKeyError | ConfigAttributeError) and cause.full_key:
        key, node = str(cause.full_key), cause.parent_node
        parent = key.rpartition(".")[0]
        keys = ", ".join(str(k) for k in node if k != "hydra") if isinstance(node, DictConfig) else ""
        where = f" of {parent}" if parent else ""
        why = f"unknown key {key!r}" + (f"; the keys{where} are {keys}" if keys else "")
    elif isinstance(cause, ValidationError) and cause.full_key:
        key = str(cause.full_key)
        value = OmegaConf.to_container(cause.value) if OmegaConf.is_config(cause.value) else cause.value
        hint = _hint_at(schema if schema is not None else schemas().get(config_name), key)
        return MiniGPTError(
            f"{prefix}{key}={value!r} must be {_what(hint)}; fix it on the command line or in the config"
        )
    else:
        first = " ".join(str(cause).strip().split("\n")[0].split()).split(" See https://")[0][:300]
        why = f"bad override ({first}); write key=value ({command(config_name)} --help)"
    return MiniGPTError(f"{config_name}: {why}")


def _hint_at(cls: Any, key: str) -> Any:
    """The type hint of a dotted key (`optim.betas[0]`) in a schema dataclass."""
    hint: Any = cls
    for part in key.replace("[", ".[").split("."):
        if part.startswith("["):  # an element of a list or tuple
            hint = (typing.get_args(hint) or (Any,))[0]
        elif dataclasses.is_dataclass(hint):
            hint = typing.get_type_hints(hint).get(part, Any)
        else:
            return Any
    return hint


def checked_config(cls: type[T], d: Mapping[str, Any], section: str) -> T:
    """`cls(**d)` checked by OmegaConf, for a section whose dataclass depends on its values (`data`)."""
    from omegaconf import OmegaConf

    try:
        node = OmegaConf.merge(OmegaConf.structured(cls), dict(d))
        return OmegaConf.to_object(node)  # type: ignore[return-value]  # runs __post_init__
    except Exception as err:
        raise config_error(err, section, cls, f"{section}.") from None


def typed_config(cfg: Any, config_name: str) -> Any:
    """A composed config (or node) as its schema dataclass, `__post_init__` checks run."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_object(cfg)
    except Exception as err:
        raise config_error(err, config_name) from None


def command(config_name: str) -> str:
    if config_name == "train":
        return "python train.py"
    if config_name.startswith("tokenizer_"):  # one verb, two configs: tokenizer train|eval
        return f"mini-gpt {config_name.replace('_', ' ')}"
    return f"mini-gpt {config_name.replace('_', '-')}"


def field_comments(cls: type) -> dict[str, str]:
    """{field: the comment on its line} in a dataclass's source (its bases' first)."""
    source = "".join(inspect.getsource(c) for c in reversed(cls.__mro__) if dataclasses.is_dataclass(c))
    return dict(re.findall(r"^    (\w+): .*?  # (.*)$", source, re.MULTILINE))


def tool_help(config_name: str) -> str:
    import yaml
    from omegaconf import DictConfig, OmegaConf

    lines = [f"usage: {command(config_name)} [group=option ...] [key=value ...]", ""]

    def walk(node: DictConfig, raw: dict[str, Any], prefix: str) -> None:
        cls = OmegaConf.get_type(node)
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        comments = field_comments(cls) if hints else {}  # type: ignore[arg-type]
        for key, value in raw.items():
            about = f"  # {comments[key]}" if key in comments else ""
            if isinstance(value, dict) and value and not str(key).startswith("_"):
                lines.append(f"{prefix}{key}:{about}")
                walk(node[key], value, prefix + "  ")
                continue
            what = f" ({_what(hints[key])})" if hints.get(key, Any) is not Any else ""
            shown = (  # a value as YAML on one line: lists in brackets, newlines as \n
                json.dumps(value) if isinstance(value, str) and "\n" in value
                else yaml.safe_dump({"v": value}, default_flow_style=True, width=2**31)[4:-2]
            )  # fmt: skip
            lines.append(f"{prefix}{key}: {shown}{what}{about}")

    cfg = compose((), config_name)
    walk(cfg, OmegaConf.to_container(cfg, resolve=False), "")  # type: ignore[arg-type]
    if groups := config_groups(config_name):
        lines += ["", "Options of each group (conf/<group>/<option>.yaml), picked with group=option:"]
        lines += [f"  {group}: {group_options(group)}" for group in groups]
    if config_name == "train":  # the one Hydra app (hydra.main): Hydra's flags work
        lines.append("--cfg job prints every key of the composed config; -m runs a sweep.")
    lines.append("Set any key with key=value; a key that does not exist is an error.")
    return "\n".join(lines) + "\n"


def node_help(cls: type, node: str, about: str) -> str:
    """`node:  # about`, then each key of the dataclass `cls` with its default, type and source comment."""
    hints, comments = typing.get_type_hints(cls), field_comments(cls)
    lines = [f"{node}:  # {about}"]
    for f in dataclasses.fields(cls):
        default = "" if f.default is dataclasses.MISSING else f"{f.default} "
        what = "a mapping" if typing.get_origin(hints[f.name]) is dict else _what(hints[f.name])
        comment = f"  # {comments[f.name]}" if f.name in comments else ""
        lines.append(f"  {f.name}: {default}({what}){comment}")
    return "\n".join(lines) + "\n"


def exit_with_help_if_asked(config_name: str, argv: Sequence[str] | None = None) -> None:
    """Hydra's own help would list every config group in CONF_DIR (the training groups in every tool's)."""
    if {"--help", "-h"} & set(sys.argv[1:] if argv is None else argv):
        print(tool_help(config_name), end="")
        raise SystemExit(0)


def tool_config(config_name: str, overrides: Sequence[str] = (), node: str | None = None) -> Any:
    cfg = compose_command_line(config_name, overrides)
    return typed_config(cfg if node is None else cfg[node], config_name)


def run_tool(
    config_name: str, task: Callable[[Any], Any], argv: Sequence[str] | None = None, node: str | None = None
) -> Any:
    """A one-shot verb's `main`: `--help`, else `task(config)`; a `MiniGPTError` is one `error:` line."""
    overrides = sys.argv[1:] if argv is None else list(argv)
    exit_with_help_if_asked(config_name, overrides)
    return exit_on_user_error(lambda: task(tool_config(config_name, overrides, node)))()


_PLAIN = (int, float, bool, str)


def _checkable(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    union = typing.get_origin(hint) in (typing.Union, UnionType)
    return hint if hint in _PLAIN or (union and len(args) == 1 and args[0] in _PLAIN) else Any


def checked_arguments(node: Mapping[str, Any], section: str) -> dict[str, Any]:
    """A `_target_` node's arguments checked against its class's signature (names and plain types)."""
    from hydra.utils import get_object
    from omegaconf import OmegaConf

    target = get_object(str(node["_target_"]))
    params = [p for p in inspect.signature(target).parameters.values() if p.kind is not p.VAR_POSITIONAL]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(node)  # takes anything: nothing to check here
    hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    fields = [  # an argument without a default: "???", OmegaConf's missing value
        (p.name, _checkable(hints.get(p.name, Any)),
         dataclasses.field(default_factory=lambda v=p.default: "???" if v is inspect.Parameter.empty else v))
        for p in params
    ]  # fmt: skip
    schema = dataclasses.make_dataclass(f"{getattr(target, '__name__', 'target')}Arguments", fields)
    arguments = {k: v for k, v in node.items() if k != "_target_"}
    try:
        checked = OmegaConf.merge(OmegaConf.structured(schema), arguments)
    except Exception as err:
        raise config_error(err, section, schema, f"{section}.") from None
    return {"_target_": node["_target_"], **{k: checked[k] for k in arguments}}


def model_preset(name: str, **overrides: Any) -> dict[str, Any]:
    """conf/model/<name>.yaml with `overrides`, for `GPTConfig(**d)` (presets leave vocab_size null)."""
    from omegaconf import OmegaConf

    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.is_file():
        raise MiniGPTError(f"unknown model preset {name!r}; choose one of {group_options('model')}")
    return {**OmegaConf.to_container(OmegaConf.load(path)), **overrides}  # type: ignore[dict-item]
