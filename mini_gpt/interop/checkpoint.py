"""Load a model and its tokenizer from whatever training or export wrote (no Lightning, no Hydra)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from mini_gpt.conf import checked_config
from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.hf import ARCHITECTURES, HUB_MODELS, check_hub_available, gpt_from_hf
from mini_gpt.interop.hf_tokenizer import load_hf_tokenizer
from mini_gpt.interop.lora import LoraSpec, has_lora_weights, merge_lora
from mini_gpt.interop.nanogpt import is_nanogpt, nanogpt_parts
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import Tokenizer, build_tokenizer, tokenizer_from_dict

FORMAT_VERSION = 1
SAFETENSORS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def metadata(model: GPT, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The `mini_gpt` entry of a checkpoint / export config: primitives only (weights_only loading)."""
    tok = tokenizer.to_dict() if tokenizer is not None else None
    return {"format_version": FORMAT_VERSION, "model_config": model.config.to_dict(), "tokenizer": tok}


def unreadable_checkpoint(path: str | Path, err: BaseException) -> MiniGPTError:
    text = str(err).strip()
    reason = text.splitlines()[0].split(". ")[0][:160] if text else ""  # torch's first sentence
    return MiniGPTError(
        f"cannot read checkpoint {path}: corrupt, truncated or not a torch checkpoint "
        f"({type(err).__name__}{': ' + reason if reason else ''})"
    )


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """torch.load a `.ckpt`, weights_only (it runs no code) and memory-mapped (the weights stay on disk)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise MiniGPTError(
            f"checkpoint {path} does not exist; pass ckpt=PATH to a .ckpt file or export directory"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # zip/pickle/EOF/weights-only errors all mean "not a checkpoint we can read"
        raise unreadable_checkpoint(path, err) from None
    if not isinstance(ckpt, dict):
        raise MiniGPTError(f"checkpoint {path} holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


def _check_meta(meta: Any, source: Path) -> dict[str, Any]:
    if not isinstance(meta, dict) or "model_config" not in meta or "tokenizer" not in meta:
        raise MiniGPTError(
            f"{source} has no mini_gpt metadata (model config + tokenizer) and is no nanoGPT ckpt.pt "
            "(model_args + model); it was not written by mini-gpt training or export, nor by nanoGPT"
        )
    version = meta.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise MiniGPTError(
            f"{source} has mini_gpt format_version={version}; this mini-gpt reads version {FORMAT_VERSION}"
        )
    return meta


def _differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))


def _tokenizer_difference(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    if saved == current:
        return None
    kinds = [
        f"tiktoken {d.get('name')}" if d.get("type") == "tiktoken" else d.get("type")
        for d in (saved, current)
    ]
    if kinds[0] != kinds[1]:
        return f"tokenizer is {kinds[0]} in the checkpoint but {kinds[1]} in this run"
    if saved.get("type") == "char":
        old, new = saved.get("chars", ""), current.get("chars", "")
        only_old, only_new = ("".join(sorted(set(a) - set(b))) for a, b in ((old, new), (new, old)))
        detail = (
            f"only in the checkpoint: {only_old!r}; only in this corpus: {only_new!r}"
            if only_old or only_new
            else "same characters in a different order, so every id means another character"
        )
        return (
            f"character vocabulary differs ({len(old)} characters in the checkpoint, {len(new)} in this "
            f"run's corpus; {detail})"
        )
    saved, current = ({k: v for k, v in d.items() if k != "ranks"} for d in (saved, current))
    keys = _differences(saved, current)
    return f"tokenizer {kinds[0]} differs in {', '.join(keys or ['ranks'])}"


def require_training_state(checkpoint: dict[str, Any], source: str | Path) -> None:
    """Refuse a weights-only file (an export, a nanoGPT ckpt.pt without loops) as a run to resume."""
    if not isinstance(checkpoint.get("optimizer_states"), list) or "loops" not in checkpoint:
        raise MiniGPTError(
            f"{source} holds weights only (no optimizer or loop state), so training cannot resume from it; "
            "use a last.ckpt/best.ckpt written by training, or drop ckpt_path to start a new run"
        )


def check_resume(meta: Any, model_config: dict[str, Any], tokenizer: Tokenizer, source: str | Path) -> None:
    """Refuse to resume a run whose model config or tokenizer differ from the checkpoint's `mini_gpt` entry:
    a same-size character vocabulary with other characters would silently train on ids of a new meaning."""
    meta = _check_meta(meta, Path(source))
    # The tokenizer first: a different vocabulary is the cause of a different model.vocab_size.
    if why := _tokenizer_difference(meta["tokenizer"], tokenizer.to_dict()):
        raise MiniGPTError(
            f"cannot resume {source}: {why}; resume on the corpus and data.tokenizer it was trained with, "
            "or drop ckpt_path to start a new run"
        )
    saved = dict(meta["model_config"])
    if differ := _differences(saved, model_config):
        theirs = " ".join(f"model.{k}={saved.get(k)}" for k in differ)
        ours = " ".join(f"model.{k}={model_config.get(k)}" for k in differ)
        raise MiniGPTError(
            f"cannot resume {source}: the model differs from the checkpoint's in "
            f"{', '.join(differ)} (this run: {ours}); resume with the checkpoint's settings ({theirs}) "
            "or drop ckpt_path to start a new run"
        )


def _build(meta: dict[str, Any], weights: dict[str, torch.Tensor], source: Path) -> tuple[GPT, Tokenizer]:
    try:
        config = checked_config(GPTConfig, dict(meta["model_config"]), "model_config")
    except (TypeError, ValueError) as err:
        raise MiniGPTError(f"{source}: invalid model_config ({err})") from None
    tokenizer = tokenizer_from_dict(meta["tokenizer"])
    if has_lora_weights(weights):  # a LoRA fine-tuning checkpoint: fold the adapters into the weights
        lora = (meta.get("finetune") or {}).get("lora")
        if not isinstance(lora, dict):
            raise MiniGPTError(f"{source}: has LoRA weights but no record of its adapters (finetune.lora)")
        return merge_lora(config, LoraSpec.from_dict(lora), weights), tokenizer
    return _assemble(config, weights, tokenizer, source)


def _assemble(
    config: GPTConfig, weights: dict[str, torch.Tensor], tokenizer: Tokenizer, source: Path
) -> tuple[GPT, Tokenizer]:
    model = GPT(config)
    expected = set(model.state_dict())
    if config.tie_weights:  # tied exports store the shared matrix once (as the token embedding)
        weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
        expected.discard("lm_head.weight")
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise MiniGPTError(
            f"{source}: weights do not match the model config "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    try:
        model.load_state_dict(weights, strict=False)
    except RuntimeError as err:
        first = str(err).strip().splitlines()
        detail = next((line.strip() for line in first if "size mismatch" in line), first[0])
        raise MiniGPTError(f"{source}: weights do not fit the model config ({detail[:200]})") from None
    if tokenizer.vocab_size > config.vocab_size:
        raise MiniGPTError(
            f"{source}: tokenizer has {tokenizer.vocab_size} tokens but the model only {config.vocab_size}"
        )
    return model, tokenizer


def _load_dir(directory: Path, safetensors: bool) -> tuple[GPT, Tokenizer]:
    """A `format=safetensors` export (`safetensors`: its file was named), else a transformers directory."""
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise MiniGPTError(
            f"{directory} has no {CONFIG_FILE}, so it is not a model directory; pass a .ckpt file, a "
            "mini_gpt.interop.export directory or a transformers GPT-2 directory"
        )
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise MiniGPTError(
            f"cannot read {config_path} ({type(err).__name__}); re-run mini_gpt.interop.export"
        ) from None
    config = config if isinstance(config, dict) else {}
    if safetensors or "mini_gpt" in config:
        meta = _check_meta(config.get("mini_gpt"), config_path)
        weights_path = directory / SAFETENSORS_FILE
        if not weights_path.is_file():
            raise MiniGPTError(f"{weights_path} does not exist; re-run mini_gpt.interop.export")
        try:
            weights = load_file(weights_path)
        except (SafetensorError, OSError, ValueError) as err:
            raise MiniGPTError(f"cannot read {weights_path}: corrupt or truncated ({err})") from None
        return _build(meta, weights, weights_path)
    kind = config.get("model_type")
    if kind not in ARCHITECTURES:
        readable = ", ".join(a.label for a in ARCHITECTURES.values())
        raise MiniGPTError(
            f"{config_path} describes {f'{kind!r} model' if kind else 'no known model'}, not one "
            f"mini-gpt reads ({readable}); pass a .ckpt file, a `mini-gpt export` directory or a "
            "transformers directory"
        )
    tokenizer = load_hf_tokenizer(directory)  # first: a directory without one fails before the weights load
    return gpt_from_hf(directory), tokenizer


def load_model(
    path: str | Path, device: str | torch.device = "cpu", tokenizer: str | None = None
) -> tuple[GPT, Tokenizer]:
    """(GPT in eval mode, tokenizer) of a checkpoint or export (`tokenizer`: a nanoGPT ckpt's meta.pkl)."""
    path = Path(path).expanduser()
    export = path.is_dir() or (path.suffix == ".safetensors" and (path.parent / CONFIG_FILE).is_file())
    ckpt = None if export else read_checkpoint(path)
    if tokenizer and (ckpt is None or not is_nanogpt(ckpt)):
        raise MiniGPTError(
            f"tokenizer= applies to nanoGPT checkpoints only; {path} carries its own tokenizer"
        )
    if ckpt is None:
        model, tok = _load_dir(path if path.is_dir() else path.parent, safetensors=not path.is_dir())
    elif is_nanogpt(ckpt):  # shape from model_args, tokenizer from meta.pkl or GPT-2
        model, tok = _assemble(*nanogpt_parts(path, ckpt, tokenizer), path)
    else:
        meta = _check_meta(ckpt.get("mini_gpt"), path)
        if not isinstance(state := ckpt.get("state_dict"), dict):
            raise MiniGPTError(f"checkpoint {path} has no state_dict")
        state = {k.replace("_orig_mod.", ""): v for k, v in state.items()}  # wherever torch.compile put it
        weights = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
        model, tok = _build(meta, weights, path)
    return model.to(device).eval(), tok


def load_source(
    init_from: str, bpe_file: str | Path | None = None, tokenizer: str | None = None
) -> tuple[GPT, Tokenizer]:
    """What `load_model` reads, or a hub name (`bpe_file`: a local gpt2.tiktoken spares downloading it)."""
    if Path(init_from).expanduser().exists():
        return load_model(init_from, tokenizer=tokenizer)
    if init_from not in HUB_MODELS:
        raise MiniGPTError(
            f"init_from={init_from!r} is neither an existing path (a .ckpt file or a model directory) "
            f"nor a hub name ({', '.join(HUB_MODELS)})"
        )
    check_hub_available(init_from)
    return gpt_from_hf(init_from).eval(), build_tokenizer("gpt2", bpe_file=bpe_file)


def open_model(
    ckpt: str | None, init_from: str | None, bpe_file: str | None, device: str | torch.device,
    tokenizer: str | None = None,
) -> tuple[GPT, Tokenizer]:  # fmt: skip
    if bool(ckpt) == bool(init_from):
        raise MiniGPTError(
            "set exactly one of ckpt=PATH (checkpoint or export directory) or init_from=gpt2|HF_DIR"
        )
    if ckpt:
        return load_model(ckpt, device, tokenizer)
    model, tok = load_source(str(init_from), bpe_file, tokenizer)
    return model.to(device), tok
