"""A `data=` config's train or val split as documents, for training or judging a tokenizer: training's own
splits. Text must be UTF-8 here (a tokenizer trained on U+FFFD would be a silent mistake)."""

from __future__ import annotations

from collections.abc import Iterator

from mini_gpt.data.config import AnyDataConfig, DataConfig, HFDataConfig, ShardsDataConfig
from mini_gpt.data.sources import corpus_files, iter_texts, open_source
from mini_gpt.data.split import val_mask
from mini_gpt.data.text import PIECE_CHARS, decoded_chunks, text_pieces
from mini_gpt.errors import MiniGPTError

SPLITS = ("train", "val")


def text_bytes(cfg: DataConfig) -> int:
    return sum(f.stat().st_size for f in corpus_files(cfg))


def _text_split(cfg: DataConfig, split: str) -> Iterator[tuple[str, int]]:
    files = corpus_files(cfg)
    total = sum(len(text) for _, text, _ in decoded_chunks(files, PIECE_CHARS, strict=True))
    if total == 0:
        raise MiniGPTError(f"data.path={cfg.path or files[0]} is empty (0 characters); add text or fix it")
    split_at = int(total * (1 - cfg.val_fraction))  # as text.py: the last val_fraction is validation
    for side, _, text, nbytes in text_pieces(files, split_at, PIECE_CHARS, exact_cuts=True):
        if side == SPLITS.index(split):
            yield text, nbytes


def _hf_split(cfg: HFDataConfig, split: str) -> Iterator[tuple[str, int]]:
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
    """(text, source bytes consumed) pieces of `split` ("train" or "val")."""
    if split not in SPLITS:
        raise MiniGPTError(f"split={split!r} must be train or val")
    if isinstance(cfg, ShardsDataConfig):
        raise MiniGPTError(
            "data=shards holds token ids, not text: a tokenizer needs text; use data=text data.path=... "
            "or data=hf data.dataset=... with the corpus the shards came from"
        )
    return _hf_split(cfg, split) if isinstance(cfg, HFDataConfig) else _text_split(cfg, split)
