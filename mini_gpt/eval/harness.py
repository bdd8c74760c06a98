"""Our GPT as the lm-evaluation-harness model `mini-gpt`, registered on import (docs/evaluation.md).
Trap: `get_model` imports the harness's own models only while the registry is *empty*, so registering
before `lm_eval.models` is imported would hide `hf` and all the others."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mini_gpt.errors import MiniGPTError

try:
    import lm_eval.models  # noqa: F401  # before we register: see the trap in the module docstring
    from lm_eval import simple_evaluate
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import model_registry
    from lm_eval.tasks import TaskManager
    from tqdm import tqdm
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise MiniGPTError(
        'the lm-evaluation-harness is not installed: pip install -e ".[eval]" (or pip install lm-eval)'
    ) from err

from mini_gpt.eval.scoring import continuation_logprobs, score_windows, windows
from mini_gpt.infer.device import resolve_device
from mini_gpt.infer.sampling import generate
from mini_gpt.interop.checkpoint import open_model
from mini_gpt.model.gpt import GPT
from mini_gpt.tokenizer import Tokenizer

MODEL_NAME = "mini-gpt"


def _as_int(value: Any, default: int) -> int:
    """lm-eval passes batch sizes as int, str or "auto" ("auto:N")."""
    return default if value is None or str(value).startswith("auto") else int(value)


class MiniGPTLM(TemplateLM):
    """Over `ckpt=` / `init_from=` (as the tools), or `model=` and `tokenizer=` from Python."""

    def __init__(
        self, ckpt: str | None = None, init_from: str | None = None, bpe_file: str | None = None,
        model: GPT | None = None, tokenizer: Tokenizer | None = None, device: str | None = None,
        batch_size: Any = 16, stride: Any = None, max_gen_toks: Any = 256, seed: Any = 1234, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__()
        if device in ("cuda", "cuda:0") and not torch.cuda.is_available():  # the lm_eval CLI's default
            print("warning: device=cuda but torch sees no CUDA GPU; running on the CPU", file=sys.stderr)
            device = "auto"
        self._device = resolve_device(device or "auto")
        if model is None:
            model, tokenizer = open_model(ckpt, init_from, bpe_file, self._device)
        elif tokenizer is None:
            raise MiniGPTError("MiniGPTLM(model=...) also needs tokenizer=...")
        self.model = model.to(self._device).eval()
        self.tok = tokenizer
        self.batch_size = _as_int(batch_size, 16)
        self.block_size = model.config.block_size
        self.stride = _as_int(stride, self.block_size)
        self.max_gen_toks = _as_int(max_gen_toks, 256)
        self.seed = _as_int(seed, 1234)

    @property
    def eot_token_id(self) -> int:
        """Also lm-eval's prefix for an empty context: end-of-text, else a newline (a character model)."""
        return self.tok.start_id

    @property
    def max_length(self) -> int:
        return self.block_size

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tok.encode_ordinary(self.tok.known_text(string))

    def tok_decode(self, tokens: Sequence[int], **kwargs: Any) -> str:
        return self.tok.decode(list(tokens))

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]], disable_tqdm: bool = False,
        **kw: Any,
    ) -> list[tuple[float, bool]]:  # fmt: skip
        # Longest first: similar lengths share a batch, and an out-of-memory error shows up at once.
        order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))
        results: list[tuple[float, bool]] = [(0.0, True)] * len(requests)
        with tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="loglikelihood") as bar:
            for b in range(0, len(order), self.batch_size):
                chunk = [i for i in order[b : b + self.batch_size] if requests[i][2]]  # empty: (0, True)
                pairs = [(requests[i][1] or [self.prefix_token_id], requests[i][2]) for i in chunk]
                for i, score in zip(chunk, continuation_logprobs(self.model, pairs, len(pairs) or 1)):
                    results[i] = (score.logprob, score.is_greedy)
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], results[i])
                bar.update(len(order[b : b + self.batch_size]))
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        out = []
        for req in tqdm(requests, disable=disable_tqdm or self.rank != 0, desc="loglikelihood_rolling"):
            (text,) = req.args
            ids = [self.prefix_token_id, *self.tok_encode(text)]
            wins = list(windows(ids, self.block_size, self.stride))  # none for an empty text: 0.0
            total = score_windows(self.model, wins, self.batch_size)[0].nll
            out.append(-total)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), -total)
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        out = []
        generator = torch.Generator(device=self._device).manual_seed(self.seed)
        eot = self.tok.eot_id
        for req in tqdm(requests, disable=disable_tqdm or self.rank != 0, desc="generate_until"):
            context, gen_kwargs = req.args
            kwargs = gen_kwargs or {}
            until = kwargs.get("until") or []
            until = [s for s in ([until] if isinstance(until, str) else until) if s]
            new: list[int] = []

            def stop(token: torch.Tensor, new: list[int] = new, until: list[str] = until) -> bool:
                new.append(int(token[0]))
                return new[-1] == eot or any(s in self.tok_decode(new) for s in until)

            idx = torch.tensor([self.tok_encode(context) or [self.prefix_token_id]], device=self._device)
            top_k, top_p = kwargs.get("top_k"), kwargs.get("top_p")
            generate(
                self.model, idx, _as_int(kwargs.get("max_gen_toks"), self.max_gen_toks),
                temperature=float(kwargs.get("temperature") or 0.0) if kwargs.get("do_sample") else 0.0,
                top_k=int(top_k) if top_k else None, top_p=float(top_p) if top_p else None,
                generator=generator, stream=stop,
            )  # fmt: skip
            text = self.tok_decode(new[:-1] if new and new[-1] == eot else new)
            for s in until:
                text = text.split(s)[0]
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out

    def get_model_info(self) -> dict[str, Any]:
        params = self.model.num_params(non_embedding=False)
        return {"model_num_parameters": params, "block_size": self.block_size}


