"""Our GPT as one GGUF file for llama.cpp (and Ollama, LM Studio), written with the `gguf` package.

Each model shape maps onto the llama.cpp architecture that computes the same function:

    norm       pos_embedding  mlp                llama.cpp architecture
    layernorm  learned        gelu | gelu_exact  gpt2     (learned positions, LayerNorm, GELU)
    layernorm  rope           gelu | gelu_exact  gptneox  (rotate-half RoPE, LayerNorm, GELU; sequential
                                                           residual: use_parallel_residual=false)
    rmsnorm    rope           swiglu             llama    (RMSNorm, SwiGLU; its RoPE rotates adjacent pairs,
                                                           so the q/k rows are permuted as llama.cpp's own
                                                           converter does)

llama.cpp has only the tanh form of GELU (and computes it through a float16 table), so `gelu_exact`
(nanoGPT's erf GELU) runs there as the tanh curve: the same to within 1e-3, measured in
docs/model-and-export.md. Any other combination is refused, naming the feature llama.cpp lacks.

The tokenizer goes into the file too: a `TiktokenTokenizer` as llama.cpp's byte-level BPE (`gpt2` model:
tokens, merges recovered from the ranks, and the name of llama.cpp's pre-tokenizer with the same regex);
a `CharTokenizer` as the same BPE whose merges only rebuild each multi-byte character, which splits text
into exactly our characters.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import (
    CL100K_PAT_STR,
    GPT2_PAT_STR,
    O200K_PAT_STR,
    CharTokenizer,
    TiktokenTokenizer,
    Tokenizer,
)
from mini_gpt.tokenizer.bpe import merge_parts

__all__ = [
    "GGUF_ARCHITECTURES",
    "OUTTYPES",
    "PRE_TOKENIZERS",
    "bytes_to_unicode",
    "gguf_architecture",
    "gguf_vocab",
    "modelfile_text",
    "require_gguf",
    "write_gguf",
]

OUTTYPES = ("f32", "f16", "q8_0")
NORM_EPS = 1e-5  # mini_gpt.model.gpt.make_norm
ROPE_BASE = 10000.0  # mini_gpt.model.rope.rotary_tables' default

# A tokenizer's pre-tokenisation regex -> the llama.cpp pre-tokenizer (`tokenizer.ggml.pre`) that splits
# text the same way (llama.cpp src/llama-vocab.cpp; tests/integration/test_gguf.py checks each one).
PRE_TOKENIZERS = {
    GPT2_PAT_STR: "gpt-2",
    CL100K_PAT_STR: "llama-bpe",  # Llama 3's regex is cl100k_base's
    O200K_PAT_STR: "gpt-4o",
}


@dataclass(frozen=True)
class GGUFArchitecture:
    name: str  # llama.cpp's
    options: dict[str, tuple[str, ...]]  # the values of our config options it can hold


GGUF_ARCHITECTURES = (
    GGUFArchitecture(
        "gpt2", dict(norm=("layernorm",), pos_embedding=("learned",), mlp=("gelu", "gelu_exact"))
    ),
    GGUFArchitecture(
        "gptneox", dict(norm=("layernorm",), pos_embedding=("rope",), mlp=("gelu", "gelu_exact"))
    ),
    GGUFArchitecture("llama", dict(norm=("rmsnorm",), pos_embedding=("rope",), mlp=("swiglu",))),
)
_FEATURE = {  # how each option value is named in a refusal
    ("norm", "rmsnorm"): "RMSNorm",
    ("norm", "layernorm"): "LayerNorm",
    ("pos_embedding", "learned"): "learned position embeddings",
    ("pos_embedding", "rope"): "rotary positions",
    ("mlp", "swiglu"): "a SwiGLU MLP",
    ("mlp", "gelu"): "a GELU MLP",
    ("mlp", "gelu_exact"): "a GELU MLP",
}


def require_gguf() -> Any:
    """The `gguf` module, or a one-line MiniGPTError saying how to install it."""
    try:
        import gguf
    except ImportError as err:
        raise MiniGPTError(
            'format=gguf needs the gguf package: pip install -e ".[gguf]" (or pip install gguf)'
        ) from err
    return gguf


def gguf_architecture(config: GPTConfig) -> str:
    """llama.cpp's name for the architecture computing this model, or a MiniGPTError naming the feature
    llama.cpp has no counterpart for."""
    ours = {k: getattr(config, k) for k in ("norm", "pos_embedding", "mlp")}
    for arch in GGUF_ARCHITECTURES:
        if all(ours[k] in allowed for k, allowed in arch.options.items()):
            return arch.name
    features = " + ".join(_FEATURE[k, v] for k, v in ours.items())
    raise MiniGPTError(
        f"llama.cpp has no architecture with {features} (model.norm={ours['norm']} "
        f"model.pos_embedding={ours['pos_embedding']} model.mlp={ours['mlp']}): its GPT-2 needs LayerNorm + "
        "learned positions + GELU, GPT-NeoX LayerNorm + rope + GELU, Llama RMSNorm + rope + SwiGLU; "
        "export this model with format=safetensors or format=hf instead"
    )


# ---- tokenizer ---------------------------------------------------------------------------------------
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map: the alphabet of byte-level BPE vocabularies
    (printable Latin-1 bytes stand for themselves, the others are shifted to code points from 256)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table, shift = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


@dataclass
class GGUFVocab:
    tokens: list[str]
    types: list[int]  # gguf.TokenType values
    merges: list[str]
    pre: str
    eos_id: int | None


def _bpe_vocab(tokenizer: TiktokenTokenizer, n_vocab: int, types: Any) -> GGUFVocab:
    pre = PRE_TOKENIZERS.get(tokenizer.pat_str)
    if pre is None:
        raise MiniGPTError(
            f"tokenizer {tokenizer.name!r} splits text with a regex llama.cpp has no pre-tokenizer for "
            f"({tokenizer.pat_str[:60]!r}...); llama.cpp knows those of GPT-2, cl100k_base and o200k_base: "
            "train the tokenizer with one of them, or export with format=safetensors"
        )
    char = bytes_to_unicode()
    text = {i: "".join(char[b] for b in tok) for tok, i in tokenizer.ranks.items()}
    merges = []
    for tok in sorted(tokenizer.ranks, key=tokenizer.ranks.__getitem__):
        if len(tok) < 2:
            continue
        pair = merge_parts(tok, tokenizer.ranks)
        if pair is None:
            raise MiniGPTError(
                f"tokenizer {tokenizer.name!r}: token {tok!r} is not one BPE merge of earlier tokens, so "
                "llama.cpp cannot rebuild it; export with format=safetensors"
            )
        merges.append(" ".join("".join(char[b] for b in part) for part in pair))
    special = {i: t for t, i in tokenizer.special_tokens.items()}
    tokens, kinds = [], []
    for i in range(n_vocab):
        if i in text:
            tokens.append(text[i])
            kinds.append(types.NORMAL)
        elif i in special:
            tokens.append(special[i])
            kinds.append(types.CONTROL)
        else:  # a gap in the ranks, or the model's padded rows beyond the tokenizer
            tokens.append(f"[PAD{i}]")
            kinds.append(types.UNUSED)
    return GGUFVocab(tokens, [int(k) for k in kinds], merges, pre, tokenizer.eot_id)


def _char_vocab(tokenizer: CharTokenizer, n_vocab: int, types: Any) -> GGUFVocab:
    """Characters as byte-level BPE tokens; a character of several UTF-8 bytes is rebuilt by merging its
    bytes left to right. Merges never cross characters, so any pre-tokenizer gives our splits."""
    char = bytes_to_unicode()
    tokens = ["".join(char[b] for b in c.encode()) for c in tokenizer.chars]
    merges = []
    for c in tokenizer.chars:
        pieces = [char[b] for b in c.encode()]
        for k in range(1, len(pieces)):
            merge = f"{''.join(pieces[:k])} {pieces[k]}"
            if merge not in merges:
                merges.append(merge)
    if not merges:  # llama.cpp refuses a BPE vocabulary without merges: one that never applies, as the
        merges = [f"{char[0xC0]} {char[0xC1]}"]  # bytes 0xC0 and 0xC1 occur in no UTF-8 text
    tokens += [f"[PAD{i}]" for i in range(len(tokens), n_vocab)]
    kinds = [types.NORMAL] * tokenizer.vocab_size + [types.UNUSED] * (n_vocab - tokenizer.vocab_size)
    return GGUFVocab(tokens, [int(k) for k in kinds], merges, "gpt-2", tokenizer.eot_id)


def gguf_vocab(tokenizer: Tokenizer, n_vocab: int) -> GGUFVocab:
    """Our tokenizer as llama.cpp's `gpt2` (byte-level BPE) vocabulary of `n_vocab` entries."""
    types = require_gguf().TokenType
    if isinstance(tokenizer, TiktokenTokenizer):
        return _bpe_vocab(tokenizer, n_vocab, types)
    if isinstance(tokenizer, CharTokenizer):
        return _char_vocab(tokenizer, n_vocab, types)
    raise MiniGPTError(
        f"format=gguf cannot hold a {type(tokenizer).__name__}; export with format=safetensors"
    )


