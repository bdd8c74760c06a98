"""Tokenizers: characters or tiktoken BPE behind one serialisable interface (`Tokenizer`); `to_dict()` embeds
the BPE ranks (~0.8 MB for GPT-2), so a checkpoint alone generates text."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import tiktoken

from mini_gpt.errors import MiniGPTError

# Ranks files shipped with the repository, by encoding name (r50k_base is GPT-2's vocabulary).
BUNDLED_BPE_FILES: dict[str, Path] = dict.fromkeys(
    ("gpt2", "r50k_base"), Path(__file__).resolve().parents[2] / "data" / "tokenizers" / "gpt2.tiktoken"
)
NETWORK_TIMEOUT_S = 20.0  # tiktoken.get_encoding's downloads have no timeout: a black-holed network hangs


@dataclass(frozen=True)
class EncodingSpec:
    """`tiktoken.Encoding`'s arguments besides the ranks, and the sha256 a `data.bpe_file` must match."""

    pat_str: str
    special_tokens: dict[str, int]
    ranks_sha256: str


# tiktoken's API gives an Encoding's ranks and special tokens but not its regex: its encodings as in
# tiktoken 0.14's tiktoken_ext/openai_public.py (test_tokenizer.py checks).
EOT = "<|endoftext|>"
FIM = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>")  # fill-in-the-middle tokens, consecutive ids
# GPT-2's regex in tiktoken's faster spelling (same splits as the 2019 release's pattern).
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
    r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_UPPER, _LOWER = r"""[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]""", r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}]"""
_CONTRACTION = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
O200K_PAT_STR = (
    rf"""[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTION}|"""
    rf"""[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTION}|"""
    r"""\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"  # r50k_base.tiktoken
P50K_RANKS_SHA256 = "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069"
O200K_RANKS_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_SPECIAL_TOKENS = {EOT: 199999, "<|endofprompt|>": 200018}
# o200k_harmony's named tokens from id 199998 on (None: `<|reserved_ID|>`), then reserved up to 201087.
_HARMONY_NAMED = ("startoftext", "endoftext", None, None, "return", "constrain", None, "channel", "start",
                  "end", "message", None, None, None, "call")  # fmt: skip
