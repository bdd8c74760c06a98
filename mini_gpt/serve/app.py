"""The HTTP side of `mini-gpt serve`: the playground page and an OpenAI-compatible API (FastAPI).

    GET  /                  the playground (static/index.html, app.js, style.css: no build step, no CDN)
    GET  /health            {"status": "ok", "model": ..., "waiting": jobs queued or running}
    GET  /v1/models         the one model, as OpenAI lists models
    POST /v1/completions    OpenAI's (legacy) completions: prompt, max_tokens, temperature, top_p, top_k,
                            stop, seed, n, stream (server-sent events), logprobs (0..5)
    GET  /api/info          the model's shape and tokenizer, for the page
    POST /api/generate      the page's stream: every token with its probability and top-5 alternatives
    POST /api/attention     what one position attended to, per layer and head

Every error is a 4xx (5xx only for a bug) with OpenAI's body, `{"error": {"message": one sentence, "type",
"param", "code"}}`, never a traceback. Requests wait in the engine's queue (one generation at a time);
a streaming client that goes away cancels its job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.sampling import check_sampling_args
from mini_gpt.serve.engine import Engine, Job, Step, prompt_groups, token_text

STATIC = Path(__file__).parent / "static"
log = logging.getLogger("mini_gpt.serve")

Int = Annotated[int, Field(strict=True)]
Float = Annotated[float, Field(strict=True)]  # strict floats still take ints (1 for 1.0)
Bool = Annotated[bool, Field(strict=True)]


@dataclass
class Limits:
    """What one request may ask for (conf/serve.yaml)."""

    max_tokens: int = 1024
    max_prompt_tokens: int = 4096
    max_n: int = 8
    max_waiting: int = 64


class ApiError(Exception):
    """A request the server refuses: HTTP `status` and one sentence."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def sentence(err: BaseException | str) -> str:
    """A MiniGPTError's one line as a sentence (a full stop at the end)."""
    text = str(err).strip()
    return text if text.endswith((".", "?", "!")) else text + "."


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


