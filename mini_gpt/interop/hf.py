"""Our GPT as a `transformers` model and back (the same function, other storage), and `format=hf`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mini_gpt.conf import checked_config
from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.hf_tokenizer import require_transformers, save_hf_tokenizer
from mini_gpt.model.gpt import GPT, MLP, GPTConfig
from mini_gpt.tokenizer import Tokenizer

ROPE_BASE = 10000.0  # mini_gpt.model.rope.rotary_tables' default
NORM_EPS = 1e-5  # mini_gpt.model.gpt.make_norm
HF_ACTIVATION = {"gelu": "gelu_new", "gelu_exact": "gelu"}  # our mlp -> transformers' activation
MLP_OF_ACTIVATION = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact"}  # and back
OPTIONS = ("norm", "pos_embedding", "mlp")
HUB_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # the published GPT-2 family on the hub


@dataclass(frozen=True)
class Architecture:
    """Our module names -> theirs outside the blocks (`top`) and in block i (`layer`, under `layer_prefix`); a
    tuple: our one matrix is several of theirs, stacked along the output rows."""

    label: str
    llama_cpp: str  # llama.cpp's name for the same architecture (gguf_export)
    options: dict[str, tuple[str, ...]]  # the values of each option this architecture can hold
    top: dict[str, str]
    layer_prefix: str
    layer: dict[str, str | tuple[str, ...]]
    transposed: tuple[str, ...] = ()  # modules stored as Conv1D (in, out): GPT-2
    per_head_qkv: bool = False  # c_attn rows grouped per head, [q0 k0 v0 | q1 k1 v1 | ...]: GPT-NeoX


_BLOCK = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
ARCHITECTURES: dict[str, Architecture] = {  # keyed by transformers' model_type
    "gpt2": Architecture(
        label="GPT-2", llama_cpp="gpt2",
        options=dict(norm=("layernorm",), pos_embedding=("learned",), mlp=("gelu", "gelu_exact")),
        top={name: name for name in ("transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head")},
        layer_prefix="transformer.h.{i}.",
        layer={name: name for name in _BLOCK},
        transposed=("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
    ),
    "gpt_neox": Architecture(
        label="GPT-NeoX", llama_cpp="gptneox",
        options=dict(norm=("layernorm",), pos_embedding=("rope",), mlp=("gelu", "gelu_exact")),
        top={
            "transformer.wte": "gpt_neox.embed_in", "transformer.ln_f": "gpt_neox.final_layer_norm",
            "lm_head": "lm_head",
        },
        layer_prefix="gpt_neox.layers.{i}.",
        layer={
            "ln_1": "input_layernorm", "attn.c_attn": "attention.query_key_value",
            "attn.c_proj": "attention.dense", "ln_2": "post_attention_layernorm",
            "mlp.c_fc": "mlp.dense_h_to_4h", "mlp.c_proj": "mlp.dense_4h_to_h",
        },
        per_head_qkv=True,
    ),
    "llama": Architecture(
        label="Llama", llama_cpp="llama",
        options=dict(norm=("rmsnorm",), pos_embedding=("rope",), mlp=("swiglu",)),
        top={"transformer.wte": "model.embed_tokens", "transformer.ln_f": "model.norm", "lm_head": "lm_head"},
        layer_prefix="model.layers.{i}.",
        layer={
            "ln_1": "input_layernorm",
            "attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "attn.c_proj": "self_attn.o_proj", "ln_2": "post_attention_layernorm",
            "mlp.c_fc": ("mlp.gate_proj", "mlp.up_proj"),  # our c_fc output is [gate; up]
            "mlp.c_proj": "mlp.down_proj",
        },
    ),
}  # fmt: skip


def find_architecture(config: GPTConfig) -> str | None:
    for name, arch in ARCHITECTURES.items():
        if all(getattr(config, k) in v for k, v in arch.options.items()):
            return name
    return None


def hf_architecture(config: GPTConfig) -> str:
    if (name := find_architecture(config)) is not None:
        return name
    changes = {
        arch.label: {k: v[0] for k, v in arch.options.items() if getattr(config, k) not in v}
        for arch in ARCHITECTURES.values()
    }
    fewest = min(len(c) for c in changes.values())
    fixes = " or ".join(
        " ".join(f"model.{k}={v}" for k, v in c.items()) + f" ({label})"
        for label, c in changes.items() if len(c) == fewest
    )  # fmt: skip
    described = ", ".join(f"{k}={getattr(config, k)}" for k in OPTIONS)
    raise MiniGPTError(
        f"no transformers architecture has {described}: train with {fixes} to export format=hf, "
        "or export this model with format=safetensors (mini-gpt's own format; generate reads it)"
    )


def interleaved_qkv_to_fused(param: Tensor, n_head: int, inverse: bool = False) -> Tensor:
    """Rows per head [q_0 k_0 v_0 | q_1 ...] (GPT-NeoX) -> per role [q; k; v] (ours); `inverse`: back."""
    grouped = (3, n_head, -1) if inverse else (n_head, 3, -1)  # ({q,k,v}, nh, hs) or (nh, {q,k,v}, hs)
    return param.reshape(*grouped, *param.shape[1:]).transpose(0, 1).reshape(param.shape)


def _module_pairs(arch: Architecture, n_layer: int) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    for ours, theirs in arch.top.items():
        yield ours, ours, (theirs,)
    for i in range(n_layer):
        prefix = arch.layer_prefix.format(i=i)
        for ours, theirs in arch.layer.items():
            names = theirs if isinstance(theirs, tuple) else (theirs,)
            yield f"transformer.h.{i}.{ours}", ours, tuple(prefix + t for t in names)


def _convert(
    arch: Architecture, weights: dict[str, Tensor], config: GPTConfig, to_hf: bool
) -> dict[str, Tensor]:
    """Our state dict under `arch`'s names and layouts (`to_hf`), or theirs under ours; absent stays so."""
    out = {}
    for module, local, names in _module_pairs(arch, config.n_layer):
        for kind in ("weight", "bias"):
            ours, theirs = f"{module}.{kind}", [f"{n}.{kind}" for n in names]
            if not (ours in weights if to_hf else all(k in weights for k in theirs)):
                continue
            t = weights[ours] if to_hf else torch.cat([weights[k] for k in theirs], dim=0)
            if kind == "weight" and local in arch.transposed:
                t = t.t()
            if arch.per_head_qkv and local == "attn.c_attn":
                t = interleaved_qkv_to_fused(t, config.n_head, inverse=to_hf)
            if to_hf:
                out.update(zip(theirs, t.chunk(len(theirs), dim=0), strict=True))
            else:
                out[ours] = t
    return out


