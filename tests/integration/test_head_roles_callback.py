"""Head roles during training: logged to the CSV at their steps, equal to the scores recomputed here from
the weights by plain math; off, no columns and no work; on, training's numbers unchanged."""

from __future__ import annotations

import copy
import csv
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import quiet_trainer

from mini_gpt.conf.train import OptimConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.train.callbacks import HeadRoles

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BLOCK, HALF, BATCH, SEED = 16, 5, 3, 7
TINY = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=65, block_size=BLOCK)


@pytest.fixture
def dm(char_data_dir: Path, shakespeare_path: Path) -> Any:
    from mini_gpt.data import DataConfig
    from mini_gpt.data.datamodule import GPTDataModule

    cfg = DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(char_data_dir))
    return GPTDataModule(cfg, block_size=BLOCK, batch_size=4, seed=3, val_windows=4)


def _module(dm: Any, dropout: float = 0.0) -> Any:
    from mini_gpt.train.module import GPTLitModule

    torch.manual_seed(0)
    config = GPTConfig(
        n_layer=2, n_head=2, n_embd=16, vocab_size=dm.vocab_size, block_size=BLOCK, dropout=dropout
    )
    return GPTLitModule(config, OptimConfig(lr=3e-3, warmup_steps=1), tokenizer=dm.tokenizer, max_steps=5)


def _fit(tmp_path: Path, dm: Any, callbacks: list[Any], dropout: float = 0.0) -> Any:
    module = _module(dm, dropout)
    trainer = quiet_trainer(tmp_path, max_steps=5, val_check_interval=5, callbacks=callbacks)
    trainer.fit(module, datamodule=dm)
    return module


