"""Everything `transformers`: GPT-2 weights in and out, and GPT-2 tokenizer files in and out.

- `gpt_from_hf(source)` / `gpt_to_hf(model)`: our GPT <-> `GPT2LMHeadModel`. Module names are the same on
  both sides; GPT-2's checkpoints store the attention and MLP projections as `Conv1D` weights of shape
  (in, out), the transpose of `nn.Linear`.
- `write_hf(model, tokenizer, dir)` / `load_hf_dir(dir)`: a directory `from_pretrained` loads, with our
  tokenizer beside it (`mini_gpt_tokenizer.json`) and, for GPT-2's BPE, `vocab.json` + `merges.txt`.

`transformers` is imported lazily: it is an optional extra (`pip install "mini-gpt[hf]"`), and nothing
else in mini-gpt imports this module at start-up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mini_gpt.errors import MiniGPTError
from mini_gpt.model import GPT, GPTConfig
from mini_gpt.tokenizer import TiktokenTokenizer, Tokenizer, encoding_spec, tokenizer_from_dict

__all__ = [
    "HF_TOKENIZER_FILE",
    "config_from_hf",
    "gpt2_tokenizer_files",
    "gpt_from_hf",
    "gpt_to_hf",
    "load_hf_dir",
    "write_hf",
]

HF_TOKENIZER_FILE = "mini_gpt_tokenizer.json"  # our tokenizer, saved beside a `format=hf` export
# tiktoken encodings with GPT-2's vocabulary *and* pre-tokenisation regex, which is what
# transformers' GPT2Tokenizer implements.
GPT2_LIKE = ("gpt2", "r50k_base")

# Conv1D weights in GPT-2 checkpoints: stored (in_features, out_features).
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:
        raise MiniGPTError(
            'GPT-2 conversion needs transformers: pip install -e ".[hf]" (or pip install transformers)'
        ) from err
    return transformers


def _load_hf_model(source: Any) -> Any:
    transformers = _transformers()
    if isinstance(source, transformers.GPT2LMHeadModel):
        return source
    source = str(source)
    local = Path(source).expanduser()
    try:
        if local.exists():
            return transformers.GPT2LMHeadModel.from_pretrained(str(local), local_files_only=True)
        return transformers.GPT2LMHeadModel.from_pretrained(source)
    except OSError as err:
        raise MiniGPTError(
            f"could not load GPT-2 weights from {source!r} ({err.__class__.__name__}); without network, "
            "download the model once elsewhere (save_pretrained) and pass its local directory"
        ) from None


def config_from_hf(hf_config: Any) -> GPTConfig:
    if hf_config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise MiniGPTError(f"unsupported GPT-2 activation {hf_config.activation_function!r}")
    return GPTConfig(
        vocab_size=hf_config.vocab_size,
        block_size=hf_config.n_positions,
        n_layer=hf_config.n_layer,
        n_head=hf_config.n_head,
        n_embd=hf_config.n_embd,
        dropout=0.0,
        bias=True,
        tie_weights=bool(getattr(hf_config, "tie_word_embeddings", True)),
    )


def gpt_from_hf(source: Any) -> GPT:
    """Build our GPT from a GPT2LMHeadModel instance, a local directory, or a hub name (needs network)."""
    hf_model = _load_hf_model(source)
    hf_eps = hf_model.config.layer_norm_epsilon
    if abs(hf_eps - 1e-5) > 1e-12:
        raise MiniGPTError(f"unsupported GPT-2 layer_norm_epsilon={hf_eps} (mini-gpt uses 1e-5)")
    model = GPT(config_from_hf(hf_model.config))
    ours = model.state_dict()
    theirs = hf_model.state_dict()
    with torch.no_grad():
        for name, tensor in ours.items():
            if name not in theirs:
                raise MiniGPTError(f"GPT-2 checkpoint has no weight for {name!r}")
            src = theirs[name]
            if name.endswith(_CONV1D_SUFFIXES):
                src = src.t()
            if src.shape != tensor.shape:
                raise MiniGPTError(
                    f"shape mismatch for {name}: ours {tuple(tensor.shape)}, GPT-2 {tuple(src.shape)}"
                )
            tensor.copy_(src)
    return model


def gpt_to_hf(model: GPT) -> Any:
    """Our GPT as a GPT2LMHeadModel; only for configs GPT-2 can express."""
    c = model.config
    unsupported = {
        k: v
        for k, v in (("norm", c.norm), ("pos_embedding", c.pos_embedding), ("mlp", c.mlp), ("bias", c.bias))
        if v != {"norm": "layernorm", "pos_embedding": "learned", "mlp": "gelu", "bias": True}[k]
    }
    if unsupported:
        raise MiniGPTError(
            f"this model cannot be expressed as GPT-2 ({unsupported}); use format=safetensors instead"
        )
    transformers = _transformers()
    hf_config = transformers.GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.block_size,
        n_embd=c.n_embd,
        n_layer=c.n_layer,
        n_head=c.n_head,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.dropout,
        tie_word_embeddings=c.tie_weights,
    )
    hf_model = transformers.GPT2LMHeadModel(hf_config)
    theirs = hf_model.state_dict()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            dst = theirs[name]
            dst.copy_(tensor.t() if name.endswith(_CONV1D_SUFFIXES) else tensor)
    hf_model.eval()
    return hf_model


# ---- tokenizer files ------------------------------------------------------------------------------
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (the alphabet of vocab.json/merges.txt)."""
    _transformers()
    try:
        from transformers.convert_slow_tokenizer import bytes_to_unicode
    except ImportError:  # transformers 4.x kept it beside the GPT-2 tokenizer
        from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
    return bytes_to_unicode()


