"""HTTP front end: `arctic-rl serve` (FastAPI + uvicorn). Every op of arctic_rl.ops is `POST /v1/<op>` with a wire
message (arctic_rl.wire: JSON tree + safetensors; never pickle) holding the op's keyword arguments;
the answer is a wire message, or JSON {"type", "message"} with a 4xx/5xx status.

Binds to loopback by default; any other host requires a bearer token (from ARCTIC_RL_TOKEN or
--token-file, never the command line). Bodies are size-capped (server.max_body_bytes) and parsed
defensively; every request's arguments are checked (arctic_rl.server.requests) before the controller
sees them: a malformed request gets a 4xx naming the argument and the server stays healthy.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import socket
import sys
import threading
from pathlib import Path

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from arctic_rl import ops, wire
from arctic_rl.config import TOKEN_ENV, ArcticRLClientConfig, model_vocab_size
from arctic_rl.errors import (
    ERRORS,
    ArcticRLError,
    AuthError,
    ConfigError,
    EngineDeadError,
    EngineError,
    ProtocolError,
    TooLargeError,
)
from arctic_rl.losses import load_loss_modules
from arctic_rl.server.deploy import deploy
from arctic_rl.server.requests import check_request


def _error(e: ArcticRLError) -> JSONResponse:
    # the nearest class the client knows by name (subclasses such as batch.BatchError map to their base)
    name = next(c.__name__ for c in type(e).__mro__ if c.__name__ in ERRORS)
    return JSONResponse({"type": name, "message": str(e)}, status_code=e.http_status)


async def read_bytes(request: Request, max_body: int) -> bytes:
    """The request's body, refused (TooLargeError) once it exceeds `max_body` bytes, whatever its header says."""
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise ProtocolError(f"bad content-length header {declared[:40]!r}")
    if declared is not None and int(declared) > max_body:
        raise TooLargeError(
            f"request body of {declared} bytes exceeds the server's limit of {max_body} (server.max_body_bytes)"
        )
    body = bytearray()
    async for chunk in request.stream():  # the header may lie (or be absent): count what arrives
        body += chunk
        if len(body) > max_body:
            raise TooLargeError(f"request body exceeds the server's limit of {max_body} bytes (server.max_body_bytes)")
    return bytes(body)


def build_app(handle, cfg: ArcticRLClientConfig, on_shutdown=lambda: None, tinker: bool = False) -> FastAPI:
    """The app in front of the controller `handle`; `cfg` is the deployment's config (its server
    section sets the limits and what names and paths requests may use). `tinker`: add the Tinker SDK's
    API (arctic_rl/server/tinker_api.py) under /api/v1."""
    load_loss_modules(cfg.server.loss_modules)  # the names its checks accept are the controller's
    app = FastAPI(title="arctic-rl", version="0.1.0")
    token = cfg.auth_token
    max_body = cfg.server.max_body_bytes
    vocab = model_vocab_size(cfg.model_name, cfg.model_overrides)  # token ids are checked here too

    def check_auth(request: Request) -> None:
        if token is None:
            return
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
            raise AuthError("missing or wrong bearer token (send 'Authorization: Bearer <token>')")

    async def read_body(request: Request) -> dict:
        body = await read_bytes(request, max_body)
        if not body:
            return {}
        kwargs = wire.decode(body)
        if not isinstance(kwargs, dict):
            raise ProtocolError(f"request body must encode a dict of arguments, got {type(kwargs).__name__}")
        return kwargs

    @app.get("/healthz")
    async def healthz():  # liveness of the HTTP process only; engine health is POST /v1/health
        return {"ok": True, "job_id": cfg.job_id}

    def endpoint(op: ops.Op):
        async def call(request: Request):
            try:
                check_auth(request)
                args = op.bind(await read_body(request))
                # Checked here too (the controller checks again): a bad request never reaches Ray.
                await run_in_threadpool(check_request, op.name, args, cfg, vocab)
                result = await run_in_threadpool(_call_controller, handle, op.name, args)
                if op.name == "shutdown":
                    threading.Timer(0.5, on_shutdown).start()
                return Response(wire.encode(result), media_type=wire.CONTENT_TYPE)
            except ArcticRLError as e:
                return _error(e)

        return call

    # One route per declared op (arctic_rl.ops), then a catch-all that names the known ones.
    for op in ops.OPS.values():
        app.add_api_route(ops.route(op.name), endpoint(op), methods=["POST"], name=op.name, summary=op.doc)

    @app.post(ops.route("{name}"))
    async def unknown_op(name: str, request: Request):
        try:
            check_auth(request)
        except ArcticRLError as e:
            return _error(e)
        message = f"unknown op {name!r:.60}; known: {sorted(ops.OPS)}"
        return JSONResponse({"type": "ProtocolError", "message": message}, status_code=404)

    if tinker:
        from arctic_rl.server import tinker_api

        def call(op: str, kwargs: dict):  # what a /v1 route does with a request, without the wire
            args = ops.OPS[op].bind(kwargs)
            check_request(op, args, cfg, vocab)
            return _call_controller(handle, op, args)

        tinker_api.mount(app, cfg, call, lambda request: read_bytes(request, max_body))
    return app


