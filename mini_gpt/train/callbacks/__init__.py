"""The callbacks of a training run (conf/callbacks/default.yaml), one job each, never calling one another."""

from mini_gpt.train.callbacks.attention_maps import AttentionMaps
from mini_gpt.train.callbacks.checkpointing import AtomicCheckpointIO, EvalCheckpoint, resume_command
from mini_gpt.train.callbacks.evaluate import EvaluateCallback
from mini_gpt.train.callbacks.guard import LossGuard
from mini_gpt.train.callbacks.head_roles import HeadRoles
from mini_gpt.train.callbacks.health import Health
from mini_gpt.train.callbacks.progress import ProgressBar
from mini_gpt.train.callbacks.record import Recorder, RunRecord
from mini_gpt.train.callbacks.samples import SampleText
from mini_gpt.train.callbacks.stop import StopOnSignal
from mini_gpt.train.callbacks.throughput import Throughput, measure_cpu_matmul_flops, peak_flops

__all__ = ["AtomicCheckpointIO", "AttentionMaps", "EvalCheckpoint", "EvaluateCallback", "HeadRoles", "Health"]
__all__ += ["LossGuard", "ProgressBar", "Recorder", "RunRecord", "SampleText", "StopOnSignal", "Throughput"]
__all__ += ["measure_cpu_matmul_flops", "peak_flops", "resume_command"]