def _copy_into(target: dict[str, Tensor], source: dict[str, Tensor], where: str) -> list[str]:
    """Copy `source` into the same-named (state dict) tensors of `target`; return target keys not given."""
    for name, tensor in target.items():
        if (src := source.get(name)) is None:
            continue
        if src.shape != tensor.shape:
            raise MiniGPTError(
                f"shape mismatch for {name}: {where} {tuple(tensor.shape)}, got {tuple(src.shape)}"
            )
        tensor.copy_(src)
    return [name for name in target if name not in source]


def _hf_config(model_type: str, c: GPTConfig) -> Any:
    shape = dict(
        vocab_size=c.vocab_size, tie_word_embeddings=c.tie_weights, max_position_embeddings=c.block_size,
        hidden_size=c.n_embd, num_hidden_layers=c.n_layer, num_attention_heads=c.n_head,
    )  # fmt: skip
    if model_type == "gpt2":  # these names reach GPT-2's n_positions, n_embd, ... (GPT2Config.attribute_map)
        extra = dict(
            activation_function=HF_ACTIVATION[c.mlp], layer_norm_epsilon=NORM_EPS,
            resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.dropout,
        )  # fmt: skip
    elif model_type == "gpt_neox":
        extra = dict(
            intermediate_size=4 * c.n_embd, hidden_act=HF_ACTIVATION[c.mlp], layer_norm_eps=NORM_EPS,
            rotary_pct=1.0, rotary_emb_base=ROPE_BASE, use_parallel_residual=False, attention_bias=c.bias,
            hidden_dropout=c.dropout, attention_dropout=c.dropout,
        )  # fmt: skip
    else:
        extra = dict(
            num_key_value_heads=c.n_head, intermediate_size=MLP(c).c_proj.in_features, hidden_act="silu",
            rms_norm_eps=NORM_EPS, rope_theta=ROPE_BASE, attention_bias=c.bias, mlp_bias=c.bias,
            attention_dropout=c.dropout,
        )  # fmt: skip
    return require_transformers().AutoConfig.for_model(model_type, **shape, **extra)