def _call_controller(handle, op: str, kwargs: dict):
    try:
        return ray.get(handle.dispatch.remote(op, kwargs))
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, ArcticRLError):
            raise type(e.cause)(str(e.cause)) from None
        raise EngineError(str(e).strip().splitlines()[-1]) from None
    except ray.exceptions.RayActorError as e:
        if op == "shutdown":
            return "ok"
        raise EngineDeadError(f"the controller is gone: {str(e).splitlines()[0]}") from None


def _read_token(token_file: str | None) -> str | None:
    """The token from --token-file or ARCTIC_RL_TOKEN. The variable is then removed from this
    process's environment, so the Ray workers it may start do not inherit it."""
    env_token = os.environ.pop(TOKEN_ENV, None) or None
    if token_file is None:
        return env_token
    path = Path(token_file).expanduser()
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except OSError as e:
        raise ConfigError(f"--token-file {token_file!r}: cannot read it ({e.strerror})") from None
    if mode & 0o077:
        raise ConfigError(f"--token-file {token_file!r} is readable by others (mode {oct(mode & 0o777)}); chmod 600 it")
    if not token:
        raise ConfigError(f"--token-file {token_file!r} is empty")
    return token


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="arctic-rl serve", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a JSON file or JSON string of ArcticRLClientConfig")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    # No --token: a command line is readable by every user of the machine (ps, /proc/<pid>/cmdline).
    p.add_argument(
        "--allow-imports",
        action="store_true",
        help="let requests name losses and post-processors by dotted path: imports any module the server "
        "can import, i.e. whoever may call the server may run code on it (sets server.allow_imports)",
    )
    p.add_argument(
        "--token-file",
        default=None,
        help=f"a file (mode 0600) holding the bearer token; default: the {TOKEN_ENV} environment variable",
    )
    p.add_argument(
        "--tinker",
        action="store_true",
        help="also serve the API of the official `tinker` SDK under /api/v1 (docs/tinker.md)",
    )
    a = p.parse_args(argv)
    try:
        token = _read_token(a.token_file)
        raw = a.config if a.config.lstrip().startswith("{") else open(a.config).read()
        data = json.loads(raw)
        data["comm_protocol"] = "http"
        for key, val in (("host", a.host), ("port", a.port), ("auth_token", token)):
            if val is not None:
                data[key] = val
        if a.allow_imports:
            data["server"] = {**data.get("server", {}), "allow_imports": True}
        config = ArcticRLClientConfig(**data)
    except ArcticRLError as e:
        print(f"ARCTIC_RL_ERROR {type(e).__name__}: {e}", flush=True)
        return 1
    # Take the port before the deploy (Ray and the engines take tens of seconds): a port that was free
    # when the caller picked it can be taken meanwhile, by Ray's own workers say, and a port that cannot
    # be had should fail before anything starts.
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as e:
        print(f"ARCTIC_RL_ERROR ConfigError: cannot listen on {config.host}:{config.port} (port): {e}", flush=True)
        return 1
    try:
        cfg, handle = deploy(config)
    except ArcticRLError as e:
        print(f"ARCTIC_RL_ERROR {type(e).__name__}: {e}", flush=True)
        return 1
    import uvicorn

    server: uvicorn.Server | None = None

    def stop():
        if server is not None:
            server.should_exit = True

    app = build_app(handle, cfg, on_shutdown=stop, tinker=a.tinker)
    print(f"ARCTIC_RL_CONFIG {cfg.to_json()}", flush=True)
    print(f"[arctic-rl] serving job {cfg.job_id} on http://{cfg.host}:{cfg.port}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning"))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