def plain_attention(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's (B, n_head, T, T) attention weights, by the GPT-2 equations from the raw weights
    (learned positions, layernorm, tanh GELU, no dropout)."""
    sd = {k: v.double() for k, v in model.state_dict().items()}
    nh, T = model.config.n_head, idx.shape[1]
    hs = model.config.n_embd // nh

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * sd[f"{name}.weight"] + sd[f"{name}.bias"]

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        return x @ sd[f"{name}.weight"].T + sd[f"{name}.bias"]

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    weights = []
    for layer in range(model.config.n_layer):
        p = f"transformer.h.{layer}"
        q, k, v = linear(norm(x, f"{p}.ln_1"), f"{p}.attn.c_attn").split(model.config.n_embd, dim=-1)
        q, k, v = (t.view(*idx.shape, nh, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        att = (q @ k.transpose(-1, -2) / math.sqrt(hs)).masked_fill(future, float("-inf")).softmax(-1)
        weights.append(att)
        x = x + linear((att @ v).transpose(1, 2).reshape(x.shape), f"{p}.attn.c_proj")
        h = F.gelu(linear(norm(x, f"{p}.ln_2"), f"{p}.mlp.c_fc"), approximate="tanh")
        x = x + linear(h, f"{p}.mlp.c_proj")
    return weights


def plain_scores(model: GPT) -> dict[str, float]:
    """The logged columns, recomputed: the mean attention, over the batch and the queries, from each
    query to the key one back (previous token), to the token after its earlier copy (induction) and to
    its earlier copy (duplicate token), on BATCH sequences of HALF random tokens repeated."""
    first = torch.randint(
        model.config.vocab_size, (BATCH, HALF), generator=torch.Generator().manual_seed(SEED)
    )
    weights = plain_attention(model, torch.cat([first, first], dim=1))
    T = 2 * HALF
    keys = {
        "previous_token": [(t, t - 1) for t in range(1, T)],
        "induction": [(t, t - HALF + 1) for t in range(HALF, T)],
        "duplicate_token": [(t, t - HALF) for t in range(HALF, T)],
    }
    out: dict[str, float] = {}
    for role, pairs in keys.items():
        per_head = {
            f"L{layer}H{head}": sum(float(att[b, head, q, k]) for b in range(BATCH) for q, k in pairs)
            / (BATCH * len(pairs))
            for layer, att in enumerate(weights)
            for head in range(model.config.n_head)
        }
        out |= {f"head_roles/{role}/{name}": score for name, score in per_head.items()}
        out[f"head_roles/{role}_max"] = max(per_head.values())
    return out


def logged_rows(root: Path) -> dict[int, dict[str, float]]:
    rows = list(csv.DictReader((root / "csv" / "metrics.csv").open()))
    return {
        int(r["step"]): {k: float(v) for k, v in r.items() if k.startswith("head_roles/") and v}
        for r in rows
        if r.get("head_roles/induction_max")
    }


def test_scores_are_logged_at_their_steps_and_equal_a_plain_recomputation(tmp_path: Path, dm: Any) -> None:
    start = copy.deepcopy(_module(dm).model)  # the weights the fit starts from (the same seed)
    callback = HeadRoles(every_n_steps=2, half=HALF, batch=BATCH, seed=SEED)
    module = _fit(tmp_path, dm, [callback])
    rows = logged_rows(tmp_path)
    assert sorted(rows) == [0, 2, 4, 5]  # the start, every 2 steps, and after the last one
    assert [step for step, _ in callback.history] == [0, 2, 4, 5]
    assert len(rows[5]) == 3 * (1 + 2 * 2)  # each role's best head and its 4 heads
    assert rows[0] == pytest.approx(plain_scores(start), abs=1e-6)
    assert rows[5] == pytest.approx(plain_scores(module.model), abs=1e-6)
    assert rows[0] != pytest.approx(rows[5], abs=1e-6)  # it trained between
    assert all(0.0 <= v <= 1.0 for row in rows.values() for v in row.values())


def test_off_logs_nothing_and_measures_nothing(tmp_path: Path, dm: Any, monkeypatch) -> None:
    from mini_gpt.inspect import heads

    monkeypatch.setattr(heads, "head_roles", lambda *a, **k: pytest.fail("measured while off"))
    assert not HeadRoles().enabled
    _fit(tmp_path, dm, [HeadRoles(every_n_steps=0)])
    header = next(csv.reader((tmp_path / "csv" / "metrics.csv").open()))
    assert "train/loss" in header and not [c for c in header if c.startswith("head_roles")]


def test_training_numbers_are_the_same_with_it_on(tmp_path: Path, dm: Any) -> None:
    """With dropout, so a measurement that drew from torch's random state or ran in training mode would
    change the weights trained."""
    off = _fit(tmp_path / "off", dm, [], dropout=0.2)
    on = _fit(tmp_path / "on", dm, [HeadRoles(every_n_steps=1, half=HALF)], dropout=0.2)
    for (name, a), b in zip(off.model.state_dict().items(), on.model.state_dict().values()):
        assert torch.equal(a, b), name
    losses = [
        {
            r["step"]: r["train/loss"]
            for r in csv.DictReader((root / "csv" / "metrics.csv").open())
            if r["train/loss"]
        }
        for root in (tmp_path / "off", tmp_path / "on")
    ]
    assert sorted(losses[0], key=int) == ["1", "2", "3", "4", "5"] and losses[0] == losses[1]
    assert on.model.training  # left in training mode


def test_other_ranks_measure_nothing_and_bad_settings_are_one_line() -> None:
    from lightning.pytorch.strategies import FSDPStrategy

    callback = HeadRoles(every_n_steps=1)
    module = SimpleNamespace(model=GPT(GPTConfig(**TINY)), log=lambda *args, **kwargs: None)
    logged: list[dict[str, float]] = []
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append(metrics))
    other_rank = SimpleNamespace(is_global_zero=False, global_step=3, loggers=[logger])
    assert callback.measure(other_rank, module) is None and not logged and not callback.history
    rank_zero = SimpleNamespace(is_global_zero=True, global_step=3, loggers=[logger])  # the same weights
    assert callback.measure(rank_zero, module) == logged[0] and [s for s, _ in callback.history] == [3]
    with pytest.raises(MiniGPTError, match=r"^callbacks.head_roles.half=9: two copies must fit the context"):
        HeadRoles(every_n_steps=1, half=9).setup(SimpleNamespace(strategy=None), module, "fit")
    HeadRoles(every_n_steps=1, half=8).setup(SimpleNamespace(strategy=None), module, "fit")
    HeadRoles(every_n_steps=0, half=9).setup(SimpleNamespace(strategy=None), module, "fit")  # off: unchecked
    with pytest.raises(MiniGPTError, match="does not work with trainer=fsdp"):
        callback.setup(SimpleNamespace(strategy=FSDPStrategy()), module, "fit")
    with pytest.raises(MiniGPTError, match=r"^callbacks.head_roles.every_n_steps=-1 must be >= 0$"):
        HeadRoles(every_n_steps=-1)
    with pytest.raises(MiniGPTError, match=r"^callbacks.head_roles.batch=0 must be >= 1$"):
        HeadRoles(batch=0)


def _periodic(row: list[int], shortest: int, longest: int) -> bool:
    """Whether the row repeats itself with some period from shortest to longest tokens."""
    return any(row[p:] == row[:-p] for p in range(shortest, longest + 1))


def test_the_induction_heads_recipe_trains_on_repeated_spans_and_validates_on_plain_text(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    import lightning as L

    from mini_gpt.train.run import train

    batches: dict[str, list[torch.Tensor]] = {"train": [], "val": []}

    class Record(L.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            batches["train"].append(torch.cat([batch[0], batch[1][:, -1:]], dim=1))

        def on_validation_batch_start(self, trainer: Any, module: Any, batch: Any, *args: Any) -> None:
            batches["val"].append(torch.cat([batch[0], batch[1][:, -1:]], dim=1))

    small = [
        "model.n_embd=16", "model.block_size=32", "loader.repeat_span=12", "loader.batch_size=4",
        "loader.val_windows=4", "trainer.max_steps=2", "trainer.val_check_interval=2",
        "callbacks.head_roles.every_n_steps=1", "callbacks.sample_text=null", f"paths.run_dir={tmp_path}",
        f"data.path={shakespeare_path}", f"data.data_dir={char_data_dir}", "threads=1",
        "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
    ]  # fmt: skip
    cfg = compose(["experiment=induction_heads", *small])
    assert cfg.model.n_layer == 2 and cfg.model.pos_embedding == "learned"  # the recipe's own
    result = train(cfg, callbacks=[Record()])
    assert result.summary is not None and result.summary["status"] == "completed"
    rows = [r for b in batches["train"] for r in b.tolist()]
    assert len(rows) == 2 * 4 and all(_periodic(r, 6, 12) for r in rows)  # a span of 6 to 12, repeated
    val = [r for b in batches["val"] for r in b.tolist()]
    assert len(val) == 4 and not any(_periodic(r, 6, 12) for r in val)  # the held-out text as it is
    assert sorted(logged_rows(tmp_path)) == [0, 1, 2]  # head roles at the start and every step


def test_a_bad_repeat_span_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from mini_gpt.cli import main

    args = ["train", "experiment=induction_heads", "loader.repeat_span=300", f"hydra.run.dir={tmp_path}"]
    monkeypatch.setattr(sys, "argv", ["mini-gpt", *args])
    try:
        code = main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: loader.repeat_span=300 must be 0 (plain windows) or 1 to model.block_size=")
    assert err.count("\n") == 1 and "Traceback" not in err
