"""Serve a model: `mini-gpt serve ckpt=PATH [host=127.0.0.1] [port=8000]` (keys: conf/serve.yaml).

One process holds the model; http://HOST:PORT/ is the playground page (tokens streamed, shaded by
probability, alternatives on hover, attention on click) and http://HOST:PORT/v1 an OpenAI-compatible API
(mini_gpt/serve/app.py lists the routes; docs/serve.md has examples). Ctrl-C stops it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from mini_gpt.conf import run_tool
from mini_gpt.errors import MiniGPTError, build_config, check_ints
from mini_gpt.infer.device import check_dtype, resolve_device


@dataclass
class ServeConfig:
    """What conf/serve.yaml holds (see the comments there)."""

    ckpt: str | None = None
    init_from: str | None = None
    bpe_file: str | None = None
    tokenizer: str | None = None
    model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    max_tokens: int = 1024
    max_prompt_tokens: int = 4096
    max_n: int = 8
    max_waiting: int = 64
    log_level: str = "warning"

    def __post_init__(self) -> None:
        check_ints(minimum=0, port=self.port)
        check_ints(max_tokens=self.max_tokens, max_prompt_tokens=self.max_prompt_tokens, max_n=self.max_n)
        check_ints(max_waiting=self.max_waiting)
        check_ints(allow_none=True, threads=self.threads)
        check_dtype(self.dtype)
        if self.port > 65535:
            raise MiniGPTError(f"port={self.port} must be at most 65535")


def default_name(cfg: ServeConfig) -> str:
    """The model id: the checkpoint's file name, or for last.ckpt / model.safetensors / an export directory
    the directory's (the run's for a run's checkpoints/ folder)."""
    if cfg.model_name:
        return cfg.model_name
    if cfg.init_from:
        return Path(str(cfg.init_from)).name
    path = Path(str(cfg.ckpt)).expanduser().resolve()
    if path.name in ("last.ckpt", "model.safetensors") or path.is_dir():
        base = path if path.is_dir() else path.parent
        return base.parent.name if base.name == "checkpoints" else base.name
    return path.stem


def build(cfg: ServeConfig) -> Any:
    """The FastAPI app for `cfg` (the model loaded); raises MiniGPTError without the serve extra."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MiniGPTError('mini-gpt serve needs FastAPI and uvicorn: pip install -e ".[serve]"') from None
    from mini_gpt.interop.checkpoint import open_model
    from mini_gpt.serve.app import Limits, create_app
    from mini_gpt.serve.engine import Engine

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    model, tokenizer = open_model(cfg.ckpt, cfg.init_from, cfg.bpe_file, device, cfg.tokenizer)
    engine = Engine(model, tokenizer, device, cfg.dtype)
    limits = Limits(cfg.max_tokens, cfg.max_prompt_tokens, cfg.max_n, cfg.max_waiting)
    app = create_app(engine, default_name(cfg), limits)
    app.state.engine = engine
    return app


def run(cfg: ServeConfig, err: TextIO | None = None) -> None:
    """Load the model and serve until Ctrl-C."""
    err = err or sys.stderr
    import uvicorn

    app = build(cfg)
    engine = app.state.engine
    where = (
        "only this machine can connect; host=0.0.0.0 opens it to the network"
        if cfg.host in ("127.0.0.1", "localhost", "::1")
        else "other machines can connect: there is no authentication"
    )
    name = default_name(cfg)
    print(
        f"mini-gpt serve: {name} on {engine.device}; page http://{cfg.host}:{cfg.port}/ , "
        f"API http://{cfg.host}:{cfg.port}/v1 (bound to {cfg.host}: {where}); Ctrl-C stops it",
        file=err,
        flush=True,
    )
    config = uvicorn.Config(
        app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, timeout_graceful_shutdown=2,
        access_log=cfg.log_level in ("info", "debug"),
    )  # fmt: skip

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Ctrl-C: end the running and queued generations first, so that open streams finish (with
            # what they have) and uvicorn's graceful shutdown need not cancel them mid-response.
            engine.cancel_all()
            super().handle_exit(sig, frame)

    server = Server(config)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shuts down gracefully on Ctrl-C, then raises it again
        pass
    except SystemExit:  # uvicorn exits when it cannot bind (its own log line says why)
        pass
    finally:
        engine.close()
    if not server.started:
        raise MiniGPTError(f"could not serve on {cfg.host}:{cfg.port} (is the port in use? try port=8001)")
    print("mini-gpt serve: stopped", file=err, flush=True)


def config_from_dict(d: dict[str, Any]) -> ServeConfig:
    return build_config(ServeConfig, d, "serve")


def main(argv: list[str] | None = None) -> None:
    """`mini-gpt serve ARGS`; `argv` default: the command line."""
    run_tool("serve", lambda cfg: run(config_from_dict(cfg)), argv)


if __name__ == "__main__":
    main()
