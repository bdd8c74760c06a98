"""callbacks.health in real fits: the logged grad norms and update ratios against a recomputation from the
same batches and weights, and the spike line of a run whose lr is too high (none in a healthy run)."""

from __future__ import annotations

import copy
import csv
import json
import re
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import quiet_trainer

from mini_gpt.conf.train import OptimConfig
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.train.callbacks import Health

BLOCK, ACCUMULATE = 32, 2


class LastStep(L.Callback):
    """The weights before the last optimizer step and the micro-batches it was computed from."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx % ACCUMULATE == 0:
            self.weights, self.batches = copy.deepcopy(pl_module.model.state_dict()), []
        self.batches.append([t.clone() for t in batch])


def test_grad_norms_and_update_ratios_match_a_recomputation(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    from mini_gpt.data import DataConfig
    from mini_gpt.data.datamodule import GPTDataModule
    from mini_gpt.train.module import GPTLitModule

    data = DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(char_data_dir))
    dm = GPTDataModule(data, block_size=BLOCK, batch_size=4, seed=5, val_windows=4)
    torch.manual_seed(0)
    config = GPTConfig(n_layer=3, n_head=2, n_embd=32, vocab_size=65, block_size=BLOCK)
    module = GPTLitModule(config, OptimConfig(lr=1e-2, warmup_steps=2), tokenizer=None, max_steps=3)
    last = LastStep()
    trainer = quiet_trainer(
        tmp_path, max_steps=3, accumulate_grad_batches=ACCUMULATE, val_check_interval=3 * ACCUMULATE,
        limit_val_batches=1, enable_checkpointing=False, gradient_clip_val=0.5, callbacks=[Health(), last],
    )  # fmt: skip
    trainer.fit(module, datamodule=dm)
    logged = {k: v.item() for k, v in trainer.callback_metrics.items() if k.startswith("health/")}

    # Step 3 again in plain torch: its weights, its two micro-batches, the mean of their losses.
    ref = GPT(config)
    ref.load_state_dict(last.weights)
    loss = sum(F.cross_entropy(ref(x)[0].flatten(0, 1), y.flatten()) for x, y in last.batches) / ACCUMULATE
    parts = {f"block_{i}": list(block.parameters()) for i, block in enumerate(ref.transformer.h)}
    parts["embedding"] = [ref.transformer.wte.weight, ref.transformer.wpe.weight]  # wte is the tied head too
    parts["head"] = list(ref.transformer.ln_f.parameters())
    for part, params in parts.items():
        grads = torch.autograd.grad(loss, params, retain_graph=True)
        norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads)).item()
        assert logged[f"health/grad_norm/{part}"] == pytest.approx(norm, rel=1e-5), part
    assert trainer.global_step == 3  # the norms are before clipping (0.5): larger than it
    assert logged["health/grad_norm/embedding"] > 0.5

    # ||w_after - w_before|| / ||w_before|| over AdamW's groups: 2-D matmul weights decay, the rest not.
    before, after = last.weights, module.model.state_dict()
    names = [n for n, _ in ref.named_parameters()]
    decay = [
        n for n in names if before[n].ndim == 2 and not n.startswith(("transformer.wte", "transformer.wpe"))
    ]
    groups = {"decay": decay, "no_decay": [n for n in names if n not in decay]}
    for group, members in groups.items():
        step = torch.sqrt(sum((after[n].double() - before[n].double()).pow(2).sum() for n in members))
        size = torch.sqrt(sum(before[n].double().pow(2).sum() for n in members))
        assert logged[f"health/update_ratio/{group}"] == pytest.approx((step / size).item(), rel=1e-4), group
    assert {k.split("/")[1] for k in logged} == {"grad_norm", "update_ratio", "rms", "attn_entropy"}
    assert len([k for k in logged if k.startswith("health/rms/")]) == 3

    with (tmp_path / "csv" / "metrics.csv").open() as fh:  # the CSV logger has them at every log step
        rows = [r for r in csv.DictReader(fh) if r.get("health/grad_norm/block_0")]
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert float(rows[-1]["health/grad_norm/block_2"]) == pytest.approx(logged["health/grad_norm/block_2"])


SPIKE = re.compile(
    r"^spike: step (\d+) train loss [\d.]+, [\d.]+ MADs above the last \d+ logged \(median [\d.]+\); "
    r"(embedding|block_\d+|head)'s grad norm grew most \(x[\d.]+\)$",
    re.M,
)


def _train(compose: Any, tmp_path: Path, data_dir: Path, shakespeare: Path, *extra: str) -> dict[str, Any]:
    from mini_gpt.train.run import train

    overrides = [
        "model=tiny", "optim=adamw", "logger=none", f"paths.run_dir={tmp_path}", f"data.path={shakespeare}",
        f"data.data_dir={data_dir}", "loader.batch_size=8", "loader.val_windows=8",
        "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1", "trainer.max_steps=30", "trainer.val_check_interval=30",
        "callbacks.sample_text=null", "callbacks.health.spike_window=10", "threads=1", *extra,
    ]  # fmt: skip
    result = train(compose(overrides))
    return json.loads((result.run_dir / "summary.json").read_text())


def test_a_too_high_lr_prints_a_spike_line_and_a_healthy_run_none(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # lr 0.3 (reached over 40 steps of warmup) is too high for AdamW here: the loss falls, then jumps.
    too_high = ["optim.lr=0.3", "optim.warmup_steps=40", "optim.schedule=constant"]
    summary = _train(compose, tmp_path / "high", char_data_dir, shakespeare_path, *too_high)
    out = capsys.readouterr().out
    spikes = SPIKE.findall(out)
    assert spikes and summary["spikes"] == len(spikes) == out.count("spike:")
    assert summary["status"] == "completed" and summary["steps"] == 30  # a spike does not stop the run
    assert all(1 <= int(step) <= 30 for step, _ in spikes)

    summary = _train(
        compose, tmp_path / "ok", char_data_dir, shakespeare_path, "optim.lr=1e-2", "optim.warmup_steps=5"
    )
    assert "spike:" not in capsys.readouterr().out
    assert summary["spikes"] == 0