def _metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """{"acc,none": 0.5, "acc_stderr,none": 0.1, "alias": ...} -> {"acc": 0.5, "acc_stderr": 0.1}."""
    numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return {key.removesuffix(",none"): value for key, value in numbers.items()}


def run_harness(
    model: GPT, tokenizer: Tokenizer, tasks: Sequence[str], limit: float | None = None,
    num_fewshot: int | None = None, batch_size: int = 16, include_path: str | None = None, seed: int = 1234,
    builtin_tasks: bool = True,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """{task: {metric: value}} of lm-eval's tasks on our model."""
    include = str(Path(include_path).expanduser()) if include_path else None
    if include is not None and not Path(include).exists():
        raise MiniGPTError(f"harness.include_path={include_path} does not exist")
    manager = TaskManager(include_path=include, include_defaults=builtin_tasks)
    if missing := [t for t in tasks if t not in manager.all_tasks]:
        raise MiniGPTError(
            f"unknown lm-eval task(s) {missing}; list them with `lm_eval ls tasks`, or pass your own "
            "task YAMLs with harness.include_path=DIR"
        )
    lm = MiniGPTLM(model=model, tokenizer=tokenizer, batch_size=batch_size, seed=seed)
    try:
        res = simple_evaluate(
            model=lm, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit, task_manager=manager,
            random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
            log_samples=False, bootstrap_iters=0,
        )  # fmt: skip
    except (ConnectionError, OSError) as err:
        raise MiniGPTError(
            f"lm-eval could not load the task data ({type(err).__name__}: {str(err)[:200]}); offline, "
            "write a task YAML over local files (data_files: a dict of splits) and pass harness.include_path"
        ) from None
    return {task: _metrics(metrics) for task, metrics in (res or {}).get("results", {}).items()}


def register() -> None:
    """A no-op when the name is taken: this file can run twice in one process ("already registered")."""
    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME)(MiniGPTLM)


register()
