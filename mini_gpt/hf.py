"""Move weights between our GPT and `transformers`' GPT2LMHeadModel.

Module names are the same on both sides; the only difference is that GPT-2's checkpoints store the
attention and MLP projections as `Conv1D` weights of shape (in, out), the transpose of `nn.Linear`.
`transformers` is imported lazily: it is an optional extra (`pip install "mini-gpt[hf]"`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mini_gpt.errors import MiniGPTError
from mini_gpt.model import GPT, GPTConfig

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
