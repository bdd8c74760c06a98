"""checkpoint.load_model: Lightning .ckpt in the SPEC format (written here with torch.save, no Lightning)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, preset, train_tiny_char_model, write_lightning_ckpt

from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import check_resume, load_model, require_training_state
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import CharTokenizer

# Tiny models decode faster on one thread than on two fighting over a shared machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained():
    return train_tiny_char_model()


def test_training_helper_learns(trained):
    _, _, losses = trained
    assert losses[0] > 3.8  # ~ln(65) at the start
    assert sum(losses[-10:]) / 10 < 2.95  # clearly learned character statistics (seeds 0-3: 2.73-2.90)


@pytest.mark.parametrize("prefix", ["model.", "model._orig_mod."])
def test_load_lightning_ckpt(tmp_path, trained, prefix):
    model, tokenizer, _ = trained
    path = write_lightning_ckpt(
        tmp_path / "last.ckpt", model, tokenizer, key_prefix=prefix, optimizer_states=[{"state": {}}]
    )
    loaded, tok = load_model(path)
    assert tok.to_dict() == tokenizer.to_dict()
    assert loaded.config == model.config
    assert not loaded.training
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    x = torch.tensor([tokenizer.encode("ROMEO: What")])
    assert torch.equal(loaded(x)[0], model(x)[0])
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # still tied


def test_load_rope_rmsnorm_swiglu_model(tmp_path):
    tokenizer = CharTokenizer("abcdefgh")
    model = GPT(
        GPTConfig(
            n_layer=2,
            n_head=2,
            n_embd=32,
            block_size=64,
            vocab_size=8,
            pos_embedding="rope",
            norm="rmsnorm",
            mlp="swiglu",
            tie_weights=False,
        )
    )
    loaded, _ = load_model(write_lightning_ckpt(tmp_path / "r.ckpt", model, tokenizer))
    x = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(loaded(x)[0], model.eval()(x)[0], rtol=0, atol=0)


def test_missing_checkpoint(tmp_path):
    with pytest.raises(MiniGPTError, match="does not exist") as err:
        load_model(tmp_path / "nope.ckpt")
    assert str(tmp_path / "nope.ckpt") in str(err.value)


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", "truncated"])
def test_corrupt_checkpoint(tmp_path, trained, content):
    path = tmp_path / "bad.ckpt"
    if content == "truncated":
        write_lightning_ckpt(path, trained[0], trained[1])
        path.write_bytes(path.read_bytes()[:5000])
    else:
        path.write_bytes(content)
    with pytest.raises(MiniGPTError, match="cannot read checkpoint") as err:
        load_model(path)
    assert "\n" not in str(err.value)


class NotAPrimitive:
    pass


def test_checkpoint_with_objects_is_refused(tmp_path, trained):
    # weights_only=True: a pickled object (code) is never executed or loaded.
    path = write_lightning_ckpt(
        tmp_path / "obj.ckpt", trained[0], trained[1], hyper_parameters=NotAPrimitive()
    )
    with pytest.raises(MiniGPTError, match="cannot read checkpoint"):
        load_model(path)


def test_foreign_checkpoint_and_mismatched_weights(tmp_path, trained):
    model, tokenizer, _ = trained
    path = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"model." + k: v for k, v in model.state_dict().items()}}, path)
    with pytest.raises(MiniGPTError, match="no mini_gpt metadata"):
        load_model(path)
    # Metadata that does not fit the weights (n_embd 32 saved, 64 claimed).
    write_lightning_ckpt(path, model, tokenizer)
    ckpt = torch.load(path, weights_only=True)
    ckpt["mini_gpt"]["model_config"]["n_embd"] = 64
    torch.save(ckpt, path)
    with pytest.raises(MiniGPTError, match="do not fit the model config"):
        load_model(path)
    ckpt["mini_gpt"]["model_config"]["n_embd"] = 32
    ckpt["mini_gpt"]["format_version"] = 99
    torch.save(ckpt, path)
    with pytest.raises(MiniGPTError, match="format_version=99"):
        load_model(path)


def test_directory_without_config(tmp_path):
    with pytest.raises(MiniGPTError, match=r"has no config\.json, so it is not a model directory"):
        load_model(tmp_path)


def test_generation_modules_import_no_lightning_hydra_wandb():
    code = (
        "import sys, mini_gpt.interop.checkpoint, mini_gpt.infer.sampling, mini_gpt.interop.export\n"
        "import mini_gpt.cli.generate\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'pytorch_lightning', 'wandb',"
        " 'hydra', 'omegaconf', 'transformers'})\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---- resume checks (check_resume runs before Lightning loads any state) ----------------------------
def _resumable(model_config: dict, tokenizer) -> dict:
    """A training checkpoint's `mini_gpt` entry, the part check_resume looks at."""
    return {"format_version": 1, "model_config": dict(model_config), "tokenizer": tokenizer.to_dict()}