# ---- weights -----------------------------------------------------------------------------------------
def _pairs_permuted(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """q or k rows from our rotate-half RoPE layout to llama.cpp Llama's adjacent-pair layout."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# our module in block i -> llama.cpp's tensor in blk.i; gpt2 and gptneox keep our fused q/k/v and MLP input
_LAYER = {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.c_proj": "attn_output", "mlp.c_proj": "ffn_down"}
_FUSED = {"attn.c_attn": "attn_qkv", "mlp.c_fc": "ffn_up"}


def _llama_split(sd: dict[str, torch.Tensor], p: str, g: str, n_head: int) -> dict[str, torch.Tensor]:
    """Llama's separate q, k, v and gate, up matrices (and biases) from our fused ones of block `p`."""
    out = {}
    for kind in ("weight", "bias"):
        if f"{p}attn.c_attn.{kind}" not in sd:
            continue
        q, k, v = sd[f"{p}attn.c_attn.{kind}"].chunk(3, dim=0)
        out[f"{g}attn_q.{kind}"] = _pairs_permuted(q, n_head)
        out[f"{g}attn_k.{kind}"] = _pairs_permuted(k, n_head)
        out[f"{g}attn_v.{kind}"] = v
        gate, up = sd[f"{p}mlp.c_fc.{kind}"].chunk(2, dim=0)  # our c_fc output is [gate; up]
        out[f"{g}ffn_gate.{kind}"], out[f"{g}ffn_up.{kind}"] = gate, up
    return out


def _tensors(model: GPT, arch: str) -> dict[str, torch.Tensor]:
    """GGUF tensor name -> weight (numpy's row-major (out, in) is GGUF's {in, out}: no transposes). gpt2 and
    gptneox require every bias: zeros where the model has none; Llama's are optional."""
    c = model.config
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}

    def add(theirs: str, ours: str) -> None:
        w = sd[ours + ".weight"]
        out[theirs + ".weight"] = w
        if arch != "llama" or ours + ".bias" in sd:
            out[theirs + ".bias"] = sd.get(ours + ".bias", torch.zeros(w.shape[0]))

    out: dict[str, torch.Tensor] = {"token_embd.weight": sd["transformer.wte.weight"]}
    add("output_norm", "transformer.ln_f")
    if arch == "gpt2":
        out["position_embd.weight"] = sd["transformer.wpe.weight"]
    out["output.weight"] = sd["lm_head.weight"]  # also when tied: gptneox requires it
    for i in range(c.n_layer):
        p, g = f"transformer.h.{i}.", f"blk.{i}."
        for ours, theirs in (_LAYER if arch == "llama" else {**_LAYER, **_FUSED}).items():
            add(g + theirs, p + ours)
        if arch == "llama":
            out.update(_llama_split(sd, p, g, c.n_head))
    return out


