"""HTTP front end: `arctic-rl serve` (FastAPI + uvicorn). Every op of arctic_rl.ops is `POST /v1/<op>` with a wire
message (arctic_rl.wire: JSON tree + safetensors; never pickle) holding the op's keyword arguments;
the answer is a wire message, or JSON {"type", "message"} with a 4xx/5xx status.

Binds to loopback by default; any other host requires a bearer token (from ARCTIC_RL_TOKEN or
--token-file, never the command line). Before any route: the Host and Origin checks and the concurrency cap
(arctic_rl/server/edges.py); a route takes its own content type only. Bodies are size-capped
(server.max_body_bytes) and decoded off the event loop; every request's arguments are checked
(arctic_rl.server.requests) before the controller sees them: a malformed request gets a 4xx naming the
argument and the server stays healthy. `GET /auth/proof` proves to a client that this server holds the token
(arctic_rl/handshake.py). A request carrying an id (REQUEST_ID_HEADER) is run once: a retry gets its answer.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import re
import socket
import sys
import threading
from pathlib import Path

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from arctic_rl import handshake, ops, wire
from arctic_rl.config import TOKEN_ENV, ArcticRLClientConfig, model_vocab_size
from arctic_rl.errors import (
    ERRORS,
    ArcticRLError,
    AuthError,
    ConfigError,
    EngineDeadError,
    EngineError,
    ProtocolError,
    RequestTimeoutError,
)
from arctic_rl.losses import load_loss_modules
from arctic_rl.server.deploy import deploy
from arctic_rl.server.edges import (
    Answer,
    EdgeGuard,
    Entry,
    ResultCache,
    allowed_hosts,
    check_content_type,
    read_bytes,
    uvicorn_config,
)
from arctic_rl.server.requests import check_request

REQUEST_ID_HEADER = "x-arctic-rl-request-id"
REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
# Answered afresh every time: read-only, and a kept answer would be stale.
NOT_KEPT = frozenset({"health", "reconnect_config"})


def _error(e: ArcticRLError) -> Response:
    return _answer_response(_error_answer(e))


def _error_answer(e: ArcticRLError) -> Answer:
    # the nearest class the client knows by name (subclasses such as batch.BatchError map to their base)
    name = next(c.__name__ for c in type(e).__mro__ if c.__name__ in ERRORS)
    return Answer(e.http_status, json.dumps({"type": name, "message": str(e)}).encode(), "application/json")


def _answer_response(a: Answer) -> Response:
    return Response(a.body, status_code=a.status, media_type=a.media_type)


def build_app(handle, cfg: ArcticRLClientConfig, on_shutdown=lambda: None, tinker: bool = False) -> FastAPI:
    """The app in front of the controller `handle`; `cfg` is the deployment's config (its server
    section sets the limits and what names and paths requests may use). `tinker`: add the Tinker SDK's
    API (arctic_rl/server/tinker_api.py) under /api/v1."""
    load_loss_modules(cfg.server.loss_modules)  # the names its checks accept are the controller's
    app = FastAPI(title="arctic-rl", version="0.1.0")
    app.add_middleware(
        EdgeGuard,
        hosts=allowed_hosts(cfg),
        max_concurrent=cfg.server.max_concurrent_requests,
        max_body_in_flight=cfg.server.inflight_body_bytes,
    )
    token = cfg.auth_token
    max_body = cfg.server.max_body_bytes
    vocab = model_vocab_size(cfg.model_name, cfg.model_overrides)  # token ids are checked here too
    cache = ResultCache(cfg.server.result_cache_entries, cfg.server.result_cache_bytes, cfg.server.result_cache_age_s)

    def check_auth(request: Request) -> None:
        if token is None:
            return
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
            raise AuthError("missing or wrong bearer token (send 'Authorization: Bearer <token>')")

    async def decode_args(op: ops.Op, body: bytearray) -> dict:
        # Off the event loop: a large body takes long to decode, and /healthz and the long-polls must not wait.
        kwargs = await run_in_threadpool(wire.decode, body, None, cfg.server.max_json_bytes) if body else {}
        if not isinstance(kwargs, dict):
            raise ProtocolError(f"request body must encode a dict of arguments, got {type(kwargs).__name__}")
        args = op.bind(kwargs)
        # Checked here too (the controller checks again): a bad request never reaches Ray.
        await run_in_threadpool(check_request, op.name, args, cfg, vocab)
        return args

    @app.get("/healthz")
    async def healthz():  # liveness of the HTTP process only; engine health is POST /v1/health
        return {"ok": True, "job_id": cfg.job_id}

    @app.get(handshake.PROOF_ROUTE)
    async def prove(request: Request, nonce: str = ""):
        """HMAC(token, nonce) over the address and port this connection reached (its local end): the client's check
        that it reached the server holding its token, directly."""
        if not handshake.NONCE.fullmatch(nonce):
            return JSONResponse({"type": "ProtocolError", "message": "nonce must be 32-128 hex digits"}, 400)
        host, port = request.scope.get("server") or ("", cfg.port)
        return {"proof": handshake.proof(token, nonce, str(host), int(port)) if token else None}

    def endpoint(op: ops.Op):
        async def call(request: Request):
            try:
                check_auth(request)
                check_content_type(request.headers, (wire.CONTENT_TYPE,))
                body = await read_bytes(request, max_body)
                request_id = _request_id(request, op.name)
                if request_id is None:
                    entry = None
                else:
                    digest = await run_in_threadpool(_digest, op.name, body)
                    entry = cache.get(request_id)
                    if entry is not None:  # a retry: the first one's answer, once it has one
                        if entry.digest != digest:
                            raise ProtocolError(
                                f"request id {request_id!r} was already used for another request: "
                                "a retry must send the same op and body, a new request a new id"
                            )
                        return _answer_response(await _wait(entry.answer, op.name, cfg.request_timeout_s))
                    entry = cache.start(request_id, digest)
                try:
                    args = await decode_args(op, body)
                except BaseException as e:  # nothing ran: a later retry runs it; one waiting now gets this answer
                    if entry is not None and request_id is not None:
                        cache.forget(request_id)
                        failed = e if isinstance(e, ArcticRLError) else ProtocolError(f"{type(e).__name__}: {e}")
                        entry.answer.set_result(_error_answer(failed))
                    raise
                answer = _run(handle, op.name, args)
                if entry is not None:
                    answer.add_done_callback(_fill(entry))
                a = await _wait(answer, op.name, cfg.request_timeout_s)
                if op.name == "shutdown" and a.status == 200:
                    threading.Timer(0.5, on_shutdown).start()
                return _answer_response(a)
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

    def _checked_call(op: str, kwargs: dict):  # what a /v1 route does with a request, without the wire
        args = ops.OPS[op].bind(kwargs)
        check_request(op, args, cfg, vocab)
        return _call_controller(handle, op, args, cfg.request_timeout_s)

    if tinker:
        from arctic_rl.server import tinker_api

        tinker_api.mount(app, cfg, _checked_call, lambda request: read_bytes(request, max_body))
    if cfg.server.openai:
        from arctic_rl.server import openai_api

        openai_api.mount(app, cfg, _checked_call)
    return app


def _fill(entry: Entry):
    """A done-callback: the op's answer into the retry cache's entry (whoever still waits for the op)."""

    def fill(f: asyncio.Future) -> None:
        if not entry.answer.done():
            entry.answer.set_result(f.result())

    return fill


def _digest(op: str, body: bytearray) -> str:
    h = hashlib.sha256(op.encode() + b"\0")
    h.update(body)
    return h.hexdigest()


def _request_id(request: Request, op: str) -> str | None:
    rid = request.headers.get(REQUEST_ID_HEADER)
    if rid is None or op in NOT_KEPT:
        return None
    if not REQUEST_ID.fullmatch(rid):
        raise ProtocolError(f"header {REQUEST_ID_HEADER} {rid[:140]!r}: use 1-128 of A-Z a-z 0-9 _ -")
    return rid


def _run(handle, op: str, args: dict) -> asyncio.Future:
    """The op on the controller; the future's result is its answer (Answer), set when the op is done, whether or
    not anyone still waits for it."""
    ref = handle.dispatch.remote(op, args)

    async def answer() -> Answer:
        try:
            try:
                result = await asyncio.wrap_future(ref.future())
            except Exception as e:  # the controller's errors, as the synchronous call maps them
                result = _controller_result(e, op)
            return Answer(200, await run_in_threadpool(wire.encode, result), wire.CONTENT_TYPE)
        except ArcticRLError as err:
            return _error_answer(err)
        except Exception as err:  # anything else: the engine side's fault, with its message
            return _error_answer(EngineError(f"{op}: {type(err).__name__}: {err}"))

    return asyncio.ensure_future(answer())


async def _wait(answer: asyncio.Future, op: str, timeout_s: float) -> Answer:
    try:
        return await asyncio.wait_for(asyncio.shield(answer), timeout_s)
    except TimeoutError:
        return _error_answer(
            RequestTimeoutError(
                f"{op}: the controller did not answer within request_timeout_s={timeout_s:g}s; it may still be "
                f"running: a retry with the same {REQUEST_ID_HEADER} returns its answer once done, never runs it twice"
            )
        )


def _call_controller(handle, op: str, kwargs: dict, timeout_s: float):
    try:
        return ray.get(handle.dispatch.remote(op, kwargs), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RequestTimeoutError(
            f"{op}: the controller did not answer within request_timeout_s={timeout_s:g}s (it may still be running)"
        ) from None
    except Exception as e:
        return _controller_result(e, op)


def _controller_result(e: BaseException, op: str):
    """What a failed controller call means: raises the ArcticRLError to answer (or returns shutdown's 'ok')."""
    if isinstance(e, ray.exceptions.RayTaskError):
        if isinstance(e.cause, ArcticRLError):
            raise type(e.cause)(str(e.cause)) from None
        raise EngineError(str(e).strip().splitlines()[-1]) from None
    if isinstance(e, ray.exceptions.RayActorError):
        if op == "shutdown":
            return "ok"
        raise EngineDeadError(f"the controller is gone: {str(e).splitlines()[0]}") from None
    raise e


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
    p.add_argument(
        "--openai",
        action="store_true",
        help="also answer OpenAI's /v1/chat/completions from the sampler, recording each conversation's tokens "
        "(sets server.openai; docs/training.md)",
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
        if a.openai:
            data["server"] = {**data.get("server", {}), "openai": True}
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
    # the connection limits (server.http_head_timeout_s, max_connections, max_head_bytes) are uvicorn_config's
    server = uvicorn.Server(uvicorn_config(app, cfg, log_level="warning"))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