class CompletionRequest(BaseModel):
    """POST /v1/completions; unknown keys (user, ...) are ignored, unsupported features refused."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[Int] | list[str] = ""
    max_tokens: Int | None = 16
    temperature: Float | None = 1.0
    top_p: Float | None = 1.0
    top_k: Int | None = None  # not OpenAI's: mini-gpt generate's top_k
    n: Int | None = 1
    stream: Bool | None = False
    logprobs: Int | None = None
    stop: str | list[str] | None = None
    seed: Int | None = None
    echo: Bool | None = False
    presence_penalty: Float | None = 0.0
    frequency_penalty: Float | None = 0.0
    best_of: Int | None = None


class PageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = ""
    max_tokens: Int = 64
    temperature: Float = 0.8
    top_k: Int | None = 200
    top_p: Float | None = None
    seed: Int | None = 1337


class AttentionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[Int]
    position: Int


class _Done:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error


FLUSH_S = 0.02  # a token waits at most this long, or one token more, before it is sent (run_job)


async def run_job(engine: Engine, job: Job) -> AsyncIterator[list[Step]]:
    """The steps of `job` as it runs on the engine's worker, in batches. Leaving early (a client that
    disconnects cancels the task reading this) cancels the job.

    The worker wakes the event loop for a step only when FLUSH_S has passed since the last wake-up (and
    always for the first step and at the end); the steps in between wait in a list. Waking the loop for
    every token of a fast model costs more than the token: each wake-up hands the GIL to the loop's
    thread and back, and on a busy machine every hand-over waits for the OS to schedule the other
    thread (measured: the decoding loop ran at ~0.75x generate's speed; `mini-gpt bench serve`)."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    items: list[Step | _Done] = []
    lock = threading.Lock()
    last_wake = [0.0]

    def post(item: Step | _Done) -> None:
        now = time.perf_counter()
        with lock:
            items.append(item)
            if not (isinstance(item, _Done) or now - last_wake[0] >= FLUSH_S):
                return
            last_wake[0] = now
        try:
            loop.call_soon_threadsafe(ready.set)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            job.cancel.set()

    job.emit, job.done = post, lambda error: post(_Done(error))
    engine.submit(job)
    try:
        while True:
            await ready.wait()
            ready.clear()
            with lock:
                taken = items[:]
                items.clear()
            done = next((x for x in taken if isinstance(x, _Done)), None)
            batch = [x for x in taken if isinstance(x, Step)]
            if batch:
                yield batch
            if done is not None:
                if done.error is not None:
                    raise done.error
                return
    finally:
        job.cancel.set()


def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def create_app(engine: Engine, model_name: str, limits: Limits | None = None) -> FastAPI:
    """The server for one loaded model (module docstring)."""
    limits = limits or Limits()
    app = FastAPI(title="mini-gpt", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    created = int(time.time())

    # ---- errors: one sentence in OpenAI's shape ------------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(error_body(err.message, err.param), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        if first.get("type") == "json_invalid":
            return JSONResponse(error_body("The request body is not valid JSON."), status_code=400)
        loc = [str(x) for x in first.get("loc", ())]
        field = loc[1] if len(loc) > 1 and loc[0] == "body" else None  # the request's own key
        if field is None:
            message = "The request body must be a JSON object."
        elif first.get("type") == "extra_forbidden":
            message = f"Unknown field {field!r}."
        else:  # a union (prompt: text or ids) reports one error per alternative: the first says enough
            what = str(first.get("msg", "invalid value")).rstrip(".")
            message = f"Field {field!r} is invalid: {what[0].lower() + what[1:]}."
        return JSONResponse(error_body(message, field), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = {404: f"No route {request.url.path}.", 405: f"Method {request.method} is not allowed here."}
        text = message.get(err.status_code, f"{err.detail}.")
        return JSONResponse(error_body(text), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        body = error_body(
            f"Internal error ({type(err).__name__}); see the server's log.", kind="server_error"
        )
        return JSONResponse(body, status_code=500)

    # ---- checks shared by the API and the page -------------------------------------------------------
    def prompt_ids(prompt: str | list[int] | list[str]) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ApiError(
                    400, "Send one prompt per request (a list of several is not supported).", "prompt"
                )
            prompt = prompt[0]
        if isinstance(prompt, str) and len(prompt) > limits.max_prompt_tokens * 32:
            raise ApiError(
                400, f"The prompt is longer than {limits.max_prompt_tokens * 32} characters.", "prompt"
            )
        try:
            ids = engine.encode(prompt)  # type: ignore[arg-type]
        except MiniGPTError as err:
            raise ApiError(400, sentence(err), "prompt") from None
        if len(ids) > limits.max_prompt_tokens:
            limit = limits.max_prompt_tokens
            raise ApiError(
                400, f"The prompt has {len(ids)} tokens, more than max_prompt_tokens={limit}.", "prompt"
            )
        return ids

    def check_common(max_tokens: int | None, n: int = 1) -> None:
        if max_tokens is None or not 1 <= max_tokens <= limits.max_tokens:
            raise ApiError(400, f"max_tokens must be between 1 and {limits.max_tokens}.", "max_tokens")
        if not 1 <= n <= limits.max_n:
            raise ApiError(400, f"n must be between 1 and {limits.max_n}.", "n")
        if engine.waiting >= limits.max_waiting:
            raise ApiError(429, f"The server is busy ({engine.waiting} requests waiting); try again soon.")

    def submit_checked(job: Job) -> AsyncIterator[list[Step]]:
        try:
            check_sampling_args(job.temperature, job.top_k, job.top_p)
        except MiniGPTError as err:
            raise ApiError(400, sentence(err)) from None
        return run_job(engine, job)

    # ---- routes --------------------------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "waiting": engine.waiting}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "mini-gpt"}
        return {"object": "list", "data": [card]}

    @app.get("/api/info")
    async def info() -> dict[str, Any]:
        c = engine.config
        return {
            "model": model_name, "n_layer": c.n_layer, "n_head": c.n_head, "n_embd": c.n_embd,
            "block_size": c.block_size, "vocab_size": c.vocab_size,
            "tokenizer": type(engine.tokenizer).__name__, "max_tokens": limits.max_tokens,
        }  # fmt: skip

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> Any:
        if req.model is not None and req.model != model_name:
            raise ApiError(
                404, f"The model {req.model!r} does not exist; this server has {model_name!r}.", "model"
            )
        if req.echo:
            raise ApiError(400, "echo is not supported.", "echo")
        if req.best_of not in (None, 1, req.n):
            raise ApiError(400, "best_of is not supported.", "best_of")
        if req.presence_penalty or req.frequency_penalty:
            raise ApiError(400, "presence_penalty and frequency_penalty are not supported.")
        if req.logprobs is not None and not 0 <= req.logprobs <= 5:
            raise ApiError(400, "logprobs must be between 0 and 5.", "logprobs")
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stops) > 4:
            raise ApiError(400, "stop may hold at most 4 strings.", "stop")
        n = 1 if req.n is None else req.n
        max_tokens = 16 if req.max_tokens is None else req.max_tokens  # OpenAI's default
        check_common(max_tokens, n)
        ids = prompt_ids(req.prompt)
        top_p = None if req.top_p is None or req.top_p == 1.0 else req.top_p
        job = Job(
            ids, max_tokens, 1.0 if req.temperature is None else req.temperature, req.top_k, top_p,
            req.seed, n, [s for s in stops if s], req.logprobs or 0, logprobs=req.logprobs is not None,
        )  # fmt: skip
        steps = submit_checked(job)
        ident, now = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": ident, "object": "text_completion", "created": now, "model": model_name}
        want_logprobs = req.logprobs is not None

        def logprobs_of(group: list[Step], offset: int) -> dict[str, Any] | None:
            if not want_logprobs:
                return None
            real = [s for s in group if s.token >= 0]
            tok = engine.tokenizer
            offsets = []  # where each token's released text starts in the completion
            for s in group:
                if s.token >= 0:
                    offsets.append(offset)
                offset += len(s.text)
            return {
                "tokens": [token_text(tok, s.token) for s in real],
                "token_logprobs": [s.logprob for s in real],
                "top_logprobs": [
                    {token_text(tok, i): lp for i, lp in s.top[: req.logprobs]} for s in real
                ] if req.logprobs else None,
                "text_offset": offsets,
            }  # fmt: skip

        if req.stream:

            async def events() -> AsyncIterator[str]:
                pending: dict[int, list[Step]] = {}
                offsets = [0] * n
                try:
                    async for batch in steps:
                        chunks = []
                        for row in range(n):
                            group = pending.setdefault(row, [])
                            group += [s for s in batch if s.row == row]
                            text = "".join(s.text for s in group)
                            if not text:
                                continue  # half a character, or text that may begin a stop string
                            logprobs = logprobs_of(group, offsets[row])
                            choice = {"index": row, "text": text, "logprobs": logprobs, "finish_reason": None}
                            offsets[row] += len(text)
                            pending[row] = []
                            chunks.append(_sse({**head, "choices": [choice]}))
                        if chunks:
                            yield "".join(chunks)
                except Exception as err:  # mid-stream: an error event, as OpenAI sends one
                    log.exception("generation failed")
                    yield _sse(error_body(f"Generation failed ({type(err).__name__}).", kind="server_error"))
                    return
                for row in range(n):
                    choice = {"index": row, "text": "", "logprobs": None, "finish_reason": job.finish[row]}
                    yield _sse({**head, "choices": [choice]})
                yield "data: [DONE]\n\n"

            return StreamingResponse(
                events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )

        groups: list[list[Step]] = [[] for _ in range(n)]
        async for batch in steps:
            for step in batch:
                groups[step.row].append(step)
        if not job.streams:
            raise ApiError(503, "The server is stopping: this request was cancelled before it ran.")
        choices = []
        for row, stream in enumerate(job.streams):
            group = groups[row]
            lp = logprobs_of(group, 0)
            choices.append(
                {"index": row, "text": stream.text, "logprobs": lp, "finish_reason": job.finish[row]}
            )
        completion_tokens = sum(s.tokens for s in job.streams)
        usage = {"prompt_tokens": len(ids), "completion_tokens": completion_tokens,
                 "total_tokens": len(ids) + completion_tokens}  # fmt: skip
        return {**head, "choices": choices, "usage": usage}

    @app.post("/api/generate")
    async def page_generate(req: PageRequest) -> StreamingResponse:
        check_common(req.max_tokens)
        ids = prompt_ids(req.prompt)
        top_p = None if req.top_p is None or req.top_p >= 1.0 else req.top_p
        job = Job(ids, req.max_tokens, req.temperature, req.top_k, top_p, req.seed, top_logprobs=5)
        steps = submit_checked(job)
        tok = engine.tokenizer

        def page_event(step: Step) -> dict[str, Any]:
            top = [{"text": token_text(tok, i), "prob": round(math.exp(lp), 5)} for i, lp in step.top]
            return {
                "type": "token", "id": step.token, "piece": step.text,
                "text": token_text(tok, step.token) if step.token >= 0 else step.text,
                "prob": round(math.exp(step.logprob), 5) if step.token >= 0 else None, "top": top,
            }  # fmt: skip

        async def events() -> AsyncIterator[str]:
            yield _sse({"type": "prompt", "groups": prompt_groups(tok, ids)})
            try:
                async for batch in steps:
                    yield "".join(_sse(page_event(step)) for step in batch)
            except Exception as err:
                log.exception("generation failed")
                yield _sse({"type": "error", "message": f"Generation failed ({type(err).__name__})."})
                return
            yield _sse({"type": "done", "finish_reason": job.finish[0]})

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.post("/api/attention")
    async def attention(req: AttentionRequest) -> dict[str, Any]:
        if len(req.ids) > limits.max_prompt_tokens + limits.max_tokens:
            raise ApiError(400, "Too many token ids for one attention view.", "ids")
        try:
            return await asyncio.to_thread(engine.attention, req.ids, req.position)
        except MiniGPTError as err:
            raise ApiError(400, sentence(err)) from None

    return app