def _add_tensor(writer: Any, gguf: Any, name: str, t: torch.Tensor, outtype: str) -> None:
    """Matrices in `outtype` (q8_0 where rows are whole 32-value blocks, else f16); vectors stay f32."""
    data = t.contiguous().numpy().astype(np.float32)
    if data.ndim == 1 or outtype == "f32":
        writer.add_tensor(name, data)
    elif outtype == "q8_0" and data.shape[-1] % 32 == 0:
        q8 = gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)
    else:
        writer.add_tensor(name, data.astype(np.float16))


def _add_metadata(writer: Any, gguf: Any, model: GPT, arch: str, vocab: GGUFVocab, outtype: str) -> None:
    c = model.config
    writer.add_name("mini-gpt")
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}
    writer.add_file_type(file_type.get(outtype, gguf.LlamaFileType.MOSTLY_Q8_0))
    writer.add_context_length(c.block_size)
    writer.add_embedding_length(c.n_embd)
    writer.add_block_count(c.n_layer)
    writer.add_feed_forward_length(model.transformer.h[0].mlp.c_proj.in_features)
    writer.add_head_count(c.n_head)
    writer.add_head_count_kv(c.n_head)
    writer.add_vocab_size(c.vocab_size)
    if arch == "llama":
        writer.add_layer_norm_rms_eps(NORM_EPS)
    else:
        writer.add_layer_norm_eps(NORM_EPS)
    if c.pos_embedding == "rope":
        writer.add_rope_dimension_count(c.head_size)
        writer.add_rope_freq_base(ROPE_BASE)
    if arch == "gptneox":
        writer.add_parallel_residual(False)  # ours adds attention, then the MLP of the sum
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    if vocab.eos_id is not None:
        writer.add_bos_token_id(vocab.eos_id)  # GPT-2's convention: end-of-text starts a document too
        writer.add_eos_token_id(vocab.eos_id)
    writer.add_add_bos_token(False)  # a base model continues text as given, as `mini-gpt generate` does
    writer.add_add_eos_token(False)


