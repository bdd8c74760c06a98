"""GPTLitModule: loss, validation mean, logged scalars, checkpoint format, compile keeps keys clean."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import quiet_trainer

from mini_gpt.conf.train import OptimConfig
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.train.callbacks import Recorder
from mini_gpt.train.optim import lr_at

BATCH, BLOCK = 4, 32


def _datamodule(data_dir: Path, shakespeare: Path, val_windows: int = 8) -> Any:
    from mini_gpt.data import DataConfig
    from mini_gpt.data.datamodule import GPTDataModule

    cfg = DataConfig(name="shakespeare_char", path=str(shakespeare), data_dir=str(data_dir))
    return GPTDataModule(cfg, block_size=BLOCK, batch_size=BATCH, seed=7, val_windows=val_windows)


def _module(vocab_size: int, tokenizer: Any = None, **optim: Any) -> Any:
    from mini_gpt.train.module import GPTLitModule

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=vocab_size, block_size=BLOCK)
    return GPTLitModule(cfg, OptimConfig(**optim), tokenizer=tokenizer, max_steps=20)


def _trainer(tmp_path: Path, **kwargs: Any) -> Any:
    settings = dict(devices=1, max_steps=3, val_check_interval=3, enable_checkpointing=False)
    return quiet_trainer(tmp_path, default_root_dir=tmp_path, **{**settings, **kwargs})


def test_training_step_returns_the_token_mean_cross_entropy() -> None:
    module = _module(vocab_size=11)
    x = torch.randint(0, 11, (3, 9))
    y = torch.randint(0, 11, (3, 9))
    logits, _ = module.model(x)
    logp = logits - logits.logsumexp(-1, keepdim=True)
    reference = -logp.gather(-1, y[..., None]).mean()
    with pytest.warns(UserWarning, match="self.log"):  # self.log outside a fit: a warning, no error
        torch.testing.assert_close(module.training_step((x, y), 0), reference)


def test_first_step_logs_exact_loss_lr_grad_norm_and_val(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    dm = _datamodule(char_data_dir, shakespeare_path)
    dm.prepare_data()
    dm.setup("fit")
    module = _module(dm.vocab_size, dm.tokenizer, lr=1e-3, min_lr_ratio=0.1, warmup_steps=4)
    # Independent reference for step 1: same init, same first batch, plain PyTorch.
    ref = GPT(module.model_config)
    ref.load_state_dict(module.model.state_dict())
    x, y = next(iter(dm.train_dataloader()))
    ref_loss = F.cross_entropy(ref(x)[0].flatten(0, 1), y.flatten())
    ref_loss.backward()
    ref_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ref.parameters()]))

    recorder = Recorder()
    trainer = _trainer(tmp_path, gradient_clip_val=1e9, callbacks=[recorder])  # clipping still logs the norm
    trainer.fit(module, datamodule=dm)
    step1 = recorder.record.train_curve[0]
    assert step1[0] == 1
    assert step1[1] == pytest.approx(ref_loss.item(), rel=1e-5)
    rows = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    first = dict(zip(header, rows[1].split(",")))
    assert float(first["grad_norm"]) == pytest.approx(ref_norm.item(), rel=1e-4)
    assert float(first["lr"]) == pytest.approx(lr_at(0, 1e-3, 1e-4, 4, 20))  # the lr step 1 used
    assert [s for s, _ in recorder.record.train_curve] == [1, 2, 3]

    # val/loss = mean token cross-entropy over exactly the val windows, by hand
    ref.load_state_dict(module.model.state_dict())
    ref.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for vx, vy in dm.val_dataloader():
            total += F.cross_entropy(ref(vx)[0].flatten(0, 1), vy.flatten(), reduction="sum").item()
            count += vy.numel()
    assert count == 8 * BLOCK
    val_loss = trainer.callback_metrics["val/loss"].item()
    assert val_loss == pytest.approx(total / count, rel=1e-5)
    assert trainer.callback_metrics["val/ppl"].item() == pytest.approx(math.exp(total / count), rel=1e-5)
    last = recorder.record.val_curve[-1]
    assert last[0] == 3 and last[2] == pytest.approx(val_loss) and recorder.record.val_tokens == count


def test_checkpoint_alone_rebuilds_model_and_tokenizer(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    from mini_gpt.tokenizer import tokenizer_from_dict

    dm = _datamodule(char_data_dir, shakespeare_path)
    dm.prepare_data()
    module = _module(dm.vocab_size, dm.tokenizer)
    module.tokens_per_step = 96  # what train() passes from the batch layout
    trainer = _trainer(tmp_path, max_steps=2, limit_val_batches=1)
    trainer.fit(module, datamodule=dm)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)

    ckpt = torch.load(path, map_location="cpu", weights_only=True)  # primitives + tensors only
    meta = ckpt["mini_gpt"]
    assert meta["format_version"] == 1
    assert meta["model_config"] == dataclasses.asdict(module.model_config)
    assert meta["tokens"] == 2 * 96
    assert ckpt["global_step"] == 2 and ckpt["optimizer_states"] and ckpt["lr_schedulers"]
    keys = list(ckpt["state_dict"])
    assert keys and all(k.startswith("model.") and "_orig_mod" not in k for k in keys)

    model = GPT(GPTConfig(**meta["model_config"]))
    model.load_state_dict({k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()})
    tok = tokenizer_from_dict(meta["tokenizer"])
    text = "ROMEO:\nWhat light"
    assert tok.decode(tok.encode(text)) == text and tok == dm.tokenizer
    idx = torch.tensor([tok.encode(text)])
    module.model.eval()
    model.eval()
    torch.testing.assert_close(model(idx)[0], module.model(idx)[0], rtol=0, atol=0)


def test_compile_keeps_uncompiled_module_as_state_dict_owner() -> None:
    module = _module(vocab_size=13)
    module.compile = True
    net = module.net  # creates the compiled wrapper (compilation itself is lazy)
    assert net is not module.model and getattr(net, "_orig_mod", None) is module.model
    keys = list(module.state_dict())
    assert keys == [f"model.{k}" for k in module.model.state_dict()]


def test_model_summary_counts_the_flops_of_one_sequence(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    """Lightning's summary prints "Total FLOPs: 0" without an example input; ours is one block_size
    sequence, counted the same way as torch's FlopCounterMode on the bare GPT."""
    from lightning.pytorch.utilities.model_summary import ModelSummary
    from torch.utils.flop_counter import FlopCounterMode

    module = _module(vocab_size=65)
    _trainer(tmp_path, max_steps=1, limit_val_batches=1).fit(
        module, datamodule=_datamodule(char_data_dir, shakespeare_path)
    )
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module.model.eval()(torch.zeros(1, BLOCK, dtype=torch.long))
    expected = counter.get_total_flops()
    # 2 x (in x out) per token for each weight matrix: the reference's order of magnitude
    assert expected >= 2 * BLOCK * 2 * (32 * 96 + 32 * 32 + 2 * 32 * 128)
    assert ModelSummary(module).total_flops == expected
