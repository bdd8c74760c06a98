"""The Lightning callbacks of a training run, one job per module (conf/callbacks/default.yaml lists them).

Who owns which number: the LightningModule its loss curve (`module.stats`, a `RunStats`), the Throughput
callback tokens/s and MFU; the progress bar and the run summary only read them, and callbacks doing other
work (samples, maps, evaluations) leave its time out of tokens/s with `monitoring.not_training(trainer)`.
"""

from mini_gpt.train.callbacks.attention_maps import AttentionMaps
from mini_gpt.train.callbacks.checkpointing import (
    AtomicCheckpointIO,
    EvalCheckpoint,
    SaveOnInterrupt,
    resume_command,
)
from mini_gpt.train.callbacks.evaluate import EvaluateCallback
from mini_gpt.train.callbacks.monitoring import (
    DivergedError,
    DivergenceGuard,
    NaNGuard,
    NonFiniteLossError,
    Throughput,
    measure_cpu_matmul_flops,
    peak_flops,
)
from mini_gpt.train.callbacks.preemption import EXIT_PREEMPTED, Preempted, SaveOnPreemption
from mini_gpt.train.callbacks.progress import ProgressBar
from mini_gpt.train.callbacks.samples import SampleText
from mini_gpt.train.callbacks.summary import RunSummary, ValidateAtEnd

__all__ = [
    "EXIT_PREEMPTED",
    "AtomicCheckpointIO",
    "AttentionMaps",
    "DivergedError",
    "DivergenceGuard",
    "EvalCheckpoint",
    "EvaluateCallback",
    "NaNGuard",
    "NonFiniteLossError",
    "Preempted",
    "ProgressBar",
    "RunSummary",
    "SampleText",
    "SaveOnInterrupt",
    "SaveOnPreemption",
    "Throughput",
    "ValidateAtEnd",
    "measure_cpu_matmul_flops",
    "peak_flops",
    "resume_command",
]
