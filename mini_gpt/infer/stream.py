"""Prompts in, printable text out: prompts read and encoded, tokens streamed as text, stop strings."""

from __future__ import annotations

import re
from pathlib import Path

from mini_gpt.errors import MiniGPTError
from mini_gpt.tokenizer import Tokenizer


def unescape(text: str) -> str:
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def prompt_text(prompt: str | None, prompt_file: str | None = None) -> str:
    """`prompt` unescaped (as `stop=`), or FILE verbatim for `@FILE` or `prompt_file` (`@@`: a literal @)."""
    prompt = "" if prompt is None else str(prompt)
    if prompt_file and prompt:
        raise MiniGPTError("set either prompt or prompt_file, not both")
    if prompt.startswith("@@"):
        return unescape(prompt[1:])
    path = prompt_file or (prompt[1:] if prompt.startswith("@") else None)
    if path is None:
        return unescape(prompt)
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or err  # a UnicodeDecodeError has no strerror
        raise MiniGPTError(f"cannot read prompt file {path} ({type(err).__name__}: {why})") from None


def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """An empty prompt starts from end-of-text (BPE) or a newline (characters)."""
    return (tokenizer.encode(text) if text else []) or [tokenizer.start_id]


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """One token's own text; part of a UTF-8 character shows as \\xNN bytes (not `decode`'s U+FFFD)."""
    if (encoding := getattr(tokenizer, "encoding", None)) is not None:  # tiktoken's
        return encoding.decode_single_token_bytes(token_id).decode("utf-8", errors="backslashreplace")
    return tokenizer.decode([token_id])


class TextStream:
    """One sample's ids as printable pieces: held back while they end in half a UTF-8 character (at most
    MAX_PENDING) or could begin a stop string; the sample ends before a stop string."""

    MAX_PENDING = 8

    def __init__(self, tokenizer: Tokenizer, stops: list[str]) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.text = ""  # the sample so far (without the prompt), cut at a stop string
        self.emitted = 0  # characters of text already handed out
        self.tokens = 0  # tokens consumed
        self.stopped = False
        self._pending: list[int] = []

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.tokens += 1
        self._pending.append(token)
        piece = self.tokenizer.decode(self._pending)
        if piece.endswith("\ufffd") and len(self._pending) < self.MAX_PENDING:
            return ""
        self._pending = []
        return self._add(piece, final=False)

    def flush(self) -> str:
        piece = self.tokenizer.decode(self._pending) if self._pending and not self.stopped else ""
        self._pending = []
        return self._add(piece, final=True)

    def _add(self, piece: str, final: bool) -> str:
        longest = max((len(s) for s in self.stops), default=0)
        search_from = max(0, len(self.text) - longest + 1)
        self.text += piece
        if hits := [i for i in (self.text.find(s, search_from) for s in self.stops) if i >= 0]:
            self.text = self.text[: min(hits)]
            self.stopped = True
        end = len(self.text)
        if not (self.stopped or final):  # hold back the longest end that may begin a stop string
            tails = range(min(end, longest - 1), 0, -1)
            end -= next((k for k in tails if any(s.startswith(self.text[-k:]) for s in self.stops)), 0)
        out = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return out
