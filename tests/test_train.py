"""train.py end to end: Hydra compose API and subprocesses, tiny model, a few steps on tiny Shakespeare.

The data cache is a private tmp dir built from the shared read-only corpus (never the network).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mini_gpt.conf import CONF_DIR

REPO = Path(__file__).resolve().parents[1]
SUMMARY_KEYS = {
    "best_val_loss",
    "final_val_loss",
    "steps",
    "tokens",
    "wall_seconds",
    "tokens_per_sec",
    "val_curve",
    "best_ckpt",
    "last_ckpt",
}


@pytest.fixture(scope="session")
def char_data_dir(tmp_path_factory: pytest.TempPathFactory, shakespeare_path: Path) -> Path:
    """Prepared char-level tiny Shakespeare in a private cache (shared by this file's tests)."""
    from mini_gpt.data import DataConfig, prepare_data

    root = tmp_path_factory.getbasetemp() / "mini_gpt_char_cache"
    prepare_data(DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(root)))
    return root


def _overrides(run_dir: Path, data_dir: Path, shakespeare: Path, *extra: str) -> list[str]:
    return [
        "model=tiny",
        "logger=none",
        f"paths.run_dir={run_dir}",
        f"data.path={shakespeare}",
        f"data.data_dir={data_dir}",
        "loader.batch_size=8",
        "loader.val_windows=32",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1",
        "callbacks.sample_text.every_n_steps=0",
        "callbacks.sample_text.max_new_tokens=16",
        *extra,
    ]


def _fit(compose: Any, overrides: list[str]) -> tuple[dict[str, Any], Any]:
    """Run train() on a composed config; return (summary.json, the LightningModule)."""
    import mini_gpt.lit_module as lm
    from mini_gpt.training import train

    captured: dict[str, Any] = {}
    original_init = lm.GPTLitModule.__init__

    def spy_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        captured["module"] = self

    cfg = compose(overrides)
    lm.GPTLitModule.__init__ = spy_init  # type: ignore[method-assign]
    try:
        train(cfg)
    finally:
        lm.GPTLitModule.__init__ = original_init  # type: ignore[method-assign]
    summary = json.loads((Path(cfg.paths.run_dir) / "summary.json").read_text())
    return summary, captured["module"]


