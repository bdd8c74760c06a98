"""The text of a `data=` config's train or validation split as a stream of documents, for tokenizers:
training one (train split only, so the validation text stays unseen) and judging one (held-out split).

The splits are the ones training uses: text corpora (named ones and `data=text`) hold out the last
`val_fraction` of their concatenated characters (text.py), `data=hf` the documents `val_mask` picks.
Text files must be UTF-8 here (a tokenizer trained on U+FFFD replacements would be a silent mistake):
a bad byte is one line naming the file and offset. Memory stays flat: files are read in ~1 MB pieces
cut where pre-tokenization cuts anyway (`safe_cut`), documents one batch at a time.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from pathlib import Path

from mini_gpt.data.config import TEXT_CORPUS, AnyDataConfig, DataConfig, HFDataConfig, ShardsDataConfig
from mini_gpt.data.sources import iter_texts, named_corpus_file, open_source, text_files
from mini_gpt.data.split import val_mask
from mini_gpt.data.text import safe_cut
from mini_gpt.errors import MiniGPTError

PIECE_CHARS = 1 << 20
SPLITS = ("train", "val")


def _utf8_chunks(path: Path, chunk_bytes: int) -> Iterator[tuple[str, int]]:
    """(text, bytes read) of `path`, strictly decoded: a non-UTF-8 byte is a one-line error."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="strict")
    offset = 0
    with open(path, "rb") as fh:
        while True:
            raw = fh.read(chunk_bytes)
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as err:
                raise MiniGPTError(
                    f"{path} is not UTF-8 text (byte {offset + err.start:,}: {err.reason}); "
                    "convert it, e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8"
                ) from None
            yield text, len(raw)
            offset += len(raw)
            if not raw:
                return


def _corpus_files(cfg: DataConfig) -> list[Path]:
    return text_files(cfg) if cfg.name == TEXT_CORPUS else [named_corpus_file(cfg, None)]


def text_bytes(cfg: DataConfig) -> int:
    """Bytes of the text corpus's files (for a progress bar)."""
    return sum(f.stat().st_size for f in _corpus_files(cfg))


def _text_split(cfg: DataConfig, split: str) -> Iterator[tuple[str, int]]:
    """(piece, bytes read) of a text corpus's split: every file is read twice, first to count its
    characters (where the train/val cut falls) and check it is UTF-8 before any work is done."""
    files = _corpus_files(cfg)
    total = sum(len(text) for f in files for text, _ in _utf8_chunks(f, PIECE_CHARS))
    if total == 0:
        raise MiniGPTError(f"data.path={cfg.path or files[0]} is empty (0 characters); add text or fix it")
    split_at = int(total * (1 - cfg.val_fraction))  # as text.py: the last val_fraction is validation
    seen = 0
    for path in files:
        carry = ""
        for text, nbytes in _utf8_chunks(path, PIECE_CHARS):
            lo, hi = seen, seen + len(text)
            seen = hi
            if split == "train":
                text = text[: max(0, split_at - lo)]
            else:
                text = text[max(0, split_at - lo) :] if hi > split_at else ""
            buf = carry + text
            cut = safe_cut(buf, PIECE_CHARS) if nbytes else len(buf)
            if cut:
                yield buf[:cut], nbytes
                buf = buf[cut:]
            carry = buf  # empty after the file's last (final) chunk: cut = len(buf) there


def _hf_split(cfg: HFDataConfig, split: str) -> Iterator[tuple[str, int]]:
    """(document, its UTF-8 bytes) of the documents of `split` (val_mask decides, as for the shards)."""
    doc = 0
    for texts in iter_texts(open_source(cfg)):
        mask = val_mask(doc, len(texts), cfg.val_fraction, cfg.split_seed)
        for i, (text, is_val) in enumerate(zip(texts, mask, strict=True)):
            if not isinstance(text, str):
                raise MiniGPTError(
                    f"document {doc + i} of {cfg.dataset} has a {type(text).__name__} in column "
                    f"{cfg.text_field!r}, not text; set data.text_field to the text column"
                )
            if bool(is_val) == (split == "val"):
                yield text, len(text.encode("utf-8"))
        doc += len(texts)


def split_documents(cfg: AnyDataConfig, split: str = "train") -> Iterator[tuple[str, int]]:
    """(text, source bytes consumed) pieces of `split` ("train" or "val") of any text `data=` config."""
    if split not in SPLITS:
        raise MiniGPTError(f"split={split!r} must be train or val")
    if isinstance(cfg, ShardsDataConfig):
        raise MiniGPTError(
            "data=shards holds token ids, not text: a tokenizer needs text; use data=text data.path=... "
            "or data=hf data.dataset=... with the corpus the shards came from"
        )
    return _hf_split(cfg, split) if isinstance(cfg, HFDataConfig) else _text_split(cfg, split)
