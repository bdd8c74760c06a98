"""Only for an older install, whose `mini_gpt_lm_eval.pth` in site-packages registers
"mini_gpt.harness:MiniGPTLM" at every start-up (delete it when you can). The command is `mini-gpt harness`."""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "MiniGPTLM":  # imported on demand: lm-eval is an optional extra and slow to import
        from mini_gpt.eval.harness import MiniGPTLM

        return MiniGPTLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
