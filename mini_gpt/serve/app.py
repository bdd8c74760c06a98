"""The HTTP side of `mini-gpt serve` (FastAPI; docs/serve.md): OpenAI's POST /v1/completions and GET
/v1/models, GET /health, and the playground's GET /, /api/info, /api/heads and POST /api/generate,
/api/attention, /api/lens. Every error is OpenAI's body with one sentence, never a traceback."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from mini_gpt.conf.tools import ServeConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.sampling import check_sampling_args
from mini_gpt.infer.stream import token_text
from mini_gpt.serve.engine import CANCELLED, Engine, Job, Step, prompt_groups

STATIC = Path(__file__).parent / "static"
log = logging.getLogger("mini_gpt.serve")
OPEN_PATHS = ("/", "/health")  # and /static/...: the page loads, then asks for the key
SHUTTING_DOWN = "The server is shutting down: this generation was cut short."  # Ctrl-C (docs/serve.md)


class ApiError(MiniGPTError):
    """A request the server refuses: HTTP `status` and one sentence."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.status, self.param = status, param


def sentence(err: BaseException | str) -> str:
    """A MiniGPTError's one line as a sentence (a full stop at the end)."""
    text = str(err).strip()
    return text if text.endswith((".", "?", "!")) else text + "."


def error_body(
    message: str, param: str | None = None, kind: str = "invalid_request_error", code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class RequireKey:
    """Every route but the page, its static files and /health needs `Authorization: Bearer <key>`. (Plain
    ASGI, not BaseHTTPMiddleware: streams pass through untouched, a client's disconnect reaches the route.)"""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode("ascii")  # ServeConfig checks it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith("/static/"):
            return await self.app(scope, receive, send)
        scheme, _, given = (Headers(scope=scope).get("authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("latin-1"), self.key):
            return await self.app(scope, receive, send)
        message = (
            "Incorrect API key provided." if given
            else "Missing API key: send it as the header Authorization: Bearer <key>."
        )  # fmt: skip
        response = JSONResponse(error_body(message, code="invalid_api_key"), status_code=401)
        await response(scope, receive, send)


class CompletionRequest(BaseModel):
    """POST /v1/completions; unknown keys (user, ...) are ignored, unsupported features refused."""

    model_config = ConfigDict(extra="ignore", strict=True)  # strict floats still take ints

    model: str | None = None
    prompt: str | list[int] | list[str] = ""
    max_tokens: int | None = 16
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    top_k: int | None = None  # not OpenAI's: mini-gpt generate's top_k
    n: int | None = 1
    stream: bool | None = False
    logprobs: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    echo: bool | None = False
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    best_of: int | None = None


class PlaygroundRequest(BaseModel):  # the page's requests: an unknown key is refused
    model_config = ConfigDict(extra="forbid", strict=True)


class PageRequest(PlaygroundRequest):
    prompt: str = ""
    max_tokens: int = 64
    temperature: float = 0.8
    top_k: int | None = 200
    top_p: float | None = None
    seed: int | None = 1337


class AttentionRequest(PlaygroundRequest):
    ids: list[int]
    position: int


class LensRequest(PlaygroundRequest):
    text: str | None = None
    ids: list[int] | None = None  # the text's token ids instead
    position: int | None = None  # None: every position (the whole text must fit the context)
    top_k: int = 5


MAX_LENS_K = 20
FLUSH_S = 0.02  # a token waits at most this long, or one token more, before it is sent (run_job)


async def run_job(engine: Engine, job: Job) -> AsyncIterator[list[Step]]:
    """The steps of `job` as it runs on the engine's worker, in batches; leaving early cancels the job.
    The worker wakes the event loop at most every FLUSH_S: a wake-up per token hands the GIL back and forth
    and cost a fast model ~25% of its speed (`mini-gpt bench serve`)."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    items: list[Step | BaseException | None] = []  # the steps, then the end: None or the job's error
    lock = threading.Lock()
    last_wake = [0.0]

    def post(item: Step | BaseException | None) -> None:
        now = time.perf_counter()
        with lock:
            items.append(item)
            if isinstance(item, Step) and now - last_wake[0] < FLUSH_S:
                return
            last_wake[0] = now
        try:
            loop.call_soon_threadsafe(ready.set)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            job.cancel.set()

    job.emit = job.done = post
    engine.submit(job)
    try:
        while True:
            await ready.wait()
            ready.clear()
            with lock:
                taken = items[:]
                items.clear()
            batch = [x for x in taken if isinstance(x, Step)]
            if batch:
                yield batch
            if len(batch) < len(taken):  # the end
                if taken[-1] is not None:
                    raise taken[-1]
                return
    finally:
        job.cancel.set()


def _event_stream(events: AsyncIterator[list[Any]], error: Callable[[str], Any]) -> StreamingResponse:
    """Server-sent events, a list of payloads at a time; a failure mid-stream ends it with error(message)."""

    async def body() -> AsyncIterator[str]:
        try:
            async for payloads in events:
                if payloads:
                    yield "".join(
                        f"data: {p if isinstance(p, str) else json.dumps(p, ensure_ascii=False)}\n\n"
                        for p in payloads
                    )
        except Exception as err:
            log.exception("generation failed")
            yield f"data: {json.dumps(error(f'Generation failed ({type(err).__name__}).'))}\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def create_app(engine: Engine, model_name: str, limits: ServeConfig) -> FastAPI:
    """The server for one loaded model; `limits`: what one request may ask for (max_tokens, ...)."""
    app = FastAPI(title="mini-gpt", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    created = int(time.time())
    tok = engine.tokenizer

    if limits.api_key:
        app.add_middleware(RequireKey, key=limits.api_key)

    # ---- errors: one sentence in OpenAI's shape ------------------------------------------------------
    @app.exception_handler(MiniGPTError)  # ApiError, and the model side's refusals (400)
    async def _refused(request: Request, err: MiniGPTError) -> JSONResponse:
        body = error_body(sentence(err), getattr(err, "param", None))
        return JSONResponse(body, status_code=getattr(err, "status", 400))

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
        message = f"Internal error ({type(err).__name__}); see the server's log."
        return JSONResponse(error_body(message, kind="server_error"), status_code=500)

    # ---- checks shared by the API and the page -------------------------------------------------------
    def submit(
        prompt: str | list[int] | list[str], max_tokens: int, n: int = 1, **settings: Any
    ) -> tuple[Job, AsyncIterator[list[Step]]]:
        """A job and its steps, once every setting is checked (here: run_job submits when first read)."""
        if not 1 <= max_tokens <= limits.max_tokens:
            raise ApiError(f"max_tokens must be between 1 and {limits.max_tokens}.", "max_tokens")
        if not 1 <= n <= limits.max_n:
            raise ApiError(f"n must be between 1 and {limits.max_n}.", "n")
        if engine.waiting >= limits.max_waiting:
            raise ApiError(
                f"The server is busy ({engine.waiting} requests waiting); try again soon.", status=429
            )
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ApiError("Send one prompt per request (a list of several is not supported).", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str) and len(prompt) > limits.max_prompt_tokens * 32:
            raise ApiError(f"The prompt is longer than {limits.max_prompt_tokens * 32} characters.", "prompt")
        try:
            ids = engine.encode(prompt)  # type: ignore[arg-type]
        except MiniGPTError as err:
            raise ApiError(sentence(err), "prompt") from None
        if len(ids) > limits.max_prompt_tokens:
            raise ApiError(
                f"The prompt has {len(ids)} tokens, more than max_prompt_tokens={limits.max_prompt_tokens}.",
                "prompt",
            )
        job = Job(ids, max_tokens, n=n, **settings)
        check_sampling_args(job.temperature, job.top_k, job.top_p)
        return job, run_job(engine, job)

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
            "tokenizer": type(tok).__name__, "max_tokens": limits.max_tokens,
        }  # fmt: skip

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> Any:
        if req.model is not None and req.model != model_name:
            raise ApiError(
                f"The model {req.model!r} does not exist; this server has {model_name!r}.", "model", 404
            )
        if req.echo:
            raise ApiError("echo is not supported.", "echo")
        if req.best_of not in (None, 1, req.n):
            raise ApiError("best_of is not supported.", "best_of")
        if req.presence_penalty or req.frequency_penalty:
            raise ApiError("presence_penalty and frequency_penalty are not supported.")
        if req.logprobs is not None and not 0 <= req.logprobs <= 5:
            raise ApiError("logprobs must be between 0 and 5.", "logprobs")
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stops) > 4:
            raise ApiError("stop may hold at most 4 strings.", "stop")
        n = 1 if req.n is None else req.n
        job, steps = submit(
            req.prompt, 16 if req.max_tokens is None else req.max_tokens, n,  # OpenAI's defaults for null
            temperature=1.0 if req.temperature is None else req.temperature, top_k=req.top_k,
            top_p=None if req.top_p is None or req.top_p == 1.0 else req.top_p, seed=req.seed,
            stops=[s for s in stops if s], top_logprobs=req.logprobs or 0, logprobs=req.logprobs is not None,
        )  # fmt: skip
        ident, now = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": ident, "object": "text_completion", "created": now, "model": model_name}

        def choice(row: int, group: list[Step], offset: int, text: str, finish: str | None) -> dict[str, Any]:
            """One row's text, and the log-probabilities of the tokens in `group` (text from `offset`)."""
            logprobs = None
            if req.logprobs is not None:
                real = [s for s in group if s.token >= 0]  # not the held-back text of the end
                starts = list(accumulate((len(s.text) for s in group), initial=offset))  # each step's text
                logprobs = {
                    "tokens": [token_text(tok, s.token) for s in real],
                    "token_logprobs": [s.logprob for s in real],
                    "top_logprobs": [
                        {token_text(tok, i): lp for i, lp in s.top[: req.logprobs]} for s in real
                    ] if req.logprobs else None,
                    "text_offset": [starts[k] for k, s in enumerate(group) if s.token >= 0],
                }  # fmt: skip
            return {"index": row, "text": text, "logprobs": logprobs, "finish_reason": finish}

        if req.stream:

            async def chunks() -> AsyncIterator[list[Any]]:
                pending: list[list[Step]] = [[] for _ in range(n)]
                offsets = [0] * n
                async for batch in steps:
                    for step in batch:
                        pending[step.row].append(step)
                    out = []
                    for row, group in enumerate(pending):
                        text = "".join(s.text for s in group)
                        if text:  # else half a character, or text that may begin a stop string
                            out.append({**head, "choices": [choice(row, group, offsets[row], text, None)]})
                            offsets[row] += len(text)
                            pending[row] = []
                    yield out
                if CANCELLED in job.finish:  # Ctrl-C: no finish_reason claims it ended by itself
                    yield [error_body(SHUTTING_DOWN, kind="server_error", code="server_shutting_down")]
                    return
                ends = [
                    {"index": row, "text": "", "logprobs": None, "finish_reason": f}
                    for row, f in enumerate(job.finish)
                ]
                yield [*({**head, "choices": [end]} for end in ends), "[DONE]"]

            return _event_stream(chunks(), lambda message: error_body(message, kind="server_error"))

        groups: list[list[Step]] = [[] for _ in range(n)]
        async for batch in steps:
            for step in batch:
                groups[step.row].append(step)
        if CANCELLED in job.finish:
            raise ApiError(SHUTTING_DOWN, status=503)
        choices = [choice(row, groups[row], 0, s.text, job.finish[row]) for row, s in enumerate(job.streams)]
        completion_tokens = sum(s.tokens for s in job.streams)
        usage = {"prompt_tokens": len(job.ids), "completion_tokens": completion_tokens,
                 "total_tokens": len(job.ids) + completion_tokens}  # fmt: skip
        return {**head, "choices": choices, "usage": usage}

    @app.post("/api/generate")
    async def page_generate(req: PageRequest) -> StreamingResponse:
        top_p = None if req.top_p is None or req.top_p >= 1.0 else req.top_p
        job, steps = submit(
            req.prompt, req.max_tokens, temperature=req.temperature, top_k=req.top_k, top_p=top_p,
            seed=req.seed, top_logprobs=5,
        )  # fmt: skip

        def token_event(s: Step) -> dict[str, Any]:
            top = [{"text": token_text(tok, i), "prob": round(math.exp(lp), 5)} for i, lp in s.top]
            return {
                "type": "token", "id": s.token, "piece": s.text,
                "text": token_text(tok, s.token) if s.token >= 0 else s.text,
                "prob": round(math.exp(s.logprob), 5) if s.token >= 0 else None, "top": top,
            }  # fmt: skip

        async def events() -> AsyncIterator[list[Any]]:
            yield [{"type": "prompt", "groups": prompt_groups(tok, job.ids)}]
            async for batch in steps:
                yield [token_event(s) for s in batch]
            if job.finish[0] == CANCELLED:
                yield [{"type": "error", "message": SHUTTING_DOWN}]
            else:
                yield [{"type": "done", "finish_reason": job.finish[0]}]

        return _event_stream(events(), lambda message: {"type": "error", "message": message})

    @app.post("/api/attention")
    async def attention(req: AttentionRequest) -> dict[str, Any]:
        if len(req.ids) > limits.max_prompt_tokens + limits.max_tokens:
            raise ApiError("Too many token ids for one attention view.", "ids")
        return await asyncio.to_thread(engine.attention, req.ids, req.position)

    @app.post("/api/lens")
    async def lens(req: LensRequest) -> dict[str, Any]:
        if (req.text is None) == (req.ids is None):
            raise ApiError("Send text or ids (its token ids): one of the two.")
        top = min(MAX_LENS_K, engine.config.vocab_size)
        if not 1 <= req.top_k <= top:
            raise ApiError(f"top_k must be between 1 and {top}.", "top_k")
        if req.text is not None and len(req.text) > limits.max_prompt_tokens * 32:
            raise ApiError(f"The text is longer than {limits.max_prompt_tokens * 32} characters.", "text")
        ids = req.ids if req.text is None else engine.encode(req.text)
        if len(ids) > limits.max_prompt_tokens + limits.max_tokens:
            raise ApiError("Too many tokens for one logit lens.", "text" if req.ids is None else "ids")
        return await asyncio.to_thread(engine.lens, ids, req.position, req.top_k)

    @app.get("/api/heads")
    async def heads() -> dict[str, Any]:
        return await asyncio.to_thread(engine.heads)

    return app