def _bpe_parts(token: bytes, ranks: dict[bytes, int], max_rank: int) -> list[bytes]:
    """Run byte-level BPE on `token` using only merges ranked below `max_rank`."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def gpt2_tokenizer_files(tokenizer: TiktokenTokenizer, model_max_length: int) -> dict[str, str]:
    """vocab.json, merges.txt and tokenizer_config.json for transformers' GPT2Tokenizer.

    tiktoken stores only ranks (token bytes -> id); the merge that creates each token is recovered by
    running BPE on the token's bytes with the merges ranked before it: it must end in exactly two parts.
    """
    to_char = _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(to_char[x] for x in b)

    ranks = tokenizer.ranks
    vocab = {text(tok): rank for tok, rank in ranks.items()}
    vocab.update(tokenizer.special_tokens)
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        parts = _bpe_parts(tok, ranks, rank)
        if len(parts) != 2:
            raise MiniGPTError(
                f"tokenizer {tokenizer.name!r}: token {tok!r} is not one BPE merge; use format=safetensors"
            )
        merges.append(f"{text(parts[0])} {text(parts[1])}")
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
        "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=1),
    }


def _gpt2_tokenizer_from_vocab(vocab_path: Path) -> Tokenizer:
    """GPT-2's byte-level BPE from a transformers `vocab.json`: token id = BPE rank (true for GPT-2)."""
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    byte_of = {ch: b for b, ch in _bytes_to_unicode().items()}
    special = {tok: i for tok, i in vocab.items() if tok.startswith("<|") and tok.endswith("|>")}
    try:
        ranks = {bytes(byte_of[c] for c in tok): i for tok, i in vocab.items() if tok not in special}
    except KeyError:
        raise MiniGPTError(f"{vocab_path} is not a byte-level GPT-2 vocabulary") from None
    return TiktokenTokenizer("gpt2", encoding_spec("gpt2")["pat_str"], ranks, special)


# ---- directories ----------------------------------------------------------------------------------
def write_hf(model: GPT, tokenizer: Tokenizer, directory: Path) -> None:
    """Save `model` as a GPT2LMHeadModel directory, with its tokenizer (see the module docstring)."""
    transformers = _transformers()
    # GPT2Config warns about its default bos/eos ids (fixed below) and save_pretrained draws a progress bar.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    hf_model = gpt_to_hf(model)  # raises MiniGPTError for configs GPT-2 cannot express
    eot = tokenizer.eot_id
    # GPT2Config defaults bos/eos to 50256, which does not exist in a character vocabulary.
    for cfg in (hf_model.config, hf_model.generation_config):
        cfg.bos_token_id = eot
        cfg.eos_token_id = eot
    hf_model.save_pretrained(str(directory), safe_serialization=True)
    (directory / HF_TOKENIZER_FILE).write_text(json.dumps(tokenizer.to_dict()), encoding="utf-8")
    if isinstance(tokenizer, TiktokenTokenizer) and tokenizer.name in GPT2_LIKE:
        for name, content in gpt2_tokenizer_files(tokenizer, model.config.block_size).items():
            (directory / name).write_text(content, encoding="utf-8")


def load_hf_dir(directory: Path) -> tuple[GPT, Tokenizer]:
    """(GPT, tokenizer) from a GPT-2 directory: our `format=hf` export or any local GPT-2 model."""
    ours = directory / HF_TOKENIZER_FILE
    if ours.is_file():
        tokenizer = tokenizer_from_dict(json.loads(ours.read_text(encoding="utf-8")))
    elif (directory / "vocab.json").is_file():
        tokenizer = _gpt2_tokenizer_from_vocab(directory / "vocab.json")
    else:
        raise MiniGPTError(f"{directory} has no tokenizer ({HF_TOKENIZER_FILE} or vocab.json)")
    return gpt_from_hf(directory), tokenizer