TINY = dataclasses.asdict(preset("tiny", vocab_size=4, block_size=16))


def test_resume_check_accepts_the_same_run() -> None:
    check_resume(_resumable(TINY, CharTokenizer("abcd")), dict(TINY), CharTokenizer("abcd"), "last.ckpt")


def test_resume_check_names_differing_model_keys() -> None:
    run = {**TINY, "n_layer": 3, "n_embd": 64}
    with pytest.raises(MiniGPTError) as info:
        check_resume(_resumable(TINY, CharTokenizer("abcd")), run, CharTokenizer("abcd"), "last.ckpt")
    msg = str(info.value)
    assert "\n" not in msg and "n_embd, n_layer" in msg
    assert "model.n_embd=64 model.n_layer=3" in msg  # this run
    assert "model.n_embd=32 model.n_layer=2" in msg  # what resuming needs
    assert "n_head" not in msg  # keys that agree are not listed


@pytest.mark.parametrize(
    "saved, current, expected",
    [
        (
            "abcd",
            "abcde",
            "4 characters in the checkpoint, 5 in this run's corpus; only in the checkpoint: ''; "
            "only in this corpus: 'e'",
        ),
        ("abcd", "abcz", "only in the checkpoint: 'd'; only in this corpus: 'z'"),  # same size, other ids
        ("abcd", "bacd", "same characters in a different order"),
    ],
)
def test_resume_check_character_vocabulary(saved: str, current: str, expected: str) -> None:
    with pytest.raises(MiniGPTError, match="character vocabulary differs") as info:
        check_resume(_resumable(TINY, CharTokenizer(saved)), dict(TINY), CharTokenizer(current), "x.ckpt")
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_resume_check_tokenizer_kind_and_bpe(gpt2_bpe_file: Path) -> None:
    from mini_gpt.tokenizer import build_tokenizer

    gpt2 = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    with pytest.raises(
        MiniGPTError, match="tokenizer is char in the checkpoint but tiktoken gpt2 in this run"
    ):
        check_resume(_resumable(TINY, CharTokenizer("abcd")), dict(TINY), gpt2, "x.ckpt")
    other = gpt2.to_dict()
    other["special_tokens"] = {"<|endoftext|>": 50256, "<|pad|>": 50257}

    class Other:
        def to_dict(self):
            return other

    with pytest.raises(MiniGPTError, match="tokenizer tiktoken gpt2 differs in special_tokens"):
        check_resume(_resumable(TINY, gpt2), dict(TINY), Other(), "x.ckpt")  # type: ignore[arg-type]
    check_resume(_resumable(TINY, gpt2), dict(TINY), gpt2, "x.ckpt")


def test_resume_check_format_and_weights_only() -> None:
    meta = _resumable(TINY, CharTokenizer("abcd"))
    meta["format_version"] = 2
    with pytest.raises(MiniGPTError, match="format_version=2"):
        check_resume(meta, dict(TINY), CharTokenizer("abcd"), "x.ckpt")
    with pytest.raises(MiniGPTError, match="no mini_gpt metadata"):
        check_resume({}, dict(TINY), CharTokenizer("a"), "x")
    training = {"state_dict": {}, "optimizer_states": [{}], "loops": {}}
    require_training_state(training, "x.ckpt")
    weights_only = {"state_dict": {}}
    with pytest.raises(MiniGPTError, match="holds weights only"):
        require_training_state(weights_only, "x.ckpt")
