"""Multi-device training: trainer=ddp / trainer=fsdp configs, global batch, and DDP through `python train.py`.

The slow test runs `python train.py trainer=ddp trainer.accelerator=cpu trainer.devices=2` (Lightning
re-launches train.py for rank 1; gloo on CPU) next to a one-process run with the same global batch of
1,024 tokens (1 device x 2 accumulated micro-batches vs 2 devices x 1), and compares them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

STEPS = 8
GLOBAL_TOKENS = 1024  # = 8 sequences x 64 tokens x (2 devices x 1 micro-batch | 1 device x 2 micro-batches)


def _trainer(trainer_cfg: Any, global_batch_tokens: int | None = None) -> Any:
    """The Trainer a config describes, built as train() builds it (no fit: DDP processes start only in
    fit): the batch layout of 8 x 64-token micro-batches, float32 for a 32-wide model."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from mini_gpt.train.distributed import batch_layout
    from mini_gpt.train.run import trainer_arguments

    OmegaConf.update(trainer_cfg, "default_root_dir", "unused")  # ${paths.run_dir}: a Hydra job's
    layout = batch_layout(OmegaConf.to_object(trainer_cfg), 8, 64, global_batch_tokens)
    arguments = trainer_arguments(trainer_cfg, layout, trainer_cfg.max_steps, "32-true")
    return instantiate(arguments, logger=False, enable_checkpointing=False, callbacks=[])


def test_ddp_config_composes_and_instantiates(compose: Any) -> None:
    from hydra.utils import instantiate
    from lightning.pytorch.strategies import DDPStrategy

    cfg = compose(["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"])
    # extends trainer/default.yaml: its keys are still there
    assert cfg.trainer.max_steps == compose([]).trainer.max_steps
    assert cfg.trainer._target_ == "lightning.pytorch.Trainer"
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, DDPStrategy)
    assert strategy._ddp_kwargs == {"find_unused_parameters": False, "gradient_as_bucket_view": True}
    assert strategy._start_method == "popen"
    assert strategy._process_group_backend is None  # Lightning picks gloo (CPU) / nccl (CUDA)


def test_ddp_trainer_on_two_cpu_processes_uses_gloo(compose: Any) -> None:

    cfg = compose(["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.num_nodes=1"])
    trainer = _trainer(cfg.trainer)
    assert trainer.world_size == 2
    assert trainer.num_devices == 2
    assert trainer.strategy._get_process_group_backend() == "gloo"


def test_fsdp_config_composes_and_instantiates(compose: Any) -> None:
    from hydra.utils import instantiate
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import ShardingStrategy

    from mini_gpt.model.gpt import Block

    cfg = compose(["trainer=fsdp", "trainer.strategy.activation_checkpointing=true"])
    assert cfg.trainer.accelerator == "gpu"
    assert cfg.trainer.precision == "bf16-mixed"
    strategy = instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {Block}
    assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {Block}
    assert strategy.sharding_strategy == ShardingStrategy.FULL_SHARD

    hybrid = instantiate(
        compose(["trainer=fsdp", "trainer.strategy.sharding_strategy=HYBRID_SHARD"]).trainer.strategy
    )
    assert hybrid.sharding_strategy == ShardingStrategy.HYBRID_SHARD
    assert hybrid._activation_checkpointing_kwargs == {}


def test_fsdp_is_refused_on_cpu() -> None:
    """Why FSDP is not run on this machine: Lightning refuses it without CUDA (torch's FSDP does too)."""
    import lightning as L

    from mini_gpt.train.distributed import fsdp_strategy

    with pytest.raises(ValueError, match="requires a GPU accelerator"):
        L.Trainer(accelerator="cpu", devices=2, strategy=fsdp_strategy(), logger=False)