def write_gguf(model: GPT, tokenizer: Tokenizer, path: str | Path, outtype: str = "f32") -> Path:
    """Write `model` + `tokenizer` as one GGUF file at `path`, atomically; return its path."""
    gguf = require_gguf()
    if outtype not in OUTTYPES:
        raise MiniGPTError(f"outtype={outtype!r} is not one of {', '.join(OUTTYPES)}")
    arch = gguf_architecture(model.config)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise MiniGPTError(
            f"tokenizer has {tokenizer.vocab_size} tokens but the model only {model.config.vocab_size}"
        )
    vocab = gguf_vocab(tokenizer, model.config.vocab_size)
    path = Path(path).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # renamed into place once complete
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        _add_metadata(writer, gguf, model, arch, vocab, outtype)
        for name, t in _tensors(model, arch).items():
            _add_tensor(writer, gguf, name, t, outtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def modelfile_text(model: GPT, tokenizer: Tokenizer, gguf_name: str) -> str:
    """An Ollama Modelfile for a base model: the prompt as given (no chat template), the context the
    model was trained for, and end-of-text as the stop token."""
    lines = [
        "# ollama create NAME -f THIS_FILE, then: ollama run NAME 'Once upon a time'",
        f"FROM ./{gguf_name}",
        'TEMPLATE """{{ .Prompt }}"""',
        f"PARAMETER num_ctx {model.config.block_size}",
    ]
    if "<|endoftext|>" in getattr(tokenizer, "special_tokens", {}):  # BPE; a char vocabulary stops at EOS
        lines.append('PARAMETER stop "<|endoftext|>"')
    return "\n".join(lines) + "\n"
