"""Our GPT and tokenizer as one GGUF file for llama.cpp and Ollama (docs/model-and-export.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mini_gpt.errors import MiniGPTError, import_extra
from mini_gpt.files import atomic_write
from mini_gpt.interop.hf import ARCHITECTURES, NORM_EPS, OPTIONS, ROPE_BASE, find_architecture
from mini_gpt.interop.hf_tokenizer import byte_level_bpe, bytes_to_unicode
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import (
    CL100K_PAT_STR,
    GPT2_PAT_STR,
    O200K_PAT_STR,
    CharTokenizer,
    TiktokenTokenizer,
    Tokenizer,
)

OUTTYPES = ("f32", "f16", "q8_0")
# Our split regex -> the llama.cpp pre-tokenizer (src/llama-vocab.cpp) that splits text the same way.
PRE_TOKENIZERS = {GPT2_PAT_STR: "gpt-2", CL100K_PAT_STR: "llama-bpe", O200K_PAT_STR: "gpt-4o"}


def require_gguf() -> Any:
    return import_extra(
        "gguf", 'format=gguf needs the gguf package: pip install -e ".[gguf]" (or pip install gguf)'
    )


_FEATURE = {  # how each option value is named in a refusal
    "rmsnorm": "RMSNorm", "layernorm": "LayerNorm", "learned": "learned position embeddings",
    "rope": "rotary positions", "swiglu": "a SwiGLU MLP", "gelu": "a GELU MLP", "gelu_exact": "a GELU MLP",
}  # fmt: skip


def gguf_architecture(config: GPTConfig) -> str:
    if (name := find_architecture(config)) is not None:
        return ARCHITECTURES[name].llama_cpp
    features = " + ".join(_FEATURE[getattr(config, k)] for k in OPTIONS)
    raise MiniGPTError(
        f"llama.cpp has no architecture with {features} (model.norm={config.norm} "
        f"model.pos_embedding={config.pos_embedding} model.mlp={config.mlp}): its GPT-2 needs LayerNorm + "
        "learned positions + GELU, GPT-NeoX LayerNorm + rope + GELU, Llama RMSNorm + rope + SwiGLU; "
        "export this model with format=safetensors or format=hf instead"
    )


@dataclass
class GGUFVocab:
    tokens: list[str]
    types: list[int]  # gguf.TokenType values
    merges: list[str]
    pre: str
    eos_id: int | None


def gguf_vocab(tokenizer: Tokenizer, n_vocab: int) -> GGUFVocab:
    """Our tokenizer as llama.cpp's `gpt2` (byte-level BPE) vocabulary of `n_vocab` entries; the model's
    padded rows beyond the tokenizer, and gaps in the ranks, are unused tokens."""
    types = require_gguf().TokenType
    if isinstance(tokenizer, TiktokenTokenizer):
        if (pre := PRE_TOKENIZERS.get(tokenizer.pat_str)) is None:
            raise MiniGPTError(
                f"tokenizer {tokenizer.name!r} splits text with a regex llama.cpp has no pre-tokenizer for "
                f"({tokenizer.pat_str[:60]!r}...); llama.cpp knows those of GPT-2, cl100k_base and "
                "o200k_base: train the tokenizer with one of them, or export with format=safetensors"
            )
        vocab, pairs = byte_level_bpe(tokenizer)
        merges, special = [f"{a} {b}" for a, b in pairs], tokenizer.special_tokens
    elif isinstance(tokenizer, CharTokenizer):
        # A multi-byte character is rebuilt by merging its bytes left to right; merges never cross characters.
        char, pre, vocab, special, rebuild = bytes_to_unicode(), "gpt-2", {}, {}, {}
        for i, c in enumerate(tokenizer.chars):
            pieces = [char[b] for b in c.encode()]
            vocab["".join(pieces)] = i
            rebuild.update(dict.fromkeys(f"{''.join(pieces[:k])} {pieces[k]}" for k in range(1, len(pieces))))
        # llama.cpp refuses a BPE without merges: one that never applies (0xC0, 0xC1 occur in no UTF-8)
        merges = list(rebuild) or [f"{char[0xC0]} {char[0xC1]}"]
    else:
        raise MiniGPTError(
            f"format=gguf cannot hold a {type(tokenizer).__name__}; export with format=safetensors"
        )
    by_id = {i: (t, types.CONTROL) for t, i in special.items()}
    by_id.update({i: (t, types.NORMAL) for t, i in vocab.items()})
    entries = [by_id.get(i, (f"[PAD{i}]", types.UNUSED)) for i in range(n_vocab)]
    return GGUFVocab([t for t, _ in entries], [int(k) for _, k in entries], merges, pre, tokenizer.eot_id)


def _pairs_permuted(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """q or k rows from our rotate-half RoPE layout to llama.cpp Llama's adjacent-pair layout."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# our module in block i -> llama.cpp's in blk.i; llama splits the fused q/k/v and [gate; up] MLP input
_LAYER = {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.c_proj": "attn_output", "mlp.c_proj": "ffn_down"}
_FUSED = {"attn.c_attn": "attn_qkv", "mlp.c_fc": "ffn_up"}
_SPLIT = {"attn.c_attn": ("attn_q", "attn_k", "attn_v"), "mlp.c_fc": ("ffn_gate", "ffn_up")}


def _tensors(model: GPT, arch: str) -> dict[str, torch.Tensor]:
    """GGUF tensor name -> weight (numpy's (out, in) is GGUF's {in, out}); gpt2 and gptneox require every bias
    (zeros where the model has none), Llama's are optional."""
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
    for i in range(model.config.n_layer):
        p, g = f"transformer.h.{i}.", f"blk.{i}."
        for ours, theirs in (_LAYER if arch == "llama" else {**_LAYER, **_FUSED}).items():
            add(g + theirs, p + ours)
        for kind in ("weight", "bias") if arch == "llama" else ():
            for ours, names in _SPLIT.items() if f"{p}attn.c_attn.{kind}" in sd else ():
                for name, t in zip(names, sd[f"{p}{ours}.{kind}"].chunk(len(names))):
                    rope = name in ("attn_q", "attn_k")
                    out[f"{g}{name}.{kind}"] = _pairs_permuted(t, model.config.n_head) if rope else t
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
    (writer.add_layer_norm_rms_eps if arch == "llama" else writer.add_layer_norm_eps)(NORM_EPS)
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
    gguf = require_gguf()
    arch = gguf_architecture(model.config)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise MiniGPTError(
            f"tokenizer has {tokenizer.vocab_size} tokens but the model only {model.config.vocab_size}"
        )
    vocab = gguf_vocab(tokenizer, model.config.vocab_size)
    path = Path(path).expanduser().resolve()
    with atomic_write(path, "wb") as fh:  # renamed into place once complete; gguf writes it by its name
        writer = gguf.GGUFWriter(fh.name, arch)
        _add_metadata(writer, gguf, model, arch, vocab, outtype)
        for name, t in _tensors(model, arch).items():
            _add_tensor(writer, gguf, name, t, outtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return path


def modelfile_text(model: GPT, tokenizer: Tokenizer, gguf_name: str) -> str:
    lines = [
        "# ollama create NAME -f THIS_FILE, then: ollama run NAME 'Once upon a time'",
        f"FROM ./{gguf_name}",
        'TEMPLATE """{{ .Prompt }}"""',
        f"PARAMETER num_ctx {model.config.block_size}",
    ]
    if "<|endoftext|>" in getattr(tokenizer, "special_tokens", {}):  # BPE; a char vocabulary stops at EOS
        lines.append('PARAMETER stop "<|endoftext|>"')
    return "\n".join(lines) + "\n"