@pytest.mark.slow
def test_compose_train_summary_and_loss_decreases(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    run_dir = tmp_path / "run"
    summary, module = _fit(
        compose,
        _overrides(
            run_dir,
            char_data_dir,
            shakespeare_path,
            "logger=csv",
            "trainer.max_steps=40",
            "trainer.val_check_interval=15",
            "optim.lr=1e-2",
            "optim.warmup_steps=5",
        ),
    )
    assert set(summary) >= SUMMARY_KEYS
    assert summary["steps"] == 40
    assert summary["tokens"] == 40 * 8 * 64
    # evaluations at 15, 30 and the end (40), with wall times from process start, increasing
    assert [row[0] for row in summary["val_curve"]] == [15, 30, 40]
    times = [row[1] for row in summary["val_curve"]]
    assert times == sorted(times) and 0 < times[0] < summary["wall_seconds"]
    assert summary["final_val_loss"] == summary["val_curve"][-1][2]
    assert summary["best_val_loss"] == min(row[2] for row in summary["val_curve"])
    assert summary["tokens_per_sec"] > 0
    # ln(65) = 4.17 for a uniform guess; 40 steps at lr 1e-2 must learn the character frequencies
    assert summary["val_curve"][0][2] < 4.0
    assert summary["final_val_loss"] < summary["val_curve"][0][2]
    first, last = module.stats.train_history[0][1], module.stats.train_history[-1][1]
    assert last < first - 0.5
    assert Path(summary["last_ckpt"]).is_file() and Path(summary["best_ckpt"]).is_file()
    assert Path(summary["last_ckpt"]).parent == run_dir / "checkpoints"
    # CSV logger got every metric the module promises
    header = (run_dir / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/loss", "val/loss", "val/ppl", "lr", "grad_norm", "tokens_per_sec", "mfu"} <= set(header)
    # ... and val/loss is stamped with the optimizer step it was measured at (as in summary.json)
    with (run_dir / "csv" / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["val/loss"]]
    assert [int(r["step"]) for r in rows] == [15, 30, 40]
    assert [float(r["val/loss"]) for r in rows] == pytest.approx([row[2] for row in summary["val_curve"]])


@pytest.mark.slow
def test_exact_resume_and_same_seed(
    compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    k = 6
    common = ("trainer.val_check_interval=3", "optim.decay_steps=12", "optim.warmup_steps=2", "optim.lr=3e-3")
    common = (*common, "trainer.precision=32-true", "optim.name=muon")  # Muon + AdamW state both restored
    full, full_module = _fit(
        compose,
        _overrides(tmp_path / "full", char_data_dir, shakespeare_path, *common, f"trainer.max_steps={2 * k}"),
    )
    half, half_module = _fit(
        compose,
        _overrides(tmp_path / "half", char_data_dir, shakespeare_path, *common, f"trainer.max_steps={k}"),
    )
    # same seed, same config: identical losses step for step
    assert half_module.stats.train_history == full_module.stats.train_history[:k]
    resumed, resumed_module = _fit(
        compose,
        _overrides(
            tmp_path / "resumed",
            char_data_dir,
            shakespeare_path,
            *common,
            f"trainer.max_steps={2 * k}",
            f"ckpt_path={half['last_ckpt']}",
        ),
    )
    assert resumed_module.stats.start_step == k
    assert resumed_module.stats.train_history == full_module.stats.train_history[k:]  # bit-identical
    assert resumed["final_val_loss"] == full["final_val_loss"]
    assert resumed["steps"] == 2 * k


@pytest.mark.slow
def test_overfit_one_batch(compose: Any, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path) -> None:
    _, module = _fit(
        compose,
        _overrides(
            tmp_path / "overfit",
            char_data_dir,
            shakespeare_path,
            "debug=overfit_batch",
            "loader.batch_size=2",
            "trainer.max_steps=150",
            "trainer.val_check_interval=150",
            "optim.lr=2e-2",
            "optim.min_lr_ratio=1.0",
            "model.n_embd=64",
        ),
    )
    assert module.stats.train_history[0][1] > 3.5
    assert module.stats.train_history[-1][1] < 0.2, module.stats.train_history[-5:]


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["NETRC"] = str(home / "no-netrc")  # no credentials: W&B must go offline by itself, no prompt
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.mark.slow
def test_fast_dev_run_writes_no_checkpoint_and_starts_no_logger(
    compose: Any,
    tmp_path: Path,
    char_data_dir: Path,
    shakespeare_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # a W&B run would leave wandb/offline-run-* behind
    run_dir = tmp_path / "run"
    overrides = [
        o for o in _overrides(run_dir, char_data_dir, shakespeare_path) if not o.startswith("logger=")
    ]
    summary, _ = _fit(compose, [*overrides, "debug=fast_dev_run", "logger=wandb"])
    assert summary["steps"] == 1
    assert summary["last_ckpt"] is None and summary["best_ckpt"] is None
    assert not list(run_dir.rglob("*.ckpt"))
    assert not (run_dir / "wandb").exists()
    # what conf/debug/fast_dev_run.yaml promises
    assert "checkpoints and loggers" in (CONF_DIR / "debug" / "fast_dev_run.yaml").read_text()


@pytest.mark.slow
def test_subprocess_default_wandb_offline_from_other_cwd(
    tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = [a for a in _overrides(run_dir, char_data_dir, shakespeare_path) if not a.startswith("logger=")]
    args = [a for a in args if not a.startswith("paths.run_dir")]
    args += [f"hydra.run.dir={run_dir}", "trainer.max_steps=4", "trainer.val_check_interval=2"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1 and any(offline_runs[0].glob("*.wandb"))
    assert f"wandb sync {offline_runs[0]}" in proc.stdout
    # the summary's path and headline numbers are printed last
    tail = proc.stdout.strip().splitlines()[-3:]
    assert tail[0] == f"summary: {run_dir / 'summary.json'}"
    assert "best_val_loss=" in tail[1] and "tokens/s=" in tail[1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["last_ckpt"] == str(run_dir / "checkpoints" / "last.ckpt")
    assert (run_dir / ".hydra" / "config.yaml").is_file()  # resolved config saved by Hydra
    assert not (tmp_path / "outputs").exists()  # nothing written relative to the cwd


@pytest.mark.slow
def test_cli_errors_are_short(tmp_path: Path) -> None:
    typo = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "trainer.max_stepz=3"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert typo.returncode != 0
    assert "max_stepz" in typo.stderr
    missing = tmp_path / "nope" / "last.ckpt"
    bad_ckpt = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"ckpt_path={missing}", f"hydra.run.dir={tmp_path / 'r'}"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad_ckpt.returncode == 2
    assert bad_ckpt.stderr.strip().splitlines() == [
        f"error: ckpt_path={missing} does not exist; pass an existing .ckpt to resume"
    ]


@pytest.mark.slow
def test_train_on_shards_resumes_exactly(compose: Any, tmp_path: Path, gpt2_bpe_file: Path) -> None:
    """data=hf end to end: local parquet -> shards -> training; a resumed run continues bit for bit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    words = ["the", "little", "dog", "saw", "a", "big", "red", "ball", "and", "was", "happy", "."]
    rng = __import__("random").Random(0)
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 80))) for _ in range(1500)]
    pq.write_table(pa.table({"text": docs}), tmp_path / "stories.parquet")
    common = [
        "model=tiny",
        "logger=none",
        "data=hf",
        f"data.dataset={tmp_path / 'stories.parquet'}",
        f"data.data_dir={tmp_path / 'cache'}",
        f"data.bpe_file={gpt2_bpe_file}",
        "data.shard_tokens=4000",
        "data.val_fraction=0.05",
        "data.num_proc=1",
        "loader.batch_size=4",
        "loader.val_windows=8",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1",
        "trainer.val_check_interval=3",
        "callbacks.sample_text.every_n_steps=0",
        "callbacks.sample_text.max_new_tokens=4",
    ]
    full, full_module = _fit(compose, [*common, f"paths.run_dir={tmp_path / 'full'}", "trainer.max_steps=6"])
    half, _ = _fit(compose, [*common, f"paths.run_dir={tmp_path / 'half'}", "trainer.max_steps=3"])
    resumed, resumed_module = _fit(
        compose,
        [
            *common,
            f"paths.run_dir={tmp_path / 'resumed'}",
            "trainer.max_steps=6",
            f"ckpt_path={half['last_ckpt']}",
        ],
    )
    assert full_module.tokenizer.eot_id == 50256 and full["steps"] == 6
    assert resumed_module.stats.train_history == full_module.stats.train_history[3:]
    assert resumed["final_val_loss"] == full["final_val_loss"]
