"""Only for an older install: its `install-hook` wrote `mini_gpt_lm_eval.pth` into site-packages, which
registers `mini-gpt` as "mini_gpt.harness:MiniGPTLM" at every start-up; without this name that file would
break every harness run (delete it when you can). The command is `mini-gpt harness`; this module no longer
runs as `python -m mini_gpt.harness`.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "MiniGPTLM":  # imported on demand: lm-eval is an optional extra and slow to import
        from mini_gpt.eval.harness import MiniGPTLM

        return MiniGPTLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