ENCODINGS: dict[str, EncodingSpec] = {
    # `gpt2` is r50k_base built from GPT-2's original vocab.bpe + encoder.json: the same ranks.
    "gpt2": EncodingSpec(GPT2_PAT_STR, {EOT: 50256}, GPT2_RANKS_SHA256),
    "r50k_base": EncodingSpec(GPT2_PAT_STR, {EOT: 50256}, GPT2_RANKS_SHA256),
    "p50k_base": EncodingSpec(GPT2_PAT_STR, {EOT: 50256}, P50K_RANKS_SHA256),
    "p50k_edit": EncodingSpec(
        GPT2_PAT_STR, {EOT: 50256, **{t: i for i, t in enumerate(FIM, 50281)}}, P50K_RANKS_SHA256
    ),
    "cl100k_base": EncodingSpec(
        CL100K_PAT_STR,
        {EOT: 100257, **{t: i for i, t in enumerate(FIM, 100258)}, "<|endofprompt|>": 100276},
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": EncodingSpec(O200K_PAT_STR, O200K_SPECIAL_TOKENS, O200K_RANKS_SHA256),
    "o200k_harmony": EncodingSpec(
        O200K_PAT_STR,
        {
            **O200K_SPECIAL_TOKENS,
            **{f"<|{name or f'reserved_{i}'}|>": i for i, name in enumerate(_HARMONY_NAMED, 199998)},
            **{f"<|reserved_{i}|>": i for i in range(200013, 201088)},
        },
        O200K_RANKS_SHA256,
    ),
}


class Tokenizer(ABC):
    """What the rest of mini-gpt needs from a tokenizer."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...  # ids are 0..vocab_size-1

    @property
    @abstractmethod
    def eot_id(self) -> int | None: ...  # the end-of-text token that separates documents (None: none)

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    @abstractmethod
    def to_dict(self) -> dict[str, Any]: ...  # primitives only: it fits `weights_only` checkpoints

    def encode_ordinary(self, text: str) -> list[int]:
        """`encode`, with text that looks like a special token (`<|endoftext|>` in a file) as plain text."""
        return self.encode(text)

    def known_text(self, text: str) -> str:
        """`text` without the characters this vocabulary cannot encode."""
        return text

    @property
    def start_id(self) -> int:
        """What an empty prompt starts from: end-of-text, else a newline, else the first id."""
        if self.eot_id is not None:
            return self.eot_id
        newline = self.encode(self.known_text("\n"))
        return newline[0] if newline else 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.vocab_size))


# The char tokenizer's end-of-text, U+0003 END OF TEXT: sharded corpora (data=hf tokenizer=char) put it
# before every document, as GPT-2's <|endoftext|>; a vocabulary without it (tiny Shakespeare) has none.
CHAR_EOT = "\x03"


class CharTokenizer(Tokenizer):
    """One id per character: id = position in `chars`."""

    def __init__(self, chars: str) -> None:
        if not chars:
            raise MiniGPTError("character vocabulary is empty: build it from a non-empty corpus")
        if len(set(chars)) != len(chars):
            raise MiniGPTError("character vocabulary has repeated characters; pass distinct characters")
        self.chars = chars
        self._stoi = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    @property
    def eot_id(self) -> int | None:
        return self._stoi.get(CHAR_EOT)

    def encode(self, text: str) -> list[int]:
        stoi = self._stoi
        try:
            return [stoi[c] for c in text]
        except KeyError:
            unknown = sorted(set(text) - stoi.keys())
            shown = ", ".join(repr(c) for c in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
            raise MiniGPTError(
                f"text has {len(unknown)} character(s) not in the character vocabulary: {shown}; "
                "remove them, or train on a corpus that contains them"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        chars, n = self.chars, len(self.chars)
        ids = [int(i) for i in ids]
        if bad := sorted({i for i in ids if not 0 <= i < n}):
            raise MiniGPTError(f"token ids {bad[:10]} are outside the character vocabulary (0..{n - 1})")
        return "".join([chars[i] for i in ids])

    def known_text(self, text: str) -> str:
        return "".join(c for c in text if c in self._stoi)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "char", "chars": self.chars}

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


class TiktokenTokenizer(Tokenizer):
    """A tiktoken `Encoding` and what rebuilds it offline; `encode` reads special-token text (prompts)."""

    def __init__(
        self, name: str, pat_str: str, mergeable_ranks: dict[bytes, int], special_tokens: dict[str, int]
    ) -> None:
        self.name, self.pat_str, self.special_tokens = name, pat_str, dict(special_tokens)
        self.ranks = mergeable_ranks  # token bytes -> id
        self.encoding = tiktoken.Encoding(
            name=name, pat_str=pat_str, mergeable_ranks=mergeable_ranks, special_tokens=self.special_tokens
        )

    @classmethod
    def from_encoding(cls, enc: Any) -> TiktokenTokenizer:
        specials = {token: enc.encode_single_token(token) for token in enc.special_tokens_set}
        ranks = {}
        for i in sorted(set(range(enc.n_vocab)) - set(specials.values())):
            with contextlib.suppress(KeyError):  # an unused id (cl100k_base and o200k_base have gaps)
                ranks[enc.decode_single_token_bytes(i)] = i
        return cls(enc.name, encoding_spec(enc.name).pat_str, ranks, specials)

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    @property
    def eot_id(self) -> int | None:
        return self.special_tokens.get("<|endoftext|>")

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode(text, allowed_special="all")

    def encode_ordinary(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        try:
            return self.encoding.decode([int(i) for i in ids], errors="replace")
        except KeyError as err:
            raise MiniGPTError(
                f"token id {err} is not in the {self.name} vocabulary (0..{self.vocab_size - 1})"
            ) from None

    @cached_property
    def ranks_text(self) -> str:
        items = sorted(self.ranks.items(), key=lambda kv: kv[1])
        return "".join(f"{base64.b64encode(tok).decode()} {rank}\n" for tok, rank in items)

    @property
    def ranks_sha256(self) -> str:
        return hashlib.sha256(self.ranks_text.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"type": "tiktoken", "name": self.name, "pat_str": self.pat_str,
                "special_tokens": dict(self.special_tokens), "ranks_sha256": self.ranks_sha256,
                "ranks": self.ranks_text}  # fmt: skip

    def __repr__(self) -> str:
        return f"TiktokenTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


def parse_tiktoken_ranks(data: bytes | str, source: str = "ranks") -> dict[bytes, int]:
    """Parse `.tiktoken` text: lines of `base64(token_bytes) rank`."""
    if isinstance(data, bytes):
        data = data.decode("ascii", errors="replace")
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:  # binascii.Error (bad base64) is a ValueError too
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise MiniGPTError(
                f"{source}: line {lineno} is not `base64 rank` ({line[:60]!r}); "
                "pass a tiktoken ranks file such as gpt2.tiktoken as data.bpe_file"
            ) from None
    if not ranks:
        raise MiniGPTError(f"{source}: no BPE ranks found; pass a non-empty .tiktoken file as data.bpe_file")
    return ranks


def encoding_spec(name: str) -> EncodingSpec:
    if (spec := ENCODINGS.get(name)) is None:
        raise MiniGPTError(f"unknown tiktoken encoding {name!r}; use char or one of: {', '.join(ENCODINGS)}")
    return spec


def _from_bpe_file(name: str, bpe_file: str | Path) -> TiktokenTokenizer:
    path = Path(bpe_file).expanduser().resolve()
    if not path.is_file():
        if (shipped := BUNDLED_BPE_FILES.get(name)) is not None and shipped.is_file():
            raise MiniGPTError(
                f"BPE ranks file {path} does not exist; {name}'s ranks ship in {shipped} and are used when "
                "data.bpe_file is unset: drop the bpe_file override (or fix its path)"
            )
        raise MiniGPTError(f"BPE ranks file {path} does not exist; fix data.bpe_file=PATH/{name}.tiktoken")
    data = path.read_bytes()
    spec = encoding_spec(name)
    # Checked here, not by tiktoken.load.load_tiktoken_bpe: it copies even a local file into its cache
    # and checks `expected_hash` only while that cache is on.
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.ranks_sha256:
        raise MiniGPTError(
            f"{path} has sha256 {digest}, but the {name} ranks file has {spec.ranks_sha256}; "
            f"point data.bpe_file at the {name} .tiktoken file"
        )
    ranks = parse_tiktoken_ranks(data, source=str(path))
    return TiktokenTokenizer(name, spec.pat_str, ranks, spec.special_tokens)


def _get_encoding(name: str) -> Any:
    """tiktoken.get_encoding, but giving up after NETWORK_TIMEOUT_S."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["enc"] = tiktoken.get_encoding(name)
        except BaseException as err:  # handed to the caller below
            result["err"] = err

    thread = threading.Thread(target=target, name=f"tiktoken-{name}", daemon=True)
    thread.start()
    thread.join(NETWORK_TIMEOUT_S)
    if "enc" in result:
        return result["enc"]
    why = f"no answer within {NETWORK_TIMEOUT_S:.0f} s"
    if (reason := result.get("err")) is not None:
        host = re.search(r"host='([^']+)'", str(reason))  # requests' long retry message names the server
        why = f"{host.group(1)} does not answer" if host else f"{type(reason).__name__}: {str(reason)[:120]}"
    raise MiniGPTError(
        f"cannot load the {name} tokenizer offline ({why}); "
        f"either set data.bpe_file=PATH/{name}.tiktoken (a local tiktoken ranks file) or set "
        "TIKTOKEN_CACHE_DIR to a directory holding tiktoken's cached files"
    )


# A trained tokenizer's directory (docs/tokenizers.md#the-directory-a-tiktoken-tokenizer)
RANKS_FILE, ENCODING_FILE, README_FILE = "ranks.tiktoken", "encoding.json", "README.md"


def load_tokenizer_dir(directory: str | Path) -> TiktokenTokenizer:
    """The tokenizer `mini-gpt tokenizer train` wrote."""
    path = Path(directory).expanduser().resolve()
    hint = "train one with: mini-gpt tokenizer train data=... vocab_size=4096 out=DIR"
    if not path.is_dir():
        raise MiniGPTError(f"tokenizer directory {path} does not exist; {hint}")
    if missing := [f for f in (RANKS_FILE, ENCODING_FILE) if not (path / f).is_file()]:
        raise MiniGPTError(f"tokenizer directory {path} lacks {' and '.join(missing)}; {hint}")
    try:
        spec = json.loads((path / ENCODING_FILE).read_text(encoding="utf-8"))
        name, pat_str, specials = spec["name"], spec["pat_str"], dict(spec["special_tokens"])
    except (ValueError, KeyError, TypeError) as err:
        raise MiniGPTError(f"{path / ENCODING_FILE} is not a tokenizer description ({err}); {hint}") from None
    data = (path / RANKS_FILE).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if spec.get("ranks_sha256", digest) != digest:
        raise MiniGPTError(f"{path / RANKS_FILE} does not match the sha256 in {ENCODING_FILE}; {hint}")
    ranks = parse_tiktoken_ranks(data, source=str(path / RANKS_FILE))
    try:
        return TiktokenTokenizer(name, pat_str, ranks, specials)
    except ValueError as err:  # tiktoken's own checks (a special id inside the ranks, a bad regex)
        raise MiniGPTError(f"{path}: tiktoken refuses this tokenizer ({err}); {hint}") from None


def is_tokenizer_dir(name: str) -> bool:
    """Whether `name` is a trained tokenizer's directory: it looks like a path, or is one and no built-in."""
    looks_like_path = "/" in name or "\\" in name or name.startswith((".", "~"))
    return looks_like_path or (name != "char" and name not in ENCODINGS and Path(name).is_dir())


def build_tokenizer(name: str, bpe_file: str | Path | None = None, text: str | None = None) -> Tokenizer:
    """`char` (vocabulary from `text`), a trained tokenizer's directory or a tiktoken encoding (its ranks from
    `bpe_file`, else the repository's copy, else `tiktoken.get_encoding`)."""
    if is_tokenizer_dir(name):
        if bpe_file is not None:
            raise MiniGPTError(f"data.bpe_file is for tiktoken's encodings; drop it ({name} has its ranks)")
        return load_tokenizer_dir(name)
    if name == "char":
        if text is None:
            raise MiniGPTError("the char tokenizer needs the corpus text to build its vocabulary")
        return CharTokenizer.from_text(text)
    if bpe_file is None and name in BUNDLED_BPE_FILES and BUNDLED_BPE_FILES[name].is_file():
        bpe_file = BUNDLED_BPE_FILES[name]
    if bpe_file is not None:
        return _from_bpe_file(name, bpe_file)
    encoding_spec(name)  # unknown names fail here, before any network attempt
    return TiktokenTokenizer.from_encoding(_get_encoding(name))


def tokenizer_from_dict(d: dict[str, Any]) -> Tokenizer:
    """Inverse of `Tokenizer.to_dict()`, with no network and no file."""
    kind = d.get("type")
    if kind == "char":
        return CharTokenizer(d["chars"])
    if kind == "tiktoken":
        ranks_text, source = d["ranks"], f"tokenizer {d.get('name')!r}"
        digest = hashlib.sha256(ranks_text.encode()).hexdigest()
        if d.get("ranks_sha256", digest) != digest:
            raise MiniGPTError(f"{source}: embedded BPE ranks are corrupted (sha256 mismatch)")
        ranks = parse_tiktoken_ranks(ranks_text, source=source)
        tok = TiktokenTokenizer(d["name"], d["pat_str"], ranks, d["special_tokens"])
        tok.ranks_text = ranks_text  # as given: no need to rebuild it
        return tok
    raise MiniGPTError(f"unknown tokenizer type {kind!r} in saved tokenizer; expected 'char' or 'tiktoken'")
