"""`mini-gpt serve ckpt=PATH`: the playground page and an OpenAI-compatible API; Ctrl-C stops it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mini_gpt.conf import run_tool
from mini_gpt.conf.tools import ServeConfig, is_loopback
from mini_gpt.errors import MiniGPTError, import_extra
from mini_gpt.infer.device import open_on_device


def default_name(cfg: ServeConfig) -> str:
    """The model id: the checkpoint's file name, else its folder's (the run's for checkpoints/)."""
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
    for extra in ("fastapi", "uvicorn"):
        import_extra(extra, 'mini-gpt serve needs FastAPI and uvicorn: pip install -e ".[serve]"')
    from mini_gpt.serve.app import create_app
    from mini_gpt.serve.engine import Engine

    model, tokenizer, device = open_on_device(cfg, sys.stderr)
    engine = Engine(model, tokenizer, device, cfg.dtype)
    app = create_app(engine, default_name(cfg), cfg)
    app.state.engine = engine
    return app


def run(cfg: ServeConfig) -> None:
    import uvicorn

    app = build(cfg)
    engine = app.state.engine
    auth = " with the API key" if cfg.api_key else ": there is no authentication"
    local = "only this machine can connect; host=0.0.0.0 opens it to the network"
    where = local if is_loopback(cfg.host) else f"other machines can connect{auth}"
    print(f"mini-gpt serve: {default_name(cfg)} on {engine.device}; page http://{cfg.host}:{cfg.port}/ , "
          f"API http://{cfg.host}:{cfg.port}/v1 (bound to {cfg.host}: {where}); Ctrl-C stops it",
          file=sys.stderr, flush=True)  # fmt: skip
    config = uvicorn.Config(
        app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, timeout_graceful_shutdown=2,
        access_log=cfg.log_level in ("info", "debug"),
    )  # fmt: skip

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Ctrl-C: end the generations first, so that open streams end (with an error event saying the
            # server is shutting down) and uvicorn's graceful shutdown need not cancel them mid-response.
            engine.cancel_all()
            super().handle_exit(sig, frame)

    server = Server(config)
    # uvicorn shuts down gracefully on Ctrl-C, then raises it again; it exits when it cannot bind
    try:
        server.run()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        engine.close()
    if not server.started:
        raise MiniGPTError(f"could not serve on {cfg.host}:{cfg.port} (is the port in use? try port=8001)")
    print("mini-gpt serve: stopped", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    run_tool("serve", run, argv)
