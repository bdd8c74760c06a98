"""Where every mini-gpt tool finds its Hydra configs (`CONF_DIR`), and how it composes them (`hydra_main`).

The YAML lives in `conf/` at the top of a checkout (a wheel carries it as `mini_gpt/configs/`):
`train.yaml` and its groups for `mini-gpt train`, one `<verb>.yaml` for each other verb. Hydra is
imported lazily.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mini_gpt.errors import MiniGPTError, exit_on_user_error

_PACKAGE_DIR = Path(__file__).resolve().parents[1]
_CHECKOUT = _PACKAGE_DIR.parent
_IN_CHECKOUT = (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "conf" / "train.yaml").is_file()
# A source checkout (editable install) reads conf/ beside the package; a wheel its copy inside the package.
CONF_DIR = _CHECKOUT / "conf" if _IN_CHECKOUT else _PACKAGE_DIR / "configs"
# A checkout keeps outputs/ and data/ in the checkout, whatever the working directory; an installed
# package uses the working directory.
PROJECT_ROOT = _CHECKOUT if _IN_CHECKOUT else Path.cwd()


# Keys whose values are free text: taken from the command line verbatim, never parsed by Hydra (whose
# override grammar rejects braces and non-ASCII letters and splits values on commas).
FREE_TEXT_KEYS = ("prompt", "stop")


def split_free_text(
    argv: Sequence[str] | None, keys: Sequence[str] = FREE_TEXT_KEYS
) -> tuple[list[str], dict[str, Any]]:
    """(the Hydra overrides, {"prompt": text, "stop": [texts]}) of `argv` (default: the command line);
    `stop=` may be given several times. `keys`: the tool's free-text keys (paths, for `mini-gpt plot`)."""
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


def register_resolvers() -> None:
    """`${project_root:}` (used by paths/default.yaml); call before Hydra composes a config."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT), replace=True)


def compose(overrides: Sequence[str] = (), config_name: str = "train", hydra: bool = False) -> Any:
    """The config `python train.py OVERRIDES` (or another tool) would run with, without running it;
    `hydra=True` also returns the `hydra` node (sweeper, launcher, run dirs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=hydra)


def _segments(text: str) -> list[tuple[str, list[str]]]:
    """A YAML file as (top-level key, its lines): each key with the comment lines just above it and
    everything indented below it; ("", lines) for comments before the first key."""
    segments: list[tuple[str, list[str]]] = [("", [])]
    pending: list[str] = []  # comments / blank lines not yet attached to a key
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            pending.append(line)
        elif line[0] not in " -":  # a top-level key
            segments.append((line.split(":", 1)[0], [*pending, line]))
            pending = []
        else:
            segments[-1][1].extend([*pending, line])
            pending = []
    segments[-1][1].extend(pending)
    return segments


def _groups(config_name: str, included: bool = True) -> list[str]:
    """The config groups a top-level config's defaults list names, in order, with (`included`) those of a
    config it includes (`- train` in prepare.yaml); Hydra's own groups left out."""
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{config_name}.yaml"))
    groups: list[str] = []
    for entry in config.get("defaults") or []:  # type: ignore[union-attr]
        if isinstance(entry, dict) and not next(iter(entry)).startswith(("override ", "hydra")):
            groups.append(next(iter(entry)))
        elif included and isinstance(entry, str) and entry != "_self_":
            groups += _groups(entry)
    return groups


def command(config_name: str) -> str:
    """How a user types the command of a config: `python train.py` or `mini-gpt <verb>`."""
    if config_name == "train":
        return "python train.py"
    if config_name.startswith("tokenizer_"):  # one verb, two configs: tokenizer train|eval
        return f"mini-gpt {config_name.replace('_', ' ')}"
    return f"mini-gpt {config_name.replace('_', '-')}"


# The `key=value` example in a tool's --help footer: one of that tool's own keys.
HELP_EXAMPLES = {
    "train": "model.n_layer=6",
    "prepare": "data.val_fraction=0.05",
    "evaluate": "hellaswag.limit=100",
}


def tool_help(config_name: str) -> str:
    """`--help` of a tool: its config file's keys with their comments, and the options of its groups."""
    text = (CONF_DIR / f"{config_name}.yaml").read_text()
    groups = _groups(config_name)
    lines = []
    for key, segment in _segments(text):
        if key == "hydra":  # Hydra plumbing, not the tool's keys
            continue
        if key == "defaults" and not _groups(config_name, included=False):  # no groups of its own to show:
            segment = segment[: segment.index("defaults:")]  # only the comments above it
        lines += segment
    help_text = "\n".join(lines).strip("\n")
    if groups:
        options = [
            f"  {group}: {', '.join(sorted(p.stem for p in (CONF_DIR / group).glob('*.yaml')))}"
            for group in groups
        ]
        help_text += "\n\nOptions of each group (conf/<group>/<option>.yaml):\n" + "\n".join(options)
        example = HELP_EXAMPLES.get(config_name, "model.n_layer=6")
        help_text += f"\nPick an option with group=option, set any key with key=value (e.g. {example})."
        if config_name == "train":  # the one Hydra app (hydra.main): Hydra's flags work
            help_text += "\n--cfg job prints every key of the composed config; -m runs a sweep."
        help_text += "\nA key that does not exist is an error."
    else:
        help_text += "\n\nSet any key above with key=value; a key that is not listed is an error."
    return help_text + "\n"


