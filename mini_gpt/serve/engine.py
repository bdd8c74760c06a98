"""The model side of `mini-gpt serve` (no web framework): one generation at a time on one worker thread,
seeded as `mini-gpt generate` seeds it, so that the same settings give the same text."""

from __future__ import annotations

import queue
import secrets
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.device import autocast_context
from mini_gpt.infer.packing import can_pack, prepare_for_inference
from mini_gpt.infer.sampling import check_sampling_args, generate
from mini_gpt.infer.stream import TextStream, encode_prompt, token_text
from mini_gpt.inspect.heads import head_roles
from mini_gpt.inspect.lens import depth_probs
from mini_gpt.tokenizer import Tokenizer


def prompt_groups(tokenizer: Any, ids: list[int]) -> list[dict[str, Any]]:
    """The prompt as the page shows it: runs of ids that make whole characters, with their text."""
    stream, groups, run = TextStream(tokenizer, []), [], []
    for k, i in enumerate(ids, 1):
        run.append(i)
        piece = stream.push(i) + (stream.flush() if k == len(ids) else "")
        if piece or k == len(ids):
            groups.append({"ids": run, "texts": [token_text(tokenizer, t) for t in run], "text": piece})
            run = []
    return groups


@dataclass
class Step:
    """One sampled token of one sample (`row`), as the clients see it."""

    row: int
    token: int
    logprob: float  # before temperature and top-k/top-p
    top: list[tuple[int, float]]  # (id, logprob) of the most likely tokens, best first
    text: str  # the printable text this token releases ("" while half a character is held back)


CANCELLED = "cancelled"  # a row's finish when `cancel` cut it short (the app never sends it as a reason)


@dataclass
class Job:
    """One request: `emit(step)` runs on the worker thread for every token, `done(error)` once at the end
    (None on success); `cancel` stops it at its next token, or before it starts."""

    ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int = 1
    stops: list[str] = field(default_factory=list)
    top_logprobs: int = 0
    logprobs: bool = True  # False: steps carry no log-probabilities (logprob 0.0, top []): a little faster
    emit: Callable[[Step], None] = lambda step: None
    done: Callable[[BaseException | None], None] = lambda error: None
    cancel: threading.Event = field(default_factory=threading.Event)
    # filled in by the engine
    streams: list[TextStream] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)  # per row: "stop", "length" or CANCELLED