def to_hf(model: GPT) -> Any:
    name = hf_architecture(model.config)
    arch = ARCHITECTURES[name]
    hf_model = require_transformers().AutoModelForCausalLM.from_config(_hf_config(name, model.config))
    weights = _convert(arch, model.state_dict(), model.config, to_hf=True)
    for key in _copy_into(hf_model.state_dict(), weights, arch.label):  # the tables give every weight:
        hf_model.state_dict()[key].zero_()  # what is left is a bias of a bias=false model, zero
    return hf_model.eval()


def gpt_to_hf(model: GPT) -> Any:
    options = ARCHITECTURES["gpt2"].options
    if fix := " ".join(f"model.{k}={v[0]}" for k, v in options.items() if getattr(model.config, k) not in v):
        raise MiniGPTError(f"this model cannot be expressed as GPT-2; that needs {fix}")
    return to_hf(model)


def _load_hf_model(source: Any) -> Any:
    transformers = require_transformers()
    if isinstance(source, transformers.PreTrainedModel):
        return source
    transformers.logging.disable_progress_bar()  # "Loading weights" bars would bury our one-line errors
    local = Path(str(source)).expanduser()
    try:
        if local.exists():
            return transformers.AutoModelForCausalLM.from_pretrained(str(local), local_files_only=True)
        return transformers.GPT2LMHeadModel.from_pretrained(str(source))
    except (OSError, ValueError) as err:
        raise MiniGPTError(
            f"could not load GPT-2 weights from {str(source)!r} ({err.__class__.__name__}); without network, "
            "download the model once elsewhere (save_pretrained) and pass its local directory"
        ) from None


def check_hub_available(name: str) -> None:
    """Fail in a second, not after ~30 s of retries, when a hub model is neither cached nor reachable."""
    require_transformers()  # and huggingface_hub with it
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    # Here, not at the top: `mini_gpt.data` brings the data pipeline, and only this check needs it.
    from mini_gpt.data.sources import hub_offline_reason

    if (reason := hub_offline_reason(("HF_HUB_OFFLINE",))) is None:
        return
    raise MiniGPTError(
        f"init_from={name}: the weights are not cached and {reason}; download them where there is "
        "network (GPT2LMHeadModel.from_pretrained(name).save_pretrained(DIR)) and pass init_from=DIR"
    )