def exit_with_help_if_asked(config_name: str, argv: Sequence[str] | None = None) -> None:
    """`--help` / `-h` in `argv` (default: the command line): print `tool_help(config_name)` and exit 0.
    Hydra's own help would list every config group in CONF_DIR (the training groups in every tool's help)."""
    if {"--help", "-h"} & set(sys.argv[1:] if argv is None else argv):
        print(tool_help(config_name), end="")
        raise SystemExit(0)


def compose_command_line(config_name: str, overrides: Sequence[str]) -> Any:
    """`compose`, with an override Hydra refuses (an unknown key, bad syntax) as one `MiniGPTError` line."""
    from hydra.errors import HydraException
    from omegaconf import DictConfig, OmegaConf

    try:
        return compose(overrides, config_name)
    except HydraException as err:
        first = str(err).strip().splitlines()[0]
        unknown = re.match(r"Could not override '([^']+)'", first)
        if unknown:
            key = unknown.group(1)
            full = compose((), config_name)
            parent = key.rpartition(".")[0]
            node = OmegaConf.select(full, parent) if parent else None
            if not isinstance(node, DictConfig):  # a top-level key, or below a key that holds a value
                node, parent = full, ""
            keys = ", ".join(str(k) for k in node)
            why = f"unknown key {key!r}; the keys{f' of {parent}' if parent else ''} are {keys}"
        elif missing := re.search(r"Could not find '([^'/]+)/([^']+)'", first):
            group, option = missing.groups()
            options = ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
            why = f"{group}={option}: there is no conf/{group}/{option}.yaml; the options are {options}"
        elif ambiguous := re.search(r"Ambiguous value for argument '([^'=]+)=([^']*)'", first):
            key, value = ambiguous.groups()
            why = (
                f"{key}={value} is ambiguous: write a list in brackets, {key}=[{value}] "
                f"(quoted for the shell: '{key}=[{value}]')"
            )
        else:
            why = f"bad override ({first}); write key=value ({command(config_name)} --help)"
        raise MiniGPTError(f"{config_name}: {why}") from None


def exit_on_bad_overrides(config_name: str) -> None:
    """Before `hydra.main` runs: an override on the command line that Hydra would refuse becomes one
    `error: ...` line and exit status 2 instead of Hydra's multi-line report. Left to Hydra: command lines
    with its own flags (`-m`, `--cfg job`, ...), whose overrides may be sweep syntax."""
    overrides = sys.argv[1:]
    if not any(arg.startswith("-") for arg in overrides):
        exit_on_user_error(compose_command_line)(config_name, overrides)


def hydra_main(
    config_name: str,
    task: Callable[[dict[str, Any]], Any],
    argv: Sequence[str] | None = None,
    node: str | None = None,
) -> Any:
    """Run `task(cfg)` on `CONF_DIR/<config_name>.yaml` plus the `key=value` overrides in `argv` (default:
    the command line), `cfg` a resolved plain dict: the whole config, or only its `node` (prepare: data;
    the rest of train.yaml has keys only a Hydra run can resolve). Hydra's compose API, not hydra.main: a
    one-shot tool needs no run directory. A refused override or a `MiniGPTError` becomes one `error:` line
    and exit status 2; `--help` / `-h` prints `tool_help(config_name)`."""
    from omegaconf import OmegaConf

    overrides = sys.argv[1:] if argv is None else list(argv)

    def run() -> Any:
        cfg = compose_command_line(config_name, overrides)
        cfg = cfg if node is None else cfg[node]
        return task(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]

    exit_with_help_if_asked(config_name, overrides)
    return exit_on_user_error(run)()


def model_preset(name: str, **overrides: Any) -> dict[str, Any]:
    """conf/model/<name>.yaml as a plain dict for `GPTConfig(**d)`, with `overrides` (the presets'
    `vocab_size: null` means "the tokenizer's": give one). An unknown name is one line naming the options."""
    from omegaconf import OmegaConf

    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.is_file():
        options = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise MiniGPTError(f"unknown model preset {name!r}; choose one of {options}")
    return {**OmegaConf.to_container(OmegaConf.load(path)), **overrides}  # type: ignore[dict-item]