class Engine:
    def __init__(
        self, model: nn.Module, tokenizer: Tokenizer, device: torch.device, dtype: str = "auto"
    ) -> None:
        self.tokenizer, self.device, self.config = tokenizer, device, model.config
        self.amp: Any = autocast_context(device, dtype)
        weights = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
        if weights is not None and can_pack(device, weights):
            # As `mini-gpt generate` does on a CPU: weights packed once (in place) instead of autocast.
            model, self.amp = prepare_for_inference(model, weights), nullcontext()
        self.model = model.eval()  # never trained here: `attention` and `lens` read it without dropout
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._busy = threading.Lock()  # held while a job runs (also by `attention`, `lens`, `heads`)
        self._head_roles: dict[str, Any] | None = None  # computed once: the model never changes
        self.waiting = 0  # jobs queued or running
        self.stopping = False  # cancel_all was called: jobs submitted from now on are cancelled at once
        self._events: dict[int, threading.Event] = {}  # their cancel events, for cancel_all
        self._count_lock = threading.Lock()
        self._worker = threading.Thread(target=self._work, name="mini-gpt-serve", daemon=True)
        self._worker.start()

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return encode_prompt(self.tokenizer, prompt)
        vocab = self.config.vocab_size
        bad = [i for i in prompt if not 0 <= i < vocab]
        if bad or not prompt:
            raise MiniGPTError(
                f"prompt token ids must be 0..{vocab - 1} and not empty, got {bad[:3] or '[]'}"
            )
        return list(prompt)

    def submit(self, job: Job) -> None:
        """Queue `job`; a bad setting raises here, not on the worker."""
        check_sampling_args(job.temperature, job.top_k, job.top_p)
        with self._count_lock:
            self.waiting += 1
            self._events[id(job)] = job.cancel
            if self.stopping:
                job.cancel.set()
        self._jobs.put(job)

    def cancel_all(self) -> None:
        """The server stops: end the running job at its next token, the queued ones before they start."""
        with self._count_lock:
            self.stopping = True
            for event in self._events.values():
                event.set()

    def close(self) -> None:
        """Stop the worker after the job it runs (callers cancel their jobs first)."""
        self._jobs.put(None)
        self._worker.join(timeout=10)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            error: BaseException | None = None
            try:
                if job.cancel.is_set():  # its client left, or the server stops, before it started
                    job.finish = [CANCELLED] * job.n
                else:
                    with self._busy:
                        self._run(job)
            except BaseException as err:  # reported to the client, never kills the worker
                error = err
            finally:
                with self._count_lock:
                    self.waiting -= 1
                    self._events.pop(id(job), None)
            job.done(error)

    def _run(self, job: Job) -> None:
        seed = job.seed if job.seed is not None else secrets.randbelow(2**31)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        job.streams = [TextStream(self.tokenizer, job.stops) for _ in range(job.n)]
        last: list[Tensor] = []  # the logits of the latest model call's last position, as generate got them

        def keep_last(_module: nn.Module, _args: Any, out: Tensor) -> None:  # the output head's (B, T, V)
            last[:] = [out[:, -1, :]]

        def on_token(token: Tensor) -> bool:
            chosen, alternatives = [0.0] * job.n, [[] for _ in range(job.n)]
            if job.logprobs:
                logprobs = torch.log_softmax(last[-1].float(), dim=-1).expand(job.n, -1)  # (n, V)
                chosen = logprobs.gather(1, token[:, None])[:, 0].tolist()
                best, best_ids = logprobs.topk(min(max(1, job.top_logprobs), logprobs.shape[-1]), dim=-1)
                alternatives = [list(zip(i, lp)) for i, lp in zip(best_ids.tolist(), best.tolist())]
            for row, (t, stream) in enumerate(zip(token.tolist(), job.streams, strict=True)):
                if stream.stopped:
                    continue
                job.emit(Step(row, t, chosen[row], alternatives[row], stream.push(t)))
            return job.cancel.is_set() or all(s.stopped for s in job.streams)

        idx = torch.tensor([job.ids], dtype=torch.long, device=self.device)
        hook = self.model.lm_head.register_forward_hook(keep_last)
        try:
            with self.amp:
                generate(
                    self.model, idx, job.max_tokens, temperature=job.temperature, top_k=job.top_k,
                    top_p=job.top_p, generator=generator, num_samples=job.n, stream=on_token,
                )  # fmt: skip
        finally:
            hook.remove()
        cut = job.cancel.is_set()
        job.finish = [
            "stop" if s.stopped else CANCELLED if cut and s.tokens < job.max_tokens else "length"
            for s in job.streams
        ]
        for row, stream in enumerate(job.streams):
            if rest := stream.flush():
                job.emit(Step(row, -1, 0.0, [], rest))  # held-back bytes at the end: text only

    def _window(self, ids: list[int], position: int) -> tuple[int, Tensor]:
        """(start, ids[start : position + 1] as (1, S)): the last block_size tokens up to `position`."""
        if not 0 <= position < len(ids):
            raise MiniGPTError(f"position={position} is outside the {len(ids)} tokens")
        start = max(0, position + 1 - self.config.block_size)
        return start, torch.tensor([ids[start : position + 1]], dtype=torch.long, device=self.device)

    @torch.no_grad()
    def attention(self, ids: list[int], position: int) -> dict[str, Any]:
        """What token `position` of `ids` attended to: weights[layer][head][j] over the keys `start + j`."""
        start, idx = self._window(ids, position)
        self.encode(ids)  # range check
        with self._busy, self.amp:
            attentions = self.model.attention_weights(idx)
        weights = [att[0, :, -1, :].float().cpu().tolist() for att in attentions]  # (nh, S) per layer
        return {"start": start, "position": position, "weights": weights}

    @torch.no_grad()
    def lens(self, ids: list[int], position: int | None, k: int) -> dict[str, Any]:
        """The logit lens (docs/serve.md) at `position` (its last block_size tokens, as `attention`), or at
        every position of `ids`, which must then fit the context."""
        self.encode(ids)  # range check
        if position is None and len(ids) > self.config.block_size:
            raise MiniGPTError(
                f"The text has {len(ids)} tokens, more than the model's context of {self.config.block_size}; "
                "send a position to read one token of a longer text"
            )
        positions = list(range(len(ids))) if position is None else [position]
        start, idx = self._window(ids, positions[-1])  # a whole text that fits: start 0
        rows = torch.tensor(positions, device=self.device) - start
        following = [ids[p + 1] if p + 1 < len(ids) else None for p in positions]
        with self._busy, self.amp:
            depths = []  # per depth: (top probs, top ids, next-token probs), each (P, k) or (P,)
            known = torch.tensor([t or 0 for t in following], device=self.device)
            for probs in depth_probs(self.model, idx, rows):  # (P, vocab)
                best, best_ids = probs.topk(min(k, probs.shape[-1]), dim=-1)
                following_p = probs.gather(1, known[:, None])[:, 0]
                depths.append((best.tolist(), best_ids.tolist(), following_p.tolist()))

        def token(t: int, **more: Any) -> dict[str, Any]:
            return {"id": t, "text": token_text(self.tokenizer, t), **more}

        def entry(i: int, p: int) -> dict[str, Any]:
            nxt = following[i]
            layers = [
                {
                    "top": [token(t, prob=round(q, 5)) for t, q in zip(top_id[i], top_p[i])],
                    "next_prob": None if nxt is None else round(next_p[i], 5),
                }
                for top_p, top_id, next_p in depths
            ]
            after = None if nxt is None else token(nxt)
            return {"position": p, **token(ids[p]), "next": after, "layers": layers}

        names = ["embedding", *(f"block {layer}" for layer in range(self.config.n_layer))]
        return {"start": start, "depths": names, "positions": [entry(i, p) for i, p in enumerate(positions)]}

    def heads(self) -> dict[str, Any]:
        """Every head's role scores (mini_gpt.inspect.heads) on 8 repeated random sequences (seed 0), kept."""
        if self._head_roles is not None:
            return self._head_roles
        if (half := min(self.config.block_size // 2, 100)) < 2:
            block = self.config.block_size
            raise MiniGPTError(f"head roles need a context of at least 4 tokens; this model's is {block}")
        with self._busy, self.amp:
            if self._head_roles is None:  # (another request may have computed them while this one waited)
                roles = head_roles(self.model, half, batch=8, seed=0).as_dict()
                rounded = {role: [[round(v, 5) for v in row] for row in rows] for role, rows in roles.items()}
                self._head_roles = {"half": half, "sequences": 8, "seed": 0, "roles": rounded}
            return self._head_roles
