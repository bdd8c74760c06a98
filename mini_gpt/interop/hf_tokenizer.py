"""Our tokenizers in `transformers`' files and back (the tokenizer half of a `format=hf` directory).

`save_hf_tokenizer` writes ours as `mini_gpt_tokenizer.json` (exact) plus `transformers`' own files, so
`AutoTokenizer.from_pretrained(dir)` gives the same ids (GPT-2's BPE files; any other tiktoken BPE, such as
one from `mini-gpt tokenizer train`, as a `tokenizers` byte-level BPE in tokenizer.json; a `tokenizers`
character vocabulary); `load_hf_tokenizer` reads ours, else GPT-2's `vocab.json`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mini_gpt.errors import MiniGPTError
from mini_gpt.tokenizer import (
    GPT2_PAT_STR,
    CharTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    tokenizer_from_dict,
)
from mini_gpt.tokenizer.bpe import merge_parts

__all__ = [
    "HF_TOKENIZER_FILE",
    "char_tokenizer",
    "gpt2_tokenizer_files",
    "load_hf_tokenizer",
    "require_transformers",
    "save_hf_tokenizer",
]

HF_TOKENIZER_FILE = "mini_gpt_tokenizer.json"  # our tokenizer, saved beside a `format=hf` export
# tiktoken encodings with GPT-2's vocabulary *and* pre-tokenisation regex, which is what
# transformers' GPT2Tokenizer implements.
GPT2_LIKE = ("gpt2", "r50k_base")


def require_transformers() -> Any:
    """The `transformers` module, or a one-line MiniGPTError saying how to install it."""
    try:
        import transformers
    except ImportError as err:
        raise MiniGPTError(
            'transformers conversion needs transformers: pip install -e ".[hf]" (or pip install transformers)'
        ) from err
    return transformers


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (the alphabet of vocab.json/merges.txt)."""
    require_transformers()
    try:
        from transformers.convert_slow_tokenizer import bytes_to_unicode
    except ImportError:  # transformers 4.x kept it beside the GPT-2 tokenizer
        from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
    return bytes_to_unicode()


def _vocab_and_merges(tokenizer: TiktokenTokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The ranks as a byte-level BPE's vocabulary and merges, in GPT-2's printable byte alphabet. tiktoken
    stores only ranks (token bytes -> id): each token's merge is recovered by running BPE on its bytes
    with the merges ranked before it, which must end in exactly two parts."""
    to_char = _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(to_char[x] for x in b)

    ranks = tokenizer.ranks
    vocab = {text(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok in sorted(ranks, key=ranks.__getitem__):
        if len(tok) < 2:
            continue
        parts = merge_parts(tok, ranks)
        if parts is None:
            raise MiniGPTError(
                f"tokenizer {tokenizer.name!r}: token {tok!r} is not one BPE merge; use format=safetensors"
            )
        merges.append((text(parts[0]), text(parts[1])))
    return vocab, merges


def gpt2_tokenizer_files(tokenizer: TiktokenTokenizer, model_max_length: int) -> dict[str, str]:
    """vocab.json, merges.txt and tokenizer_config.json for transformers' GPT2Tokenizer."""
    vocab, merges = _vocab_and_merges(tokenizer)
    vocab.update(tokenizer.special_tokens)
    eot = "<|endoftext|>" if "<|endoftext|>" in tokenizer.special_tokens else None
    config: dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": model_max_length,
        "add_prefix_space": False,
        "bos_token": eot,
        "eos_token": eot,
        "unk_token": eot,
    }
    return {
        "vocab.json": json.dumps(vocab, ensure_ascii=False),
        "merges.txt": "#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=1),
    }


def char_tokenizer(tokenizer: CharTokenizer, model_max_length: int) -> Any:
    """Our character vocabulary as a `transformers` fast tokenizer: a `tokenizers` BPE model with no merges
    (one id per character) and the `Fuse` decoder (no spaces between characters). Characters outside the
    vocabulary are dropped there, where our CharTokenizer raises an error naming them."""
    transformers = require_transformers()
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models

    vocab = {ch: i for i, ch in enumerate(tokenizer.chars)}
    backend = Backend(models.BPE(vocab=vocab, merges=[]))
    backend.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=model_max_length)


def _greedy(pat_str: str) -> str:
    """`pat_str` with possessive quantifiers (`++`, `*+`, `?+`, `{1,3}+`) made greedy: the Oniguruma engine
    of `tokenizers` reads a trailing `+` as one more repetition, and on tiktoken's patterns the greedy
    spelling splits text the same way (GPT-2's 2019 and cl100k's first spellings had none)."""
    return re.sub(r"(?<!\\)([+*?]|\{\d+(?:,\d*)?\})\+", r"\1", pat_str)


def bpe_tokenizer(tokenizer: TiktokenTokenizer, model_max_length: int) -> Any:
    """Any tiktoken BPE as a `transformers` fast tokenizer (saved as tokenizer.json): a `tokenizers`
    byte-level BPE with tiktoken's split regex, whole pre-tokens in the vocabulary taken as they are
    (`ignore_merges`, as tiktoken does), and the special tokens."""
    transformers = require_transformers()
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    vocab, merges = _vocab_and_merges(tokenizer)
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


def _gpt2_tokenizer_from_vocab(vocab_path: Path) -> Tokenizer:
    """GPT-2's byte-level BPE from a transformers `vocab.json`: token id = BPE rank (true for GPT-2)."""
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    byte_of = {ch: b for b, ch in _bytes_to_unicode().items()}
    special = {tok: i for tok, i in vocab.items() if tok.startswith("<|") and tok.endswith("|>")}
    try:
        ranks = {bytes(byte_of[c] for c in tok): i for tok, i in vocab.items() if tok not in special}
    except KeyError:
        raise MiniGPTError(f"{vocab_path} is not a byte-level GPT-2 vocabulary") from None
    return TiktokenTokenizer("gpt2", GPT2_PAT_STR, ranks, special)


def save_hf_tokenizer(tokenizer: Tokenizer, directory: Path, model_max_length: int) -> None:
    """Write our tokenizer and, where `transformers` has a counterpart, its files (module docstring)."""
    (directory / HF_TOKENIZER_FILE).write_text(json.dumps(tokenizer.to_dict()), encoding="utf-8")
    if isinstance(tokenizer, TiktokenTokenizer) and tokenizer.name in GPT2_LIKE:
        for name, content in gpt2_tokenizer_files(tokenizer, model_max_length).items():
            (directory / name).write_text(content, encoding="utf-8")
    elif isinstance(tokenizer, TiktokenTokenizer):
        bpe_tokenizer(tokenizer, model_max_length).save_pretrained(str(directory))
    elif isinstance(tokenizer, CharTokenizer):
        char_tokenizer(tokenizer, model_max_length).save_pretrained(str(directory))


def load_hf_tokenizer(directory: Path) -> Tokenizer:
    """Our tokenizer saved in `directory`, else GPT-2's from its `vocab.json`."""
    ours = directory / HF_TOKENIZER_FILE
    if ours.is_file():
        return tokenizer_from_dict(json.loads(ours.read_text(encoding="utf-8")))
    if (directory / "vocab.json").is_file():
        return _gpt2_tokenizer_from_vocab(directory / "vocab.json")
    raise MiniGPTError(f"{directory} has no tokenizer ({HF_TOKENIZER_FILE} or vocab.json)")
