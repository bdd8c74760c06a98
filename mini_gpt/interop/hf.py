"""Our GPT as a `transformers` model and back (GPT-2, GPT-NeoX, Llama), and the `format=hf` directory.

Each combination of three options has one `transformers` counterpart:

    norm       pos_embedding  mlp                transformers class
    layernorm  learned        gelu | gelu_exact  GPT2LMHeadModel     (same module names; Conv1D transposed)
    layernorm  rope           gelu | gelu_exact  GPTNeoXForCausalLM  (sequential residual, per-head QKV)
    rmsnorm    rope           swiglu             LlamaForCausalLM    (q/k/v and gate/up as separate matrices)

The maths is the same on both sides; only the storage differs (ARCHITECTURES). A model without biases
maps onto GPT-2 / GPT-NeoX with zero biases. Entry points: `gpt_from_hf` / `to_hf`, and `write_hf` /
`load_hf_dir` for a directory `from_pretrained` loads. `transformers` is an optional extra, imported on
first use (`require_transformers`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mini_gpt.errors import MiniGPTError, build_config
from mini_gpt.interop.hf_tokenizer import (
    HF_TOKENIZER_FILE,
    load_hf_tokenizer,
    require_transformers,
    save_hf_tokenizer,
)
from mini_gpt.model.gpt import GPT, MLP, GPTConfig
from mini_gpt.tokenizer import Tokenizer, build_tokenizer

__all__ = [
    "ARCHITECTURES",
    "HUB_MODELS",
    "check_hub_available",
    "config_from_hf",
    "gpt_from_hf",
    "gpt_to_hf",
    "hf_architecture",
    "interleaved_qkv_to_fused",
    "load_hf_dir",
    "to_hf",
    "write_hf",
]

ROPE_BASE = 10000.0  # mini_gpt.model.rope.rotary_tables' default
NORM_EPS = 1e-5  # mini_gpt.model.gpt.make_norm
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")  # transformers' names for our F.gelu(approximate="tanh")
# our mlp -> transformers' activation name, and back
HF_ACTIVATION = {"gelu": "gelu_new", "gelu_exact": "gelu"}
MLP_OF_ACTIVATION = {**dict.fromkeys(TANH_GELU, "gelu"), "gelu": "gelu_exact"}
_OPTIONS = ("norm", "pos_embedding", "mlp")


@dataclass(frozen=True)
class Architecture:
    """Where each of our modules lives in one `transformers` architecture: `top` maps our module names
    outside the blocks, `layer` those inside block i (under `layer_prefix`). A tuple on the right means our
    one matrix is several of theirs, stacked along the output rows."""

    label: str
    model_class: str
    options: dict[str, tuple[str, ...]]  # the values of each option this architecture can hold
    top: dict[str, str]
    layer_prefix: str
    layer: dict[str, str | tuple[str, ...]]
    transposed: tuple[str, ...] = ()  # modules stored as Conv1D (in, out): GPT-2
    per_head_qkv: bool = False  # c_attn rows grouped per head, [q0 k0 v0 | q1 k1 v1 | ...]: GPT-NeoX


_BLOCK = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": Architecture(
        label="GPT-2",
        model_class="GPT2LMHeadModel",
        options=dict(norm=("layernorm",), pos_embedding=("learned",), mlp=("gelu", "gelu_exact")),
        top={name: name for name in ("transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head")},
        layer_prefix="transformer.h.{i}.",
        layer={name: name for name in _BLOCK},
        transposed=("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
    ),
    "gpt_neox": Architecture(
        label="GPT-NeoX",
        model_class="GPTNeoXForCausalLM",
        options=dict(norm=("layernorm",), pos_embedding=("rope",), mlp=("gelu", "gelu_exact")),
        top={
            "transformer.wte": "gpt_neox.embed_in",
            "transformer.ln_f": "gpt_neox.final_layer_norm",
            "lm_head": "lm_head",
        },
        layer_prefix="gpt_neox.layers.{i}.",
        layer={
            "ln_1": "input_layernorm",
            "attn.c_attn": "attention.query_key_value",
            "attn.c_proj": "attention.dense",
            "ln_2": "post_attention_layernorm",
            "mlp.c_fc": "mlp.dense_h_to_4h",
            "mlp.c_proj": "mlp.dense_4h_to_h",
        },
        per_head_qkv=True,
    ),
    "llama": Architecture(
        label="Llama",
        model_class="LlamaForCausalLM",
        options=dict(norm=("rmsnorm",), pos_embedding=("rope",), mlp=("swiglu",)),
        top={"transformer.wte": "model.embed_tokens", "transformer.ln_f": "model.norm", "lm_head": "lm_head"},
        layer_prefix="model.layers.{i}.",
        layer={
            "ln_1": "input_layernorm",
            "attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "attn.c_proj": "self_attn.o_proj",
            "ln_2": "post_attention_layernorm",
            "mlp.c_fc": ("mlp.gate_proj", "mlp.up_proj"),  # our c_fc output is [gate; up]
            "mlp.c_proj": "mlp.down_proj",
        },
    ),
}


def hf_architecture(config: GPTConfig) -> str:
    """The key in ARCHITECTURES that holds a model with this config, or a MiniGPTError naming the fix."""
    ours = {k: getattr(config, k) for k in _OPTIONS}
    for name, arch in ARCHITECTURES.items():
        if all(ours[k] in allowed for k, allowed in arch.options.items()):
            return name
    changes = {
        arch.label: {k: v[0] for k, v in arch.options.items() if ours[k] not in v}
        for arch in ARCHITECTURES.values()
    }
    fewest = min(len(c) for c in changes.values())
    fixes = " or ".join(
        " ".join(f"model.{k}={v}" for k, v in c.items()) + f" ({label})"
        for label, c in changes.items()
        if len(c) == fewest
    )
    described = ", ".join(f"{k}={v}" for k, v in ours.items())
    raise MiniGPTError(
        f"no transformers architecture has {described}: train with {fixes} to export format=hf, "
        "or export this model with format=safetensors (mini-gpt's own format; generate reads it)"
    )


HUB_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # the published GPT-2 family on the hub


# ---- weights ----------------------------------------------------------------------------------------
def interleaved_qkv_to_fused(param: Tensor, n_head: int) -> Tensor:
    """Reorder a per-head interleaved QKV projection into our `[q; k; v]` layout.

    GPT-NeoX, and tutorials that reshape the output of one `Linear(d_in, 3 * n_embd)` to
    (B, T, n_head, 3 * hs), group the output rows per head: [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]. GPT-2 and
    `nn.MultiheadAttention` group them per role: [q_0 q_1 ... | k_0 ... | v_0 ...]. Works on the weight
    (3C, d_in) and on the bias (3C,) alike.
    """
    three_c = param.shape[0]
    hs = three_c // (3 * n_head)
    rest = param.shape[1:]
    per_head = param.reshape(n_head, 3, hs, *rest)  # (nh, {q,k,v}, hs, ...)
    return per_head.transpose(0, 1).reshape(three_c, *rest)  # ({q,k,v}, nh, hs, ...) flattened


def _fused_to_per_head(param: Tensor, n_head: int) -> Tensor:
    """Our [q; k; v] rows -> GPT-NeoX's per-head grouping (the inverse of interleaved_qkv_to_fused)."""
    rest = param.shape[1:]
    return param.reshape(3, n_head, -1, *rest).transpose(0, 1).reshape(param.shape)


