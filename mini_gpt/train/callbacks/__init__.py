"""The Lightning callbacks of a training run, one job per module (conf/callbacks/default.yaml lists them).

    base            StepCallback: a hook once per optimizer step (not per micro-batch)
    checkpointing   AtomicCheckpointIO, EvalCheckpoint (last.ckpt at every evaluation), SaveOnInterrupt
    monitoring      NaNGuard, Throughput (tokens/s, MFU) and peak FLOP/s, not_training
    progress        ProgressBar
    samples         SampleText
    attention_maps  AttentionMaps (heatmaps of a fixed prompt)
    evaluate        EvaluateCallback (bpb / HellaSwag during training)
    summary         ValidateAtEnd, RunSummary (summary.json)

Who owns which number: the LightningModule its loss curve (`module.stats`, a `RunStats`), the Throughput
callback tokens/s and MFU; the progress bar and the run summary only read them, and callbacks doing other
work (samples, maps, evaluations) report its time with `not_training(trainer)`.
"""

from mini_gpt.train.callbacks.attention_maps import AttentionMaps
from mini_gpt.train.callbacks.base import StepCallback
from mini_gpt.train.callbacks.checkpointing import (
    AtomicCheckpointIO,
    EvalCheckpoint,
    SaveOnInterrupt,
    last_checkpoint_path,
    resume_command,
)
from mini_gpt.train.callbacks.evaluate import EvaluateCallback
from mini_gpt.train.callbacks.monitoring import (
    NaNGuard,
    NonFiniteLossError,
    Throughput,
    measure_cpu_matmul_flops,
    nonfinite_advice,
    not_training,
    peak_flops,
)
from mini_gpt.train.callbacks.progress import ProgressBar
from mini_gpt.train.callbacks.samples import SampleText
from mini_gpt.train.callbacks.summary import RunSummary, ValidateAtEnd, process_start_time

__all__ = [
    "AtomicCheckpointIO",
    "AttentionMaps",
    "EvalCheckpoint",
    "EvaluateCallback",
    "NaNGuard",
    "NonFiniteLossError",
    "ProgressBar",
    "RunSummary",
    "SampleText",
    "SaveOnInterrupt",
    "StepCallback",
    "Throughput",
    "ValidateAtEnd",
    "last_checkpoint_path",
    "measure_cpu_matmul_flops",
    "nonfinite_advice",
    "not_training",
    "peak_flops",
    "process_start_time",
    "resume_command",
]
