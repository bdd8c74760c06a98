"""Our tokenizers in `transformers`' files and back (the tokenizer half of a `format=hf` directory)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mini_gpt.errors import MiniGPTError, import_extra
from mini_gpt.files import read_json
from mini_gpt.tokenizer import (
    GPT2_PAT_STR,
    CharTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    build_tokenizer,
    tokenizer_from_dict,
)
from mini_gpt.tokenizer.bpe import merge_parts

HF_TOKENIZER_FILE = "mini_gpt_tokenizer.json"  # our tokenizer, saved beside a `format=hf` export
GPT2_LIKE = ("gpt2", "r50k_base")  # GPT-2's vocabulary and regex: what transformers' GPT2Tokenizer does


def require_transformers() -> Any:
    hint = 'transformers conversion needs transformers: pip install -e ".[hf]" (or pip install transformers)'
    return import_extra("transformers", hint)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, the alphabet of byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def byte_level_bpe(tokenizer: TiktokenTokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The ranks as a byte-level BPE's vocabulary and merges (each token's merge recovered: `merge_parts`)."""
    to_char = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(to_char[x] for x in b)

    ranks, merges = tokenizer.ranks, []
    for tok in sorted(ranks, key=ranks.__getitem__):
        if len(tok) > 1:
            if (parts := merge_parts(tok, ranks)) is None:
                raise MiniGPTError(
                    f"tokenizer {tokenizer.name!r}: token {tok!r} is not one BPE merge of earlier tokens, "
                    "so it cannot be rebuilt outside mini-gpt; export with format=safetensors"
                )
            merges.append((text(parts[0]), text(parts[1])))
    return {text(tok): rank for tok, rank in ranks.items()}, merges


def gpt2_tokenizer_files(tokenizer: TiktokenTokenizer, model_max_length: int) -> dict[str, str]:
    vocab, merges = byte_level_bpe(tokenizer)
    vocab.update(tokenizer.special_tokens)
    eot = "<|endoftext|>" if "<|endoftext|>" in tokenizer.special_tokens else None
    config = {
        "tokenizer_class": "GPT2Tokenizer", "model_max_length": model_max_length, "add_prefix_space": False,
        "bos_token": eot, "eos_token": eot, "unk_token": eot,
    }  # fmt: skip
    return {
        "vocab.json": json.dumps(vocab, ensure_ascii=False),
        "merges.txt": "#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=1),
    }


def _greedy(pat_str: str) -> str:
    """Possessive quantifiers (`++`, `{1,3}+`) made greedy, which on tiktoken's patterns splits the same:
    `tokenizers`' Oniguruma reads the `+` as one more repetition."""
    return re.sub(r"(?<!\\)([+*?]|\{\d+(?:,\d*)?\})\+", r"\1", pat_str)


def fast_tokenizer(tokenizer: TiktokenTokenizer | CharTokenizer, model_max_length: int) -> Any:
    """A byte-level BPE with `ignore_merges` (a pre-token in the vocabulary is taken whole, as tiktoken does),
    or for characters a BPE without merges."""
    transformers = require_transformers()
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    if isinstance(tokenizer, CharTokenizer):
        backend = Backend(models.BPE(vocab={ch: i for i, ch in enumerate(tokenizer.chars)}, merges=[]))
        backend.decoder = decoders.Fuse()
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=backend, model_max_length=model_max_length
        )
    vocab, merges = byte_level_bpe(tokenizer)
    backend = Backend(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_greedy(tokenizer.pat_str)), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    backend.decoder = decoders.ByteLevel()
    eot = "<|endoftext|>" if "<|endoftext|>" in tokenizer.special_tokens else None
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=model_max_length, bos_token=eot, eos_token=eot
    )
    specials = sorted(tokenizer.special_tokens.items(), key=lambda kv: kv[1])
    fast.add_special_tokens({"additional_special_tokens": [t for t, _ in specials if t != eot]})
    for token, i in specials:
        if fast.convert_tokens_to_ids(token) != i:
            raise MiniGPTError(f"tokenizer {tokenizer.name!r}: special token {token} must follow the merges")
    return fast


def save_hf_tokenizer(tokenizer: Tokenizer, directory: Path, model_max_length: int) -> None:
    """Write ours exactly (HF_TOKENIZER_FILE) plus the files `AutoTokenizer` reads to the same ids."""
    (directory / HF_TOKENIZER_FILE).write_text(json.dumps(tokenizer.to_dict()), encoding="utf-8")
    if isinstance(tokenizer, TiktokenTokenizer) and tokenizer.name in GPT2_LIKE:
        for name, content in gpt2_tokenizer_files(tokenizer, model_max_length).items():
            (directory / name).write_text(content, encoding="utf-8")
    elif isinstance(tokenizer, (TiktokenTokenizer, CharTokenizer)):
        fast_tokenizer(tokenizer, model_max_length).save_pretrained(str(directory))


def load_hf_tokenizer(directory: Path) -> Tokenizer:
    """Our tokenizer saved in `directory`, else GPT-2's from its `vocab.json` (id = BPE rank), else for a
    GPT-2-sized config.json (`model.save_pretrained(DIR)` alone) the shipped GPT-2 BPE."""
    if (directory / HF_TOKENIZER_FILE).is_file():
        return tokenizer_from_dict(json.loads((directory / HF_TOKENIZER_FILE).read_text(encoding="utf-8")))
    vocab_path = directory / "vocab.json"
    if vocab_path.is_file():
        vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
        byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
        special = {tok: i for tok, i in vocab.items() if tok.startswith("<|") and tok.endswith("|>")}
        try:
            ranks = {bytes(byte_of[c] for c in tok): i for tok, i in vocab.items() if tok not in special}
        except KeyError:
            raise MiniGPTError(f"{vocab_path} is not a byte-level GPT-2 vocabulary") from None
        return TiktokenTokenizer("gpt2", GPT2_PAT_STR, ranks, special)
    gpt2 = build_tokenizer("gpt2")
    config = read_json(directory / "config.json") or {}
    if config.get("model_type") == "gpt2" and config.get("vocab_size") == gpt2.vocab_size:
        return gpt2
    raise MiniGPTError(
        f"{directory} has no tokenizer ({HF_TOKENIZER_FILE} or vocab.json) and its vocabulary is not GPT-2's "
        "(model_type gpt2, vocab_size 50257); save the tokenizer beside the weights: "
        "AutoTokenizer.from_pretrained(NAME).save_pretrained(DIR)"
    )
