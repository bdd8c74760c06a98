"""Config sections checked by OmegaConf against the dataclass they become: `checked_config(cls, d, section)`.

Merging a section into `OmegaConf.structured(cls)` refuses a key the class lacks or a value of the wrong
type and converts what it can (`'12'` to 12); a refusal becomes one `MiniGPTError` line naming the key
and what it must be. The dataclasses check value ranges themselves (`__post_init__`). The model and the
generation path never import this module: they stay free of OmegaConf.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from mini_gpt.errors import MiniGPTError, build_config

T = TypeVar("T")

_WHAT = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _what(hint: Any) -> str:
    """`hint` in words: `int | None` -> "an integer or null"."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if type(None) in typing.get_args(hint):
        return f"{_what(args[0])} or null"
    if typing.get_origin(hint) in (tuple, list):
        return "a list"
    return _WHAT.get(hint, getattr(hint, "__name__", str(hint)))


def checked_config(
    cls: type[T], d: Mapping[str, Any], section: str, error: type[MiniGPTError] = MiniGPTError
) -> T:
    """`cls(**d)`, with `d`'s keys and value types checked (and converted) by OmegaConf first; `section`
    prefixes the keys in the error line (`optim`, `model`; "" for top-level keys)."""
    try:
        typed = OmegaConf.merge(OmegaConf.structured(cls), dict(d))
    except ConfigKeyError:
        return build_config(cls, d, section, error)  # raises the line listing every unknown key
    except ValidationError as err:
        field = str(err.full_key).split("[")[0]  # betas[0] -> betas
        hint = typing.get_type_hints(cls).get(field)
        if "[" in str(err.full_key):  # an element of a list
            hint = (typing.get_args(hint) or (None,))[0]
        key = f"{section}.{err.full_key}" if section else str(err.full_key)
        raise error(
            f"{key}={err.value!r} must be {_what(hint)}; fix it on the command line or in the config"
        ) from None
    return build_config(cls, OmegaConf.to_container(typed), section, error)  # type: ignore[arg-type]