def test_global_batch_tokens_sets_accumulation(compose: Any) -> None:
    from omegaconf import OmegaConf

    from mini_gpt.errors import MiniGPTError
    from mini_gpt.train.distributed import batch_layout

    cfg = compose(["model=tiny", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"])
    OmegaConf.update(cfg, "trainer.default_root_dir", "unused")
    layout = batch_layout(OmegaConf.to_object(cfg.trainer), 8, 64, global_batch_tokens=4096)
    assert layout.accumulate == 4  # 4096 / (8 x 64 x 2)
    assert layout.tokens_per_step == 4096
    trainer = _trainer(cfg.trainer, global_batch_tokens=4096)
    assert trainer.world_size == layout.world_size == 2  # what batch_layout counted before the Trainer
    assert trainer.accumulate_grad_batches == 4
    assert trainer.val_check_interval == cfg.trainer.val_check_interval * 4  # counted in micro-batches
    with pytest.raises(MiniGPTError, match="not a multiple"):
        batch_layout(OmegaConf.to_object(cfg.trainer), 8, 64, global_batch_tokens=1000)

    # no global batch: the configured accumulation stands
    kept = batch_layout(OmegaConf.to_object(cfg.trainer), 8, 64, global_batch_tokens=None)
    assert (kept.accumulate, kept.world_size, kept.tokens_per_step) == (1, 2, 1024)


def test_multirun_with_multi_device_strategies_is_refused(compose: Any) -> None:
    """In a sweep trial, DDP re-running the script would make rank 1 run the whole sweep, and ddp_spawn
    leaves the trial process without steps/val losses (measured: summary steps=0, no val loss)."""
    from mini_gpt.errors import MiniGPTError
    from mini_gpt.train import run as train

    base = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]
    for extra in ([], ["trainer.strategy.start_method=spawn"]):
        trainer = _trainer(compose([*base, *extra]).trainer)
        with pytest.raises(MiniGPTError, match="one device per trial"):
            train.check_world(trainer, 2, multirun=True)
        train.check_world(trainer, 2, multirun=False)  # a single run is fine
        with pytest.raises(MiniGPTError, match="gives 1 processes but Lightning started 2"):
            train.check_world(trainer, 1, multirun=False)
    one_device = _trainer(compose(["trainer.accelerator=cpu"]).trainer)
    train.check_world(one_device, 1, multirun=True)


# ---- DDP end to end ---------------------------------------------------------------------------------

# The one-process reference must see the same micro-batches as the DDP ranks. Train batch i of rank r is
# drawn from (seed, r, i), so DDP step s uses batch s of rank 0 and batch s of rank 1, while a plain
# one-process run with accumulation would use batches 2s and 2s+1 of rank 0. This wrapper maps the
# one-process micro-batch j to (rank j % 2, index j // 2): the same data, in accumulation order.
SINGLE_WRAPPER = """
import runpy, sys
from mini_gpt.data import datamodule

WORLD = 2
original = datamodule.TrainBatches.batch

def interleaved(self, index):
    own_rank, self.rank = self.rank, index % WORLD
    try:
        return original(self, index // WORLD)
    finally:
        self.rank = own_rank

datamodule.TrainBatches.batch = interleaved
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _common(data_dir: Path, shakespeare: Path) -> list[str]:
    return [
        "model=tiny",
        f"data.path={shakespeare}",
        f"data.data_dir={data_dir}",
        "loader.batch_size=8",
        "loader.val_windows=16",  # a quick validation; ranks split the windows (k to rank k % 2), none twice
        f"global_batch_tokens={GLOBAL_TOKENS}",
        f"trainer.max_steps={STEPS}",
        f"trainer.val_check_interval={STEPS}",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1",
        "callbacks.sample_text=null",
        "optim=adamw",  # the data-parallel check; Muon's bf16 Newton-Schulz would add its own rounding
        "optim.lr=1e-2",  # large steps: runs that saw different data end up visibly apart
        "optim.warmup_steps=0",
        "seed=4321",
    ]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "MASTER_PORT"}
    env.update(NETRC=str(home / "no-netrc"), PYTHONPATH=str(REPO), WANDB_SILENT="true", **extra)
    return env


def test_ddp_two_cpu_processes_match_one_process(
    tmp_path: Path, shakespeare_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import torch

    from mini_gpt.data import DataConfig, prepare_data

    data_dir = tmp_path_factory.getbasetemp() / "mini_gpt_char_cache"
    prepare_data(DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(data_dir)))
    common = _common(data_dir, shakespeare_path)
    ddp_dir, single_dir = tmp_path / "ddp", tmp_path / "single"
    # Both runs at once (3 processes on 2 cores): they are independent and deterministic.
    ddp = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *common, "trainer=ddp", "trainer.devices=2",
         "logger=wandb", f"hydra.run.dir={ddp_dir}"],
        cwd=tmp_path, env=_env(tmp_path, WANDB_MODE="offline"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    single = subprocess.Popen(
        [sys.executable, "-c", SINGLE_WRAPPER, str(REPO / "train.py"), *common, "trainer.devices=1",
         "logger=none", f"hydra.run.dir={single_dir}"],
        cwd=tmp_path, env=_env(tmp_path, WANDB_MODE="disabled"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        ddp_out, _ = ddp.communicate(timeout=240)
        single_out, _ = single.communicate(timeout=240)
    finally:
        for proc in (ddp, single):
            if proc.poll() is None:
                proc.kill()
    assert ddp.returncode == 0, ddp_out[-4000:]
    assert single.returncode == 0, single_out[-4000:]

    # Rank 0 alone prints; both layouts give the same 1,024-token global batch.
    assert ddp_out.count("summary: ") == 1
    assert ddp_out.count("tokens per optimizer step") == 1
    assert "8 micro-batch x 1 accumulate x 2 devices x 1 nodes x 64 block_size = 1,024" in ddp_out
    assert "8 micro-batch x 2 accumulate x 1 devices x 1 nodes x 64 block_size = 1,024" in single_out
    for rank in (0, 1):  # Lightning's line of each rank, once (Hydra's root handler does not repeat it)
        assert ddp_out.count(f"Initializing distributed: GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2") == 1

    # One output dir for both ranks, rank 0's console as its train.log (rank 1 records none), one W&B run.
    assert sorted(p.name for p in ddp_dir.glob("*.log")) == ["train.log"]
    assert (ddp_dir / "train.log").read_text().count("summary: ") == 1
    assert (ddp_dir / ".hydra" / "config.yaml").is_file()
    wandb_runs = sorted((ddp_dir / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 1, wandb_runs
    # offline runs keep the config only in the run's record file, as JSON per top-level key
    records = next(wandb_runs[0].glob("run-*.wandb")).read_bytes()
    assert b'"accumulate":1,"devices":2,"num_nodes":1,"world_size":2' in records
    assert b'"tokens_per_step":1024' in records

    ddp_summary = json.loads((ddp_dir / "summary.json").read_text())
    single_summary = json.loads((single_dir / "summary.json").read_text())
    for summary in (ddp_summary, single_summary):
        assert summary["steps"] == STEPS
        assert summary["tokens"] == STEPS * GLOBAL_TOKENS
        assert summary["final_val_loss"] < math.log(65) - 0.4  # it trained: ~4.17 at init, ~3.52 here
    # Same data, same seed, same global batch: the two runs compute the same averaged gradient up to
    # float32 summation order (DDP's gloo all-reduce adds g0/2 + g1/2 in its buckets, the one-process run
    # accumulates them into .grad; matmuls split over 1 vs 2 threads), which perturbs the loss at the
    # ~1e-7 level after 8 AdamW steps (measured 2.4e-7); 1e-4 leaves room, while the same run on the
    # un-interleaved batches (same global batch size, different data) ends 3.6e-3 away.
    assert abs(ddp_summary["final_val_loss"] - single_summary["final_val_loss"]) < 1e-4

    ddp_state = torch.load(ddp_summary["last_ckpt"], map_location="cpu", weights_only=True)["state_dict"]
    single_state = torch.load(single_summary["last_ckpt"], map_location="cpu", weights_only=True)[
        "state_dict"
    ]
    assert ddp_state.keys() == single_state.keys()
    max_diff = max((ddp_state[k].float() - single_state[k].float()).abs().max().item() for k in ddp_state)
    assert max_diff < 2e-4, max_diff  # measured 7e-6; different batches: 8e-2


def test_multirun_allows_ranks_started_by_slurm(compose: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """hydra/launcher=slurm: SLURM starts one task per device and Lightning joins them, no re-run."""
    for key, value in {
        "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "1",
        "SLURM_NODELIST": "node1", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
    }.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    # Building a Trainer as rank 1 sets Lightning's process-global rank_zero_only.rank; undo it afterwards
    # or every later test in this process would stop logging and checkpointing.
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", rank_zero_only.rank)
    from mini_gpt.train import run as train
    from mini_gpt.train.distributed import launcher_rank, local_rank

    assert (launcher_rank(), local_rank()) == (1, 1)  # known before the Trainer (data preparation, printing)
    trainer = _trainer(compose(["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]).trainer)
    assert trainer.strategy.cluster_environment.creates_processes_externally
    assert (trainer.global_rank, trainer.local_rank) == (1, 1)
    train.check_world(trainer, 2, multirun=True)


def test_a_dead_rank_ends_the_run_with_one_line_and_the_resume_command(
    tmp_path: Path, shakespeare_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """kill -9 of rank 1 in `trainer=ddp` (2 CPU processes): rank 0 stops within seconds with one line
    naming the rank and the resume command (no Hydra report, no traceback), and no process is left."""
    import signal
    import time

    import psutil

    from mini_gpt.data import DataConfig, prepare_data

    data_dir = tmp_path_factory.getbasetemp() / "mini_gpt_char_cache"
    prepare_data(DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(data_dir)))
    run_dir = tmp_path / "ddp"
    args = [*_common(data_dir, shakespeare_path), "trainer.max_steps=100000", "trainer.val_check_interval=2"]
    rank0 = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args, "trainer=ddp", "trainer.devices=2", "logger=none",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=_env(tmp_path, WANDB_MODE="disabled"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        last = run_dir / "checkpoints" / "last.ckpt"
        deadline = time.monotonic() + 240
        while not last.exists() and time.monotonic() < deadline and rank0.poll() is None:
            time.sleep(0.05)
        assert last.exists(), "the DDP run never saved a checkpoint"
        (rank1,) = psutil.Process(rank0.pid).children()
        rank1.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = rank0.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        if rank0.poll() is None:
            rank0.kill()
    assert rank0.returncode == 2, stderr[-3000:]
    assert took < 10, took  # within seconds (measured 1.7 s)
    assert "Traceback" not in stderr and "Error executing job" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: rank 1 (pid {rank1.pid}, killed by signal 9) died during step "), line
    assert "; resume from the last checkpoint with: " in line  # python (or this interpreter) train.py ...
    assert line.endswith(f"{REPO / 'train.py'} ckpt_path={last}")
    assert not psutil.pid_exists(rank1.pid) or rank1.status() == psutil.STATUS_ZOMBIE


def test_sigterm_to_rank_0_stops_both_ranks_after_the_same_step(
    tmp_path: Path, shakespeare_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Preemption of a DDP run where only rank 0 gets the signal: the ranks agree at the next log
    interval, rank 0 writes last.ckpt at that step for both, both exit with status 75, one line says so."""
    import signal
    import time

    import psutil
    import torch

    from mini_gpt.data import DataConfig, prepare_data

    data_dir = tmp_path_factory.getbasetemp() / "mini_gpt_char_cache"
    prepare_data(DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(data_dir)))
    run_dir = tmp_path / "ddp"
    args = [*_common(data_dir, shakespeare_path), "trainer.max_steps=100000", "trainer.val_check_interval=2"]
    args += ["trainer.log_every_n_steps=3"]
    rank0 = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args, "trainer=ddp", "trainer.devices=2", "logger=none",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=_env(tmp_path, WANDB_MODE="disabled"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        last = run_dir / "checkpoints" / "last.ckpt"
        deadline = time.monotonic() + 240
        while not last.exists() and time.monotonic() < deadline and rank0.poll() is None:
            time.sleep(0.05)
        assert last.exists(), "the DDP run never saved a checkpoint"
        (rank1,) = psutil.Process(rank0.pid).children()
        rank0.send_signal(signal.SIGTERM)
        _, stderr = rank0.communicate(timeout=60)
        rank1.wait(timeout=60)  # rank 1 stopped too (not our child: its status is not ours to read)
    finally:
        if rank0.poll() is None:
            rank0.kill()
    assert rank0.returncode == 75, stderr[-3000:]
    assert "Traceback" not in stderr and "Error executing job" not in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    step = summary["steps"]
    assert summary["status"] == "preempted" and step % 3 == 0  # at a log interval: where the ranks agree
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == step
    assert stderr.count("preempted by SIGTERM") == 1  # rank 0 alone says so
    assert stderr.strip().splitlines()[-1] == (
        f"preempted by SIGTERM: stopped after step {step}, last.ckpt saved (summary.json status preempted, "
        "exit status 75)"
    )


def test_sigterm_to_rank_0_mid_accumulation_stops_both_ranks_at_the_same_micro_batch(
    tmp_path: Path, shakespeare_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """DDP with 2 micro-batches a step: rank 0 alone gets SIGTERM as micro-batch 7 (step 4's first) begins;
    the ranks agree every 3 micro-batches (log_every_n_steps), so both stop after micro-batch 9, step 5's
    first, mid-step; rank 0 writes last.ckpt at step 4 for both, status 75, one line says so."""
    import torch

    from mini_gpt.data import DataConfig, prepare_data

    data_dir = tmp_path_factory.getbasetemp() / "mini_gpt_char_cache"
    prepare_data(DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(data_dir)))
    run_dir = tmp_path / "ddp"
    args = [*_common(data_dir, shakespeare_path), "global_batch_tokens=2048", "trainer.log_every_n_steps=3"]
    args += ["+callbacks.preempt._target_=helpers.signal_at_step", "+callbacks.preempt.step=4"]
    args += ["+callbacks.preempt.micro_batch=1", "+callbacks.preempt.rank=0"]
    env = _env(tmp_path, WANDB_MODE="disabled")
    env["PYTHONPATH"] += os.pathsep + str(REPO / "tests")  # helpers.signal_at_step in the ranks
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args, "trainer=ddp", "trainer.devices=2", "logger=none",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr
    assert "2 accumulate x 2 devices" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["steps"]) == ("preempted", 4)
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 4
    assert proc.stderr.count("preempted by SIGTERM") == 1  # rank 0 alone says so
    assert proc.stderr.strip().splitlines()[-1] == (
        "preempted by SIGTERM: stopped mid-step (micro-batch 1 of 2 of step 5, which a resume redoes), "
        "last.ckpt saved at step 4 (summary.json status preempted, exit status 75)"
    )
