"""Train a byte-level BPE as a tiktoken tokenizer with `rustbpe` (docs/tokenizers.md). Patterns avoid
possessive quantifiers (`++`), which `tokenizers`' Oniguruma (a transformers export) reads as "once more"."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from mini_gpt.errors import MiniGPTError, import_extra
from mini_gpt.files import atomic_dir, atomic_write, write_json_atomic
from mini_gpt.tokenizer import ENCODING_FILE, EOT, RANKS_FILE, README_FILE, TiktokenTokenizer

N_BYTES = 256
PATTERNS: dict[str, str] = {
    # GPT-2's 2019 regex: letters, numbers and other symbols each in runs with one optional leading space.
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    # GPT-4's (cl100k_base): numbers in groups of at most 3 digits, contractions in any case, a word
    # keeps one leading non-letter (space, quote), punctuation keeps the newlines after it.
    "gpt4": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+""",
    # nanochat's: GPT-4's with numbers in groups of at most 2 digits (small vocabularies).
    "nanochat": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+""",
}
DEFAULT_PATTERN = "gpt4"
_README = """# Tokenizer `{name}`: byte-level BPE, {vocab_size:,} tokens

Trained by `mini-gpt tokenizer train`. Load it with plain tiktoken (no mini-gpt needed):

```python
import json, tiktoken
from tiktoken.load import load_tiktoken_bpe

spec = json.load(open("{encoding_file}"))
enc = tiktoken.Encoding(name=spec["name"], pat_str=spec["pat_str"],
                        mergeable_ranks=load_tiktoken_bpe("{ranks_file}"),
                        special_tokens=spec["special_tokens"])
```

In mini-gpt: `data.tokenizer=<this directory>`.
"""


def merge_parts(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """The two tokens whose merge made `token`: BPE on its bytes with the earlier merges only (tiktoken keeps
    ranks, not merges). None: a merges list (transformers, llama.cpp) could not rebuild this token."""
    rank = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best, best_rank = -1, rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best < 0:
            return None
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def check_vocab_size(vocab_size: int, special_tokens: Iterable[str]) -> int:
    """The number of merges `vocab_size` asks for; below 256 bytes + the specials is one line."""
    n_special = len(list(special_tokens))
    least = N_BYTES + n_special + 1
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < least:
        raise MiniGPTError(
            f"vocab_size={vocab_size!r} leaves no merges: it must exceed the {N_BYTES} byte tokens plus "
            f"{n_special} special token(s), i.e. be >= {least} (e.g. vocab_size=4096)"
        )
    return vocab_size - N_BYTES - n_special


def cropped(texts: Iterable[str], max_chars: int | None, doc_max_chars: int | None) -> Iterator[str]:
    left = sys.maxsize if max_chars is None else max_chars
    for text in texts:
        if text := text[:doc_max_chars][:left]:  # doc_max_chars None: all of it
            left -= len(text)
            yield text
        if left <= 0:
            return


def train_bpe(
    texts: Iterable[str], vocab_size: int, *, name: str = "bpe", pattern: str = DEFAULT_PATTERN,
    special_tokens: Iterable[str] = (EOT,),
) -> TiktokenTokenizer:  # fmt: skip
    """A byte-level BPE of `vocab_size` tokens (bytes, merges, then `special_tokens`) learned on `texts`,
    streamed; the same texts give the same ranks."""
    rustbpe = import_extra("rustbpe", 'training a tokenizer needs rustbpe: pip install -e ".[tokenizer]"')
    specials = list(dict.fromkeys(special_tokens))
    n_merges = check_vocab_size(vocab_size, specials)
    regex = PATTERNS.get(pattern, pattern)  # a named pattern, or a regex (it contains `\`)
    if "\\" not in regex:
        raise MiniGPTError(f"unknown pattern={pattern!r}; use one of {', '.join(PATTERNS)} or a regex")
    trainer = rustbpe.Tokenizer()
    try:  # on no text: the regex's own error, apart from those the texts raise (a missing data.path)
        trainer.train_from_iterator(iter(()), N_BYTES, pattern=regex)
    except ValueError as err:  # a regex rustbpe cannot compile
        raise MiniGPTError(f"pattern {pattern!r} is not a valid regex: {err}") from None
    trainer.train_from_iterator(iter(texts), N_BYTES + n_merges, pattern=regex)
    ranks = {bytes(token): rank for token, rank in trainer.get_mergeable_ranks()}
    learned = len(ranks) - N_BYTES
    if learned < n_merges:
        raise MiniGPTError(
            f"the corpus is too small for vocab_size={vocab_size}: it had pairs for only {learned:,} of "
            f"the {n_merges:,} merges; use vocab_size<={N_BYTES + learned + len(specials)} or more text"
        )
    return TiktokenTokenizer(name, regex, ranks, {tok: len(ranks) + i for i, tok in enumerate(specials)})


def write_tokenizer_dir(tok: TiktokenTokenizer, out: Path, overwrite: bool, info: dict[str, Any]) -> None:
    """Save `tok` as the directory `out` (`info`: how it was trained), whole or not at all (`atomic_dir`)."""
    out = out.expanduser().resolve()
    if out.exists() and not overwrite:
        raise MiniGPTError(f"out={out} exists; choose another directory or pass overwrite=true to replace it")
    if out.exists() and not out.is_dir():
        raise MiniGPTError(f"out={out} is a file, not a directory; choose another path")
    with atomic_dir(out) as tmp:
        with atomic_write(tmp / RANKS_FILE) as fh:
            fh.write(tok.ranks_text)
        with atomic_write(tmp / README_FILE) as fh:
            fh.write(_README.format(name=tok.name, vocab_size=tok.vocab_size, encoding_file=ENCODING_FILE,
                                    ranks_file=RANKS_FILE))  # fmt: skip
        spec = {"name": tok.name, "pat_str": tok.pat_str, "special_tokens": tok.special_tokens,
                "vocab_size": tok.vocab_size, "ranks_sha256": tok.ranks_sha256, "trained": info}  # fmt: skip
        write_json_atomic(tmp / ENCODING_FILE, spec, indent=1)