def _module_pairs(arch: Architecture, n_layer: int) -> Iterator[tuple[str, str, str | tuple[str, ...]]]:
    """(our module, our module's name inside a block or at the top, their module(s)) for every module."""
    for ours, theirs in arch.top.items():
        yield ours, ours, theirs
    for i in range(n_layer):
        prefix = arch.layer_prefix.format(i=i)
        for ours, theirs in arch.layer.items():
            full = tuple(prefix + t for t in theirs) if isinstance(theirs, tuple) else prefix + theirs
            yield f"transformer.h.{i}.{ours}", ours, full


def _to_theirs(arch: Architecture, ours: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    out = {}
    for module, local, theirs in _module_pairs(arch, config.n_layer):
        for kind in ("weight", "bias"):
            t = ours.get(f"{module}.{kind}")
            if t is None:  # no bias (bias=false), no wpe (rope)
                continue
            if isinstance(theirs, tuple):
                for name, part in zip(theirs, t.chunk(len(theirs), dim=0), strict=True):
                    out[f"{name}.{kind}"] = part
                continue
            if kind == "weight" and local in arch.transposed:
                t = t.t()
            if arch.per_head_qkv and local == "attn.c_attn":
                t = _fused_to_per_head(t, config.n_head)
            out[f"{theirs}.{kind}"] = t
    return out


def _to_ours(arch: Architecture, theirs: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    out = {}
    for module, local, names in _module_pairs(arch, config.n_layer):
        for kind in ("weight", "bias"):
            keys = [f"{n}.{kind}" for n in names] if isinstance(names, tuple) else [f"{names}.{kind}"]
            if not all(k in theirs for k in keys):
                continue
            t = torch.cat([theirs[k] for k in keys], dim=0)
            if kind == "weight" and local in arch.transposed:
                t = t.t()
            if arch.per_head_qkv and local == "attn.c_attn":
                t = interleaved_qkv_to_fused(t, config.n_head)
            out[f"{module}.{kind}"] = t
    return out


def _copy_into(target: dict[str, Tensor], source: dict[str, Tensor], where: str) -> list[str]:
    """Copy every tensor of `source` into the same-named one of `target`; return target keys not given."""
    with torch.no_grad():
        for name, tensor in target.items():
            if name not in source:
                continue
            src = source[name]
            if src.shape != tensor.shape:
                raise MiniGPTError(
                    f"shape mismatch for {name}: {where} {tuple(tensor.shape)}, got {tuple(src.shape)}"
                )
            tensor.copy_(src)
    return [name for name in target if name not in source]


# ---- our model -> transformers ----------------------------------------------------------------------
def _hf_config(arch_name: str, c: GPTConfig) -> Any:
    transformers = require_transformers()
    common = dict(vocab_size=c.vocab_size, tie_word_embeddings=c.tie_weights)
    if arch_name == "gpt2":
        return transformers.GPT2Config(
            **common, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
            activation_function=HF_ACTIVATION[c.mlp], layer_norm_epsilon=NORM_EPS,
            resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.dropout,
        )  # fmt: skip
    if arch_name == "gpt_neox":
        return transformers.GPTNeoXConfig(
            **common, hidden_size=c.n_embd, num_hidden_layers=c.n_layer, num_attention_heads=c.n_head,
            intermediate_size=4 * c.n_embd, hidden_act=HF_ACTIVATION[c.mlp], layer_norm_eps=NORM_EPS,
            max_position_embeddings=c.block_size, rotary_pct=1.0, rotary_emb_base=ROPE_BASE,
            use_parallel_residual=False, attention_bias=c.bias,
            hidden_dropout=c.dropout, attention_dropout=c.dropout,
        )  # fmt: skip
    return transformers.LlamaConfig(
        **common, hidden_size=c.n_embd, num_hidden_layers=c.n_layer, num_attention_heads=c.n_head,
        num_key_value_heads=c.n_head, intermediate_size=MLP(c).c_proj.in_features, hidden_act="silu",
        rms_norm_eps=NORM_EPS, max_position_embeddings=c.block_size, rope_theta=ROPE_BASE,
        attention_bias=c.bias, mlp_bias=c.bias, attention_dropout=c.dropout,
    )  # fmt: skip


def to_hf(model: GPT, architecture: str | None = None) -> Any:
    """Our GPT as the `transformers` model of its architecture (GPT-2, GPT-NeoX or Llama), in eval mode;
    `architecture` (a key of ARCHITECTURES) insists on one. No match: a MiniGPTError naming the fix."""
    name = hf_architecture(model.config)
    if architecture is not None and name != architecture:
        wanted = ARCHITECTURES[architecture]
        fix = " ".join(
            f"model.{k}={v[0]}" for k, v in wanted.options.items() if getattr(model.config, k) not in v
        )
        raise MiniGPTError(
            f"this model cannot be expressed as {wanted.label} (it is a {ARCHITECTURES[name].label} model); "
            f"that needs {fix}"
        )
    arch = ARCHITECTURES[name]
    transformers = require_transformers()
    hf_model = getattr(transformers, arch.model_class)(_hf_config(name, model.config))
    weights = _to_theirs(arch, model.state_dict(), model.config)
    for key in _copy_into(hf_model.state_dict(), weights, arch.label):
        if not key.endswith(".bias"):  # pragma: no cover - the tables above cover every weight
            raise MiniGPTError(f"internal: no weight for {arch.label}'s {key}")
        hf_model.state_dict()[key].zero_()  # bias=false: their bias is present and zero
    hf_model.eval()
    return hf_model


def gpt_to_hf(model: GPT) -> Any:
    """Our GPT as a GPT2LMHeadModel (GPT-2-compatible configs only; see `to_hf` for the others)."""
    return to_hf(model, "gpt2")


# ---- transformers -> our model ----------------------------------------------------------------------
def _load_hf_model(source: Any) -> Any:
    transformers = require_transformers()
    if isinstance(source, transformers.PreTrainedModel):
        return source
    transformers.logging.disable_progress_bar()  # "Loading weights" bars would bury our one-line errors
    source = str(source)
    local = Path(source).expanduser()
    try:
        if local.exists():
            config = transformers.AutoConfig.from_pretrained(str(local), local_files_only=True)
            return _model_class(transformers, config).from_pretrained(str(local), local_files_only=True)
        return transformers.GPT2LMHeadModel.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise MiniGPTError(
            f"could not load GPT-2 weights from {source!r} ({err.__class__.__name__}); without network, "
            "download the model once elsewhere (save_pretrained) and pass its local directory"
        ) from None


def _model_class(transformers: Any, config: Any) -> Any:
    arch = ARCHITECTURES.get(getattr(config, "model_type", None))  # keyed by transformers' model_type
    if arch is None:
        supported = ", ".join(a.label for a in ARCHITECTURES.values())
        raise MiniGPTError(f"model_type={config.model_type!r} is not one mini-gpt reads ({supported})")
    return getattr(transformers, arch.model_class)


def _check(label: str, checks: list[tuple[bool, str]]) -> None:
    """MiniGPTError for the first (ok, what) pair that is not ok: a setting we cannot express."""
    for ok, what in checks:
        if not ok:
            raise MiniGPTError(f"{label} model with {what} has no mini-gpt counterpart")


def _close(a: float, b: float) -> bool:
    return abs(a - b) < 1e-12


def check_hub_available(name: str) -> None:
    """Fail in a second, not after ~30 s of retries, when a hub model is neither cached nor reachable."""
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except ImportError:
        pass
    # Here, not at the top: `mini_gpt.data` brings the data pipeline, and only this check needs it.
    from mini_gpt.data.sources import hub_offline_reason

    reason = hub_offline_reason(("HF_HUB_OFFLINE",))
    if reason is None:
        return
    raise MiniGPTError(
        f"init_from={name}: the weights are not cached and {reason}; download them where there is "
        "network (GPT2LMHeadModel.from_pretrained(name).save_pretrained(DIR)) and pass init_from=DIR"
    )


def config_from_hf(hf_config: Any) -> GPTConfig:
    """Our GPTConfig for a GPT-2, GPT-NeoX or Llama config; MiniGPTError for what we cannot express."""
    model_type = getattr(hf_config, "model_type", "gpt2")
    if model_type == "gpt2":
        act, eps = hf_config.activation_function, hf_config.layer_norm_epsilon
        _check("GPT-2", [(act in MLP_OF_ACTIVATION, f"activation {act!r}")])
        _check("GPT-2", [(_close(eps, NORM_EPS), f"layer_norm_epsilon={eps}")])
        gpt2 = dict(
            vocab_size=hf_config.vocab_size,
            block_size=hf_config.n_positions,
            n_layer=hf_config.n_layer,
            n_head=hf_config.n_head,
            n_embd=hf_config.n_embd,
            bias=True,
            mlp=MLP_OF_ACTIVATION[act],
            tie_weights=bool(getattr(hf_config, "tie_word_embeddings", True)),
        )
        return build_config(GPTConfig, gpt2, "GPT-2 config")
    if model_type not in ("gpt_neox", "llama"):
        raise MiniGPTError(f"model_type={model_type!r} is not one mini-gpt reads (GPT-2, GPT-NeoX, Llama)")
    arch = ARCHITECTURES[model_type]
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    # transformers 4.x keeps these as plain attributes (rotary_pct and rotary_emb_base for GPT-NeoX).
    for key, attr in (
        ("rope_theta", "rope_theta"),
        ("rope_theta", "rotary_emb_base"),
        ("partial_rotary_factor", "rotary_pct"),
    ):
        if key not in rope and getattr(hf_config, attr, None) is not None:
            rope[key] = getattr(hf_config, attr)
    shape = dict(
        vocab_size=hf_config.vocab_size,
        block_size=hf_config.max_position_embeddings,
        n_layer=hf_config.num_hidden_layers,
        n_head=hf_config.num_attention_heads,
        n_embd=hf_config.hidden_size,
        bias=bool(hf_config.attention_bias),
        tie_weights=bool(hf_config.tie_word_embeddings),
        norm=arch.options["norm"][0],
        pos_embedding="rope",
        mlp=MLP_OF_ACTIVATION.get(hf_config.hidden_act, "gelu") if model_type == "gpt_neox" else "swiglu",
    )
    config = build_config(GPTConfig, shape, f"{arch.label} config")
    hidden = MLP(config).c_proj.in_features
    inter = hf_config.intermediate_size
    checks = [
        (rope.get("rope_type", "default") == "default", f"rope_type={rope.get('rope_type')!r}"),
        (float(rope.get("rope_theta", ROPE_BASE)) == ROPE_BASE, f"rope_theta={rope.get('rope_theta')}"),
        (inter == hidden, f"intermediate_size={inter} (not {hidden})"),
    ]
    if model_type == "gpt_neox":
        checks += [
            (not hf_config.use_parallel_residual, "use_parallel_residual=True"),
            (float(rope.get("partial_rotary_factor", 1.0)) == 1.0, "partial rotary positions"),
            (hf_config.hidden_act in MLP_OF_ACTIVATION, f"hidden_act={hf_config.hidden_act!r}"),
            (_close(hf_config.layer_norm_eps, NORM_EPS), f"layer_norm_eps={hf_config.layer_norm_eps}"),
        ]
    else:
        head_dim = getattr(hf_config, "head_dim", None) or config.head_size
        checks += [
            (hf_config.num_key_value_heads == config.n_head, "grouped-query attention"),
            (hf_config.hidden_act == "silu", f"hidden_act={hf_config.hidden_act!r}"),
            (_close(hf_config.rms_norm_eps, NORM_EPS), f"rms_norm_eps={hf_config.rms_norm_eps}"),
            (bool(hf_config.mlp_bias) == config.bias, "attention_bias != mlp_bias"),
            (head_dim == config.head_size, f"head_dim={head_dim}"),
        ]
    _check(arch.label, checks)
    return config


def gpt_from_hf(source: Any) -> GPT:
    """Our GPT from a GPT-2, GPT-NeoX or Llama `transformers` model, a local directory, or a hub name
    (GPT-2 only; needs network or the hub cache)."""
    hf_model = _load_hf_model(source)
    config = config_from_hf(hf_model.config)
    name = hf_architecture(config)
    arch = ARCHITECTURES[name]
    theirs = hf_model.state_dict()
    model = GPT(config)
    ours = model.state_dict()
    weights = _to_ours(arch, theirs, config)
    missing = _copy_into(ours, weights, "ours")
    if missing:
        raise MiniGPTError(f"{arch.label} checkpoint has no weight for {missing[0]!r}")
    used = set(_to_theirs(arch, ours, config))
    for key, tensor in theirs.items():  # with bias=false, their biases must be zero to be dropped
        if key not in used and tensor.dtype.is_floating_point and bool(tensor.any()):
            raise MiniGPTError(f"{arch.label} weight {key} has no place in a mini-gpt model (bias=false)")
    return model


# ---- directories ----------------------------------------------------------------------------------
def write_hf(model: GPT, tokenizer: Tokenizer, directory: Path) -> None:
    """Save `model` as its `transformers` architecture's directory, with its tokenizer (module docstring)."""
    transformers = require_transformers()
    # save_pretrained draws a progress bar, and configs warn about default ids we replace below.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    hf_model = to_hf(model)  # GPT-2, GPT-NeoX or Llama; MiniGPTError naming the option to change otherwise
    eot = tokenizer.eot_id
    # transformers' configs default bos/eos to ids (50256, 0, 2...) that mean nothing in our vocabulary.
    for cfg in (hf_model.config, hf_model.generation_config):
        cfg.bos_token_id = eot
        cfg.eos_token_id = eot
    hf_model.save_pretrained(str(directory), safe_serialization=True)
    save_hf_tokenizer(tokenizer, directory, model.config.block_size)


def load_hf_dir(directory: Path) -> tuple[GPT, Tokenizer]:
    """(GPT, tokenizer) from a `transformers` directory: our `format=hf` export (GPT-2, GPT-NeoX, Llama)
    or any local GPT-2 model."""
    tokenizer = _dir_tokenizer(directory)  # first: a directory without one fails before the weights load
    return gpt_from_hf(directory), tokenizer


def _dir_tokenizer(directory: Path) -> Tokenizer:
    """The directory's tokenizer; for a GPT-2 saved without one (`model.save_pretrained(DIR)` alone), the
    shipped GPT-2 BPE, once config.json shows GPT-2's vocabulary size."""
    if (directory / HF_TOKENIZER_FILE).is_file() or (directory / "vocab.json").is_file():
        return load_hf_tokenizer(directory)
    gpt2 = build_tokenizer("gpt2")
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))  # load_model read it
    if config.get("model_type") == "gpt2" and config.get("vocab_size") == gpt2.vocab_size:
        return gpt2
    raise MiniGPTError(
        f"{directory} has no tokenizer ({HF_TOKENIZER_FILE} or vocab.json) and its vocabulary is not GPT-2's "
        "(model_type gpt2, vocab_size 50257); save the tokenizer beside the weights: "
        "AutoTokenizer.from_pretrained(NAME).save_pretrained(DIR)"
    )