def config_from_hf(hf_config: Any) -> GPTConfig:
    """Our GPTConfig for a GPT-2, GPT-NeoX or Llama config (GPT-2's answer to hidden_size etc. too)."""
    kind = hf_config.model_type
    if kind not in ARCHITECTURES:
        raise MiniGPTError(f"model_type={kind!r} is not one mini-gpt reads (GPT-2, GPT-NeoX, Llama)")
    arch, gpt2 = ARCHITECTURES[kind], kind == "gpt2"
    act_key = "activation_function" if gpt2 else "hidden_act"
    eps_key = {"gpt2": "layer_norm_epsilon", "gpt_neox": "layer_norm_eps", "llama": "rms_norm_eps"}[kind]
    act, eps = getattr(hf_config, act_key), getattr(hf_config, eps_key)
    shape = dict(
        vocab_size=hf_config.vocab_size, block_size=hf_config.max_position_embeddings,
        n_layer=hf_config.num_hidden_layers, n_head=hf_config.num_attention_heads,
        n_embd=hf_config.hidden_size, bias=gpt2 or bool(hf_config.attention_bias),
        tie_weights=bool(getattr(hf_config, "tie_word_embeddings", True)),
        norm=arch.options["norm"][0], pos_embedding=arch.options["pos_embedding"][0],
        mlp="swiglu" if kind == "llama" else MLP_OF_ACTIVATION.get(act, "gelu"),
    )  # fmt: skip
    config = checked_config(GPTConfig, shape, f"{arch.label} config")
    checks = [
        (act in (("silu",) if kind == "llama" else MLP_OF_ACTIVATION), f"{act_key}={act!r}"),
        (abs(eps - NORM_EPS) < 1e-12, f"{eps_key}={eps}"),
    ]
    if not gpt2:
        rope = dict(getattr(hf_config, "rope_parameters", None) or {})
        # transformers 4.x keeps these as plain attributes (rotary_pct and rotary_emb_base for GPT-NeoX).
        for key, attr in (("rope_theta", "rope_theta"), ("rope_theta", "rotary_emb_base"),
                          ("partial_rotary_factor", "rotary_pct")):  # fmt: skip
            if key not in rope and getattr(hf_config, attr, None) is not None:
                rope[key] = getattr(hf_config, attr)
        hidden, inter = MLP(config).c_proj.in_features, hf_config.intermediate_size
        checks += [
            (rope.get("rope_type", "default") == "default", f"rope_type={rope.get('rope_type')!r}"),
            (float(rope.get("rope_theta", ROPE_BASE)) == ROPE_BASE, f"rope_theta={rope.get('rope_theta')}"),
            (float(rope.get("partial_rotary_factor", 1.0)) == 1.0, "partial rotary positions"),
            (inter == hidden, f"intermediate_size={inter} (not {hidden})"),
        ]
    if kind == "gpt_neox":
        checks.append((not hf_config.use_parallel_residual, "use_parallel_residual=True"))
    if kind == "llama":
        head_dim = getattr(hf_config, "head_dim", None) or config.head_size
        checks += [
            (hf_config.num_key_value_heads == config.n_head, "grouped-query attention"),
            (bool(hf_config.mlp_bias) == config.bias, "attention_bias != mlp_bias"),
            (head_dim == config.head_size, f"head_dim={head_dim}"),
        ]
    for ok, what in checks:
        if not ok:
            raise MiniGPTError(f"{arch.label} model with {what} has no mini-gpt counterpart")
    return config


def gpt_from_hf(source: Any) -> GPT:
    """Our GPT from a `transformers` model, a local directory, or a GPT-2 hub name."""
    hf_model = _load_hf_model(source)
    config = config_from_hf(hf_model.config)
    arch = ARCHITECTURES[hf_model.config.model_type]
    theirs = hf_model.state_dict()
    model = GPT(config)
    if missing := _copy_into(model.state_dict(), _convert(arch, theirs, config, to_hf=False), "ours"):
        raise MiniGPTError(f"{arch.label} checkpoint has no weight for {missing[0]!r}")
    used = set(_convert(arch, model.state_dict(), config, to_hf=True))
    for key, tensor in theirs.items():  # with bias=false, their biases must be zero to be dropped
        if key not in used and tensor.dtype.is_floating_point and bool(tensor.any()):
            raise MiniGPTError(f"{arch.label} weight {key} has no place in a mini-gpt model (bias=false)")
    return model


def write_hf(model: GPT, tokenizer: Tokenizer, directory: Path) -> None:
    transformers = require_transformers()
    # save_pretrained draws a progress bar, and configs warn about default ids we replace below.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    hf_model = to_hf(model)
    # transformers' configs default bos/eos to ids (50256, 0, 2...) that mean nothing in our vocabulary.
    for cfg in (hf_model.config, hf_model.generation_config):
        cfg.bos_token_id = cfg.eos_token_id = tokenizer.eot_id
    hf_model.save_pretrained(str(directory), safe_serialization=True)
    save_hf_tokenizer(tokenizer, directory, model.config.block_size)
