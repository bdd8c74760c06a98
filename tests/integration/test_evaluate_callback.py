"""Evals during training: logged at the step measured, equal to the offline evaluation, rank-split exactly."""

from __future__ import annotations

import csv
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import make_items, preset, write_jsonl

from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.bpb import bits_per_byte
from mini_gpt.eval.hellaswag import evaluate_hellaswag, read_hellaswag
from mini_gpt.train.callbacks import EvaluateCallback

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BLOCK = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shakespeare_path) -> Path:
    root = tmp_path_factory.mktemp("cb")
    text = shakespeare_path.read_text()[:12_000]
    (root / "small.txt").write_text(text)
    write_jsonl(root / "hs.jsonl", make_items(6))
    return root


def datamodule(root: Path):
    from mini_gpt.data import DataConfig
    from mini_gpt.data.datamodule import GPTDataModule

    cfg = DataConfig(name="text", path=str(root / "small.txt"), tokenizer="char", data_dir=str(root / "data"))
    return GPTDataModule(cfg, block_size=BLOCK, batch_size=4, seed=1, val_windows=4)


def test_evals_are_logged_at_their_steps_and_equal_offline_evaluation(tmp_path, corpus):
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from mini_gpt.conf.train import OptimConfig
    from mini_gpt.train.module import GPTLitModule

    dm = datamodule(corpus)
    dm.prepare_data()
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=dm.vocab_size, block_size=BLOCK)
    module = GPTLitModule(cfg, OptimConfig(), tokenizer=dm.tokenizer, max_steps=5)
    cb = EvaluateCallback(
        every_n_steps=2,
        tasks=["bpb", "hellaswag"],
        hellaswag_path=str(corpus / "hs.jsonl"),
        hellaswag_limit=5,
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=5, max_epochs=-1, val_check_interval=5,
        check_val_every_n_epoch=None, num_sanity_val_steps=0, limit_val_batches=1, log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        logger=CSVLogger(tmp_path, name="csv", version=""), callbacks=[cb],
    )  # fmt: skip
    trainer.fit(module, datamodule=dm)
    assert [step for step, _ in cb.history] == [2, 4, 5]  # every 2 steps, and after the last one

    # Offline evaluation of the final weights: the val text (last 10% of the characters) and 5 items.
    text = (corpus / "small.txt").read_text()
    offline = bits_per_byte(module.model, dm.tokenizer, [text[int(len(text) * 0.9) :]])
    hs = evaluate_hellaswag(module.model, dm.tokenizer, read_hellaswag(corpus / "hs.jsonl", limit=5))
    final = cb.history[-1][1]
    assert final["eval/bpb/bits_per_byte"] == pytest.approx(offline.bits_per_byte, rel=1e-6)
    assert final["eval/bpb/loss"] == pytest.approx(offline.loss, rel=1e-6)
    assert final["eval/hellaswag/acc"] == hs.acc and final["eval/hellaswag/acc_norm"] == hs.acc_norm
    assert cb.history[0][1]["eval/bpb/bits_per_byte"] != final["eval/bpb/bits_per_byte"]  # it trained

    rows = list(csv.DictReader((tmp_path / "csv" / "metrics.csv").open()))
    logged = {
        int(r["step"]): float(r["eval/bpb/bits_per_byte"]) for r in rows if r.get("eval/bpb/bits_per_byte")
    }
    assert logged == pytest.approx({s: m["eval/bpb/bits_per_byte"] for s, m in cb.history})


class ThreadAllReduce:
    """A stand-in for a 2-process strategy: `reduce(t, reduce_op="sum")` sums over both threads."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2)
        self.slots: list[torch.Tensor | None] = [None, None]

    def for_rank(self, rank: int) -> SimpleNamespace:
        def reduce(t: torch.Tensor, reduce_op: str = "mean") -> torch.Tensor:
            assert reduce_op == "sum"
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = self.slots[0] + self.slots[1]
            self.barrier.wait()
            return total

        return SimpleNamespace(reduce=reduce)


def test_rank_split_work_reduces_to_the_single_process_numbers(corpus):
    from mini_gpt.model.gpt import GPT

    dm = datamodule(corpus)
    torch.manual_seed(1)
    model = GPT(preset("tiny", vocab_size=dm.vocab_size, block_size=BLOCK)).eval()
    logged: list[dict] = []
    module = SimpleNamespace(  # the module's self.log, as a LightningModule has it
        model=model, device=torch.device("cpu"), log=lambda *args, **kwargs: None,
        log_dict=lambda metrics, logger=True: logged.append(metrics),
    )  # fmt: skip
    kwargs = {"every_n_steps": 1, "tasks": ["bpb", "hellaswag"], "hellaswag_path": str(corpus / "hs.jsonl")}

    def trainer(rank: int, world: int, strategy=None) -> SimpleNamespace:
        return SimpleNamespace(
            global_rank=rank, world_size=world, strategy=strategy, global_step=3, is_global_zero=rank == 0,
            loggers=[], callbacks=[], datamodule=dm,
        )  # fmt: skip

    single = EvaluateCallback(**kwargs)
    single.setup(trainer(0, 1), module, "fit")
    want = single.evaluate(trainer(0, 1), module)
    reducer, got = ThreadAllReduce(), [None, None]

    def run(rank: int) -> None:
        cb = EvaluateCallback(**kwargs)
        t = trainer(rank, 2, reducer.for_rank(rank))
        cb.setup(t, module, "fit")
        got[rank] = cb.evaluate(t, module)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert got[0] == pytest.approx(want, rel=1e-9) and got[1] == pytest.approx(want, rel=1e-9)
    assert logged[0] == want  # to callback_metrics too (summary.json's "eval"), not to the loggers
    assert set(want) == {
        "eval/bpb/bits_per_byte",
        "eval/bpb/loss",
        "eval/hellaswag/acc",
        "eval/hellaswag/acc_norm",
    }


def test_off_by_default_and_bad_settings_are_one_line():
    assert not EvaluateCallback().enabled
    with pytest.raises(MiniGPTError, match="every_n_steps"):
        EvaluateCallback(every_n_steps=-1)
    with pytest.raises(MiniGPTError, match="unknown"):
        EvaluateCallback(every_n_steps=1, tasks=["mmlu"])


def test_a_missing_hellaswag_names_the_callbacks_key(tmp_path, monkeypatch):
    """Offline with no copy, or a wrong path: the line names the key a training run takes, not evaluate's."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # no download tried
    dm = SimpleNamespace(
        cfg=SimpleNamespace(data_dir=str(tmp_path)), prepared_data=lambda: SimpleNamespace(tokenizer=None)
    )
    trainer = SimpleNamespace(datamodule=dm)
    module = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(block_size=BLOCK)))
    missing = tmp_path / "missing.jsonl"
    for path, line in [
        (None, "pass callbacks.evaluate.hellaswag_path=FILE"),
        (str(missing), f"callbacks.evaluate.hellaswag_path={missing} does not exist"),
    ]:
        cb = EvaluateCallback(every_n_steps=1, tasks=["hellaswag"], hellaswag_path=path)
        with pytest.raises(MiniGPTError) as err:
            cb.setup(trainer, module, "fit")
        assert line in str(err.value) and "hellaswag.path" not in str(err.value)


def test_the_default_config_has_the_callback_off():
    from mini_gpt.conf import compose

    cfg = compose([])
    assert cfg.callbacks.evaluate.every_n_steps == 0
    cfg = compose(["callbacks.evaluate.every_n_steps=100", "callbacks.evaluate.tasks=[bpb,hellaswag]"])
    from hydra.utils import instantiate

    cb = instantiate(cfg.callbacks.evaluate)
    assert isinstance(cb, EvaluateCallback) and cb.every_n_steps == 100 and cb.tasks == ["bpb", "hellaswag"]
