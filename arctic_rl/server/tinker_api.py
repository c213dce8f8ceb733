"""The Tinker-compatible front: `arctic-rl serve --tinker` adds the HTTP API that the official `tinker` SDK speaks
(under /api/v1, beside the /v1 ops) to the same server, mapped onto the same ops, checks and limits.

Requests and answers are the SDK's own types (tinker.types, and its protobuf module for forward_backward and
sample, arctic_rl/server/tinker_convert.py). Work runs as futures: a request that trains or samples is answered
at once with an UntypedAPIFuture; `retrieve_future` waits up to FUTURE_WAIT_S for it and answers the result, a
RequestFailedResponse (category "user" for a 4xx error, "server" otherwise: the SDK raises RequestFailedError),
or try_again. Training requests run one at a time in arrival order (the SDK sends a client's requests in seq_id
order); sampling runs in its own queue.

One deployment trains one policy (the deployment's model): create_model returns a model on it, a later
create_model starts over from the base weights (saved at the first create) and a fresh optimizer. The sampler
holds one set of weights: a sampling session samples the weights saved for it (save_weights_for_sampler, or
the base model before any save); once newer weights were sent, an older session's requests fail with a user
error naming both versions. Auth: the SDK's API key (X-API-Key) is the server's bearer token.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from tinker import types
from tinker.types.checkpoint import ParsedCheckpointTinkerPath
from tinker.types.try_again_response import TryAgainResponse

from arctic_rl.config import ArcticRLClientConfig, model_vocab_size
from arctic_rl.errors import ArcticRLError, AuthError, BatchFormatError, ConfigError, ProtocolError, UnknownNameError
from arctic_rl.losses import resolve_loss_fn
from arctic_rl.losses.config import TINKER_LOSSES
from arctic_rl.server import tinker_convert as conv
from arctic_rl.server.edges import check_content_type, json_body_limit, read_bytes
from arctic_rl.server.requests import check_request

PREFIX = "/api/v1"
PROTO = "application/x-protobuf"
FUTURE_WAIT_S = 20.0  # retrieve_future long-polls this long (the SDK's own timeout is 45 s) before try_again
MAX_FUTURES = 4096  # finished results kept for retrieval (also bounded by bytes and age); the oldest go first
MAX_ENTRIES = 4096  # models, sampling sessions and sampler paths kept each; the oldest go first
NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")
INITIAL = "tinker/initial"  # the base weights and fresh optimizer, saved at the first create_model


@dataclass
class Proto:
    """A result the SDK reads as protobuf (ForwardBackwardOutput, SampleResponse)."""

    data: bytes


@dataclass
class Model:
    model_id: str
    lora_rank: int | None


@dataclass
class Sampler:
    sampler_id: str
    version: int  # the sampler weights it samples (0: the base model)
    model_path: str | None


@dataclass
class State:
    # Keyed by ids the client chooses parts of: each bounded (MAX_ENTRIES), and freed with their session.
    models: OrderedDict[str, Model] = field(default_factory=OrderedDict)
    current: str | None = None  # the model the trainer holds
    samplers: OrderedDict[str, Sampler] = field(default_factory=OrderedDict)
    sampler_paths: OrderedDict[str, int] = field(default_factory=OrderedDict)  # tinker path -> weights version
    version: int = 0  # the weights the sampler holds
    initial_saved: bool = False
    sessions: dict[str, float] = field(default_factory=dict)  # session id -> clock of its last heartbeat


class TooManyError(ProtocolError):
    """Over a count the server bounds (requests in flight, sessions): the SDK retries a 429 later."""

    http_status = 429


class SessionGoneError(ArcticRLError):
    """A session that ended or stopped sending heartbeats: 410, on which the SDK stops its heartbeat loop."""

    http_status = 410


def _put(od: OrderedDict, key: str, value: Any, keep: str | None = None) -> None:
    """od[key] = value, the oldest entries (except `keep`) dropped beyond MAX_ENTRIES."""
    od[key] = value
    od.move_to_end(key)
    for old in [k for k in od if k not in (key, keep)][: max(0, len(od) - MAX_ENTRIES)]:
        del od[old]


def _session_of(some_id: str) -> str:
    """The session a model id ('<session>:train:<n>') or sampler id ('<session>:sample:<n>') belongs to."""
    return some_id.split(":train:")[0].split(":sample:")[0]


@dataclass
class Entry:
    future: Future
    session: str | None
    done_at: float | None = None  # clock when it finished; None while queued or running
    nbytes: int = 0  # its result's size, once finished


def _result_size(f: Future) -> int:
    if f.cancelled():
        return 0
    e = f.exception()
    if e is not None:
        return len(str(e))
    r = f.result()
    return len(r.data) if isinstance(r, Proto) else len(r.model_dump_json()) if isinstance(r, BaseModel) else 0


class FutureStore:
    """Futures by request id. Queued or running ones are never evicted (the SDK would get 404 while the work goes
    on): past `max_pending` of them a new request is refused (429). Finished ones are kept `ttl_s` after they
    finished, within `max_bytes` of results in all and MAX_FUTURES; beyond, the oldest finished go first (the
    newest result is kept whatever its size, so the request that just finished can still be retrieved)."""

    def __init__(self, max_pending: int, max_bytes: int, ttl_s: float, clock: Callable[[], float]):
        self.max_pending, self.max_bytes, self.ttl_s, self.clock = max_pending, max_bytes, ttl_s, clock
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.bytes = 0
        self.lock = threading.RLock()  # RLock: cancel() runs the done callback in the cancelling thread

    def add(self, request_id: str, start: Callable[[], Future], session: str | None) -> None:
        with self.lock:
            self.purge()
            pending = sum(e.done_at is None for e in self.entries.values())
            if pending >= self.max_pending:
                raise TooManyError(
                    f"{pending} requests are queued or running, the server's limit "
                    "(server.tinker_max_pending): retry when some have finished"
                )
            entry = self.entries[request_id] = Entry(start(), session)
        entry.future.add_done_callback(lambda f: self._finished(request_id))

    def _finished(self, request_id: str) -> None:
        with self.lock:
            entry = self.entries.get(request_id)
            if entry is None or entry.done_at is not None:
                return
            entry.done_at, entry.nbytes = self.clock(), _result_size(entry.future)
            self.bytes += entry.nbytes
            self.purge(newest=request_id)

    def _drop(self, request_id: str) -> None:
        self.bytes -= self.entries.pop(request_id).nbytes

    def purge(self, newest: str | None = None) -> None:
        with self.lock:
            now = self.clock()
            done = [k for k, e in self.entries.items() if e.done_at is not None]
            for k in done:
                if now - self.entries[k].done_at > self.ttl_s and k != newest:  # type: ignore[operator]
                    self._drop(k)
            done = [k for k in done if k in self.entries and k != newest]
            while done and (self.bytes > self.max_bytes or len(done) + (newest is not None) > MAX_FUTURES):
                self._drop(done.pop(0))

    def get(self, request_id: str) -> Future | None:
        with self.lock:
            self.purge()
            entry = self.entries.get(request_id)
        return None if entry is None else entry.future

    def cancel(self, request_id: str) -> bool | None:
        """True: cancelled before it started (it never runs); False: already running or finished; None: unknown."""
        with self.lock:
            entry = self.entries.get(request_id)
            return None if entry is None else entry.future.cancel()

    def drop_session(self, session: str) -> None:
        """A session's queued futures cancelled (they never run) and its results freed; running ones finish."""
        with self.lock:
            for k, e in list(self.entries.items()):
                if e.session == session and (e.future.cancel() or e.future.done()):
                    if k in self.entries:
                        self._drop(k)


class TinkerFront:
    """The routes' state and work. `call(op, args)` runs an op with the checks of the /v1 routes."""

    def __init__(
        self, cfg: ArcticRLClientConfig, call: Callable[[str, dict], Any], clock: Callable[[], float] = time.monotonic
    ):
        self.cfg, self.call, self.clock = cfg, call, clock
        self.state = State()
        self.lock = threading.RLock()  # State is read by the routes (event loop) and written by the workers
        self.train = ThreadPoolExecutor(1, thread_name_prefix="tinker-train")
        self.sample = ThreadPoolExecutor(1, thread_name_prefix="tinker-sample")
        sc = cfg.server
        self.futures = FutureStore(sc.tinker_max_pending, sc.tinker_max_result_bytes, sc.tinker_result_ttl_s, clock)
        self.vocab = model_vocab_size(cfg.model_name, cfg.model_overrides)
        self.limits = conv.Limits(
            max_seq_len=cfg.vllm_config.max_seq_len or 2**31,
            max_rows=sc.max_batch_rows,
            max_cells=sc.max_batch_tokens,
        )

    # -- sessions -----------------------------------------------------------------------------------------------
    def open_session(self) -> str:
        with self.lock:
            self.expire_sessions()
            if len(self.state.sessions) >= self.cfg.server.tinker_max_sessions:
                raise TooManyError(
                    f"{len(self.state.sessions)} sessions are open, the server's limit "
                    "(server.tinker_max_sessions): close a ServiceClient, or wait for idle ones to expire"
                )
            session_id = f"s{uuid.uuid4().hex[:16]}"
            self.state.sessions[session_id] = self.clock()
        return session_id

    def live_session(self, session_id: str, heartbeat: bool = False) -> None:
        """Raises SessionGoneError unless `session_id` is open; a heartbeat keeps it open."""
        with self.lock:
            self.expire_sessions()
            if session_id not in self.state.sessions:
                raise SessionGoneError(
                    f"session {session_id!r:.80} is unknown, ended, or sent no heartbeat for "
                    f"{self.cfg.server.tinker_session_ttl_s}s (server.tinker_session_ttl_s): create a new ServiceClient"
                )
            if heartbeat:
                self.state.sessions[session_id] = self.clock()

    def end_session(self, session_id: str) -> None:
        with self.lock:
            if self.state.sessions.pop(session_id, None) is None:
                raise SessionGoneError(f"session {session_id!r:.80} is unknown or ended already")
            self._free_session(session_id)

    def expire_sessions(self) -> None:
        with self.lock:
            now, ttl = self.clock(), self.cfg.server.tinker_session_ttl_s
            for sid in [s for s, t in self.state.sessions.items() if now - t > ttl]:
                del self.state.sessions[sid]
                self._free_session(sid)

    def _free_session(self, session_id: str) -> None:
        """Its models and sampling sessions forgotten, its queued requests cancelled and its results freed."""
        st = self.state
        for name in ("models", "samplers"):
            od = getattr(st, name)
            for k in [k for k in od if _session_of(k) == session_id]:
                del od[k]
        if st.current is not None and st.current not in st.models:
            st.current = None
        self.futures.drop_session(session_id)

    # -- futures ------------------------------------------------------------------------------------------------
    def submit(
        self,
        pool: ThreadPoolExecutor,
        fn: Callable[[], object],
        model_id: str | None = None,
        session: str | None = None,
    ) -> dict:
        request_id = uuid.uuid4().hex
        owner = session if session is not None else (_session_of(model_id) if model_id else None)
        self.futures.add(request_id, lambda: pool.submit(fn), owner)
        return types.UntypedAPIFuture(request_id=request_id, model_id=model_id).model_dump(exclude_none=True)

    async def retrieve(self, request_id: str) -> Response:
        fut = self.futures.get(request_id)
        if fut is None:
            return JSONResponse({"detail": f"unknown request_id {request_id!r:.80}"}, status_code=404)
        if fut.cancelled():
            body = types.RequestFailedResponse(
                error=f"request {request_id} was cancelled before it ran (cancel_future, or its session ended)",
                category=types.RequestErrorCategory.User,
            )
            return JSONResponse(body.model_dump(mode="json"))
        try:
            result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), FUTURE_WAIT_S)
        except TimeoutError:
            again = TryAgainResponse(request_id=request_id, queue_state="active")
            return JSONResponse(again.model_dump(mode="json"))
        except ArcticRLError as e:
            category = types.RequestErrorCategory.User if e.http_status < 500 else types.RequestErrorCategory.Server
            return JSONResponse(types.RequestFailedResponse(error=str(e), category=category).model_dump(mode="json"))
        except Exception as e:  # anything else is the server's fault; the SDK gets its message, not a 500
            msg = f"{type(e).__name__}: {e}"
            body = types.RequestFailedResponse(error=msg, category=types.RequestErrorCategory.Server)
            return JSONResponse(body.model_dump(mode="json"))
        if isinstance(result, Proto):
            return Response(result.data, media_type=PROTO)
        assert isinstance(result, BaseModel)
        return JSONResponse(result.model_dump(mode="json", exclude_none=True))

    # -- models -------------------------------------------------------------------------------------------------
    def model(self, model_id: str) -> Model:
        with self.lock:
            m = self.state.models.get(model_id)
            current = self.state.current
        if m is None:
            raise UnknownNameError(f"unknown model_id {model_id!r:.120}")
        if model_id != current:
            raise ConfigError(
                f"model {model_id!r} is no longer on the trainer: {current!r} was created or loaded after it "
                "(one deployment trains one model at a time)"
            )
        return m

    def check_base_model(self, base_model: str | None) -> None:
        if base_model is not None and base_model != self.cfg.model_name:
            raise UnknownNameError(
                f"base_model {base_model!r:.200} is not served here; this deployment trains {self.cfg.model_name!r}"
            )

    def lora_rank(self, lora: types.LoraConfig | None) -> int | None:
        deployed = self.cfg.training_config.lora
        if deployed is None:
            # A full-parameter deployment: the SDK always asks for LoRA (create_lora_training_client); the model
            # trains every parameter, and get_info says so (is_lora False). LoRA is the deployment's choice.
            return None
        if lora is not None and lora.rank != deployed.rank:
            raise ConfigError(
                f"lora_config.rank={lora.rank} but this deployment trains LoRA rank {deployed.rank} "
                "(training_config.lora.rank)"
            )
        return deployed.rank

    def new_model(self, model_id: str, lora_rank: int | None) -> None:
        """Puts `model_id` on the trainer, with the base weights and a fresh optimizer (a training worker)."""
        with self.lock:
            first = not self.state.initial_saved
        if first:
            self.call("save_checkpoint", {"path": INITIAL})
        else:
            self.call("load_checkpoint", {"path": INITIAL})
        with self.lock:
            self.state.initial_saved = True
            _put(self.state.models, model_id, Model(model_id, lora_rank))
            self.state.current = model_id

    def info(self, model_id: str) -> types.GetInfoResponse:
        with self.lock:
            m = self.state.models.get(model_id)
        if m is None:
            raise UnknownNameError(f"unknown model_id {model_id!r:.120}")
        return types.GetInfoResponse(
            model_id=model_id,
            model_data=types.ModelData(model_name=self.cfg.model_name),
            is_lora=m.lora_rank is not None,
            lora_rank=m.lora_rank,
            model_name=self.cfg.model_name,
        )

    # -- training (each runs on the training worker) ------------------------------------------------------------
    def forward_backward(self, call: conv.ForwardBackwardCall) -> Proto:
        self.model(call.model_id)
        full = conv.to_batch(call.data, call.loss_fn, shared=False)
        config = {**call.loss_fn_config, "compute_entropy": False}
        # The log-probs come from their own forward pass (forward_backward answers metrics only); with the
        # weights unchanged until optim_step they are those the gradient was taken at.
        lp = self.call("log_probs", {"batch": full.batch})["log_probs"]
        try:
            loss, _ = resolve_loss_fn(call.loss_fn)({"log_probs": lp}, full.batch, config)
        except ValueError as e:
            raise ConfigError(f"loss {call.loss_fn!r} rejected the request: {e}") from None
        if not call.forward_only:
            zorro = self.cfg.training_config.zorro_train.enable
            rows = conv.to_batch(call.data, call.loss_fn, shared=zorro) if zorro else full
            self.call("forward_backward", {"batch": rows.batch, "loss_fn": call.loss_fn, "loss_config": config})
        out = conv.forward_backward_output(conv.target_log_probs(full, lp), {"loss:sum": float(loss)})
        return Proto(out)

    def optim_step(self, model_id: str, p: types.AdamParams) -> types.OptimStepResponse:
        self.model(model_id)
        params = {"lr": p.learning_rate, "betas": [p.beta1, p.beta2], "eps": p.eps, "weight_decay": p.weight_decay}
        out = self.call("optimizer_step", {"optim_params": params})
        return types.OptimStepResponse(metrics={k: float(v) for k, v in out.items()})

    def _ckpt(self, run_id: str, name: str) -> str:
        """The folder of checkpoint `name` of run `run_id`: one below `tinker/`, never `.` or `..` (the SDK's path
        parser takes `tinker://../weights/x`, which would name `<checkpoint_root>/x`)."""
        if not NAME.fullmatch(name) or name in (".", ".."):
            raise ConfigError(f"checkpoint name {name!r:.140} (of {run_id!r:.140}): use 1-128 of A-Z a-z 0-9 . _ -")
        if not RUN_ID.fullmatch(run_id) or run_id in (".", ".."):
            raise ConfigError(f"run id {run_id!r:.140} (of checkpoint {name!r:.140}): use 1-200 of A-Z a-z 0-9 . _ : -")
        return f"tinker/{run_id.replace(':', '_')}/{name}"  # under server.checkpoint_root (checked by the op)

    def checkpoint_of(self, path: str) -> str:
        """The folder a `tinker://<run>/weights/<name>` path names (under checkpoint_root), or a ConfigError naming
        the path: checked when a load is sent, and again when it runs."""
        try:
            parsed = ParsedCheckpointTinkerPath.from_tinker_path(path)
        except ValueError as e:
            raise ConfigError(f"path {path!r:.200}: {e}") from None
        if parsed.checkpoint_type != "training":
            raise ConfigError(f"path {path!r:.200}: not a training checkpoint (tinker://<run>/weights/<name>)")
        try:
            return self._ckpt(parsed.training_run_id, parsed.checkpoint_id.split("/", 1)[1])
        except ConfigError as e:
            raise ConfigError(f"path {path!r:.200}: {e}") from None

    def save_weights(self, model_id: str, name: str) -> types.SaveWeightsResponse:
        self.model(model_id)
        self.call("save_checkpoint", {"path": self._ckpt(model_id, name)})
        return types.SaveWeightsResponse(path=f"tinker://{model_id}/weights/{name}")

    def load_weights(self, model_id: str, path: str, optimizer: bool) -> types.LoadWeightsResponse:
        if not optimizer:
            raise ConfigError(
                "loading weights without the optimizer state is not supported: checkpoints restore both "
                "(use load_state_with_optimizer / create_training_client_from_state_with_optimizer)"
            )
        self.call("load_checkpoint", {"path": self.checkpoint_of(path)})
        with self.lock:
            _put(self.state.models, model_id, self.state.models.get(model_id) or Model(model_id, self.lora_rank(None)))
            self.state.current = model_id
        return types.LoadWeightsResponse(path=path, model_id=model_id)

    def save_for_sampler(self, req: types.SaveWeightsForSamplerRequest, session_id: str) -> BaseModel:
        self.model(req.model_id)
        if req.path is not None and not NAME.fullmatch(req.path):
            raise ConfigError(f"name {req.path!r:.140}: use 1-128 of A-Z a-z 0-9 . _ -")
        self.call("sync_weights", {})
        with self.lock:
            self.state.version += 1
            version = self.state.version
            if req.path is not None:
                path = f"tinker://{req.model_id}/sampler_weights/{req.path}"
                _put(self.state.sampler_paths, path, version)
                return types.SaveWeightsForSamplerResponseInternal(path=path)
            sampler_id = f"{session_id}:sample:{req.sampling_session_seq_id}"
            _put(self.state.samplers, sampler_id, Sampler(sampler_id, version, None))
        return types.SaveWeightsForSamplerResponseInternal(sampling_session_id=sampler_id)

    # -- sampling (on the sampling worker) ----------------------------------------------------------------------
    def new_sampler(self, req: types.CreateSamplingSessionRequest) -> str:
        self.live_session(req.session_id)
        sampler_id = f"{req.session_id}:sample:{req.sampling_session_seq_id}"
        with self.lock:
            if req.model_path is not None:
                version = self.state.sampler_paths.get(req.model_path)
                if version is None:
                    raise UnknownNameError(f"model_path {req.model_path!r:.200}: no sampler weights saved under it")
            else:
                self.check_base_model(req.base_model)
                version = 0
            _put(self.state.samplers, sampler_id, Sampler(sampler_id, version, req.model_path))
        return sampler_id

    def sampler(self, sampler_id: str | None) -> Sampler:
        with self.lock:
            s = self.state.samplers.get(sampler_id or "")
            current = self.state.version
        if s is None:
            raise UnknownNameError(f"unknown sampling_session_id {sampler_id!r:.120}")
        if s.version != current:
            raise ConfigError(
                f"sampling session {sampler_id!r} samples sampler weights version {s.version}, but the sampler "
                f"holds version {current} now (one set of weights per deployment; create a new sampling client)"
            )
        return s

    def check_sample(self, req: types.SampleRequest) -> None:
        """The generate op's checks (num_samples within server.max_n, the prompt's length and token ids), when the
        request is sent: a refused request gets a 4xx, not a future. The prompt's length first, from its chunks' lengths:
        an over-long prompt is refused before its tokens are walked."""
        limit = self.cfg.vllm_config.max_seq_len
        if limit is not None and req.prompt.length >= limit:
            raise BatchFormatError(
                f"prompt has {req.prompt.length} tokens; the sampler takes fewer than vllm_config.max_seq_len={limit}"
            )
        try:
            prompt = req.prompt.to_ints()
        except ValueError as e:  # image chunks
            raise BatchFormatError(f"prompt: {e}") from None
        params = conv.sampling_params(req.sampling_params, req.num_samples)
        check_request("generate", {"prompts": [prompt], "sampling_params": params}, self.cfg, self.vocab)

    def run_sample(self, req: types.SampleRequest) -> Proto:
        self.sampler(req.sampling_session_id)
        prompt = req.prompt.to_ints()
        params = conv.sampling_params(req.sampling_params, req.num_samples)
        samples = self.call("generate", {"prompts": [prompt], "sampling_params": params})
        prompt_lp = None
        if req.prompt_logprobs:
            if len(prompt) < 2:
                prompt_lp = []
            else:
                prompt_lp = self.call("sampler_log_probs", {"sequences": [prompt], "prompt_lens": [1]})[0]
        self.sampler(req.sampling_session_id)  # the weights did not change meanwhile
        return Proto(conv.sample_response(samples, prompt_lp))


class CancelRequest(BaseModel):
    """The SDK's cancel_future body (it has no type of its own for it)."""

    request_id: str


async def _parse(model: type[BaseModel], body: bytes, what: str):
    return await run_in_threadpool(_parse_now, model, body, what)  # off the event loop: bodies may be large


def _parse_now(model: type[BaseModel], body: bytes, what: str):
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "body"
        raise ProtocolError(f"{what}: {where}: {first['msg']} ({e.error_count()} error(s))") from None


def mount(
    app: FastAPI,
    cfg: ArcticRLClientConfig,
    call: Callable[[str, dict], Any],
    read_body: Callable,
    clock: Callable[[], float] = time.monotonic,
) -> TinkerFront:
    """Adds the Tinker routes to `app`. `call(op, args)` runs an op with the /v1 routes' checks; `read_body`
    reads a request's bytes under the server's size limit; `clock` times sessions and results."""
    front = TinkerFront(cfg, call, clock)
    token = cfg.auth_token

    def check_auth(request: Request) -> None:
        if token is None:
            return
        got = request.headers.get("x-api-key")
        if got is None:
            bearer = request.headers.get("authorization", "")
            got = bearer[7:] if bearer.startswith("Bearer ") else ""
        if not hmac.compare_digest(got.encode(), token.encode()):
            raise AuthError("missing or wrong API key (the SDK's api_key must be the server's bearer token)")

    def route(path: str, method: str = "POST"):
        def deco(fn):
            async def handler(request: Request):
                try:
                    check_auth(request)
                    body: bytes | bytearray = b""
                    if method == "POST":  # the SDK's own types only (a browser's text/plain POST is refused)
                        check_content_type(request.headers, ("application/json", PROTO))
                        if request.headers.get("content-type", "").split(";")[0].strip().lower() == PROTO:
                            body = await read_body(request)
                        else:  # JSON is parsed holding the GIL: capped as the /v1 routes' JSON part is
                            body = await read_bytes(request, json_body_limit(cfg), "server.max_json_bytes")
                    out = await fn(request, body)
                except ArcticRLError as e:
                    return JSONResponse({"detail": str(e), "type": type(e).__name__}, status_code=e.http_status)
                if isinstance(out, Response):
                    return out
                return JSONResponse(
                    out.model_dump(mode="json", exclude_none=True) if isinstance(out, BaseModel) else out
                )

            app.add_api_route(PREFIX + path, handler, methods=[method], name=f"tinker:{path}")
            return fn

        return deco

    @route("/healthz", "GET")
    async def healthz(request, body):
        return types.HealthResponse(status="ok")

    @route("/get_server_capabilities", "GET")
    async def capabilities(request, body):
        model = types.SupportedModel(
            model_name=cfg.model_name, max_context_length=cfg.vllm_config.max_seq_len, trainable=True, sampleable=True
        )
        out = types.GetServerCapabilitiesResponse(supported_models=[model]).model_dump(mode="json", exclude_none=True)
        return {**out, "supported_losses": list(TINKER_LOSSES)}  # not in the SDK's type (it ignores the key)

    @route("/client/config")
    async def client_config(request, body):
        return types.ClientConfigResponse(
            use_pyqwest_transport=False,
            parallel_fwdbwd_chunks=False,  # chunks in seq_id order: the training queue runs them as they come
            fwdbwd_max_chunk_len=cfg.server.max_batch_rows,  # the SDK splits larger requests into chunks
        )

    @route("/client/dynamic_config")
    async def dynamic_config(request, body):
        return types.ClientDynamicConfigResponse(sample_cancel_enabled=True)  # abandoned samples: cancel_future

    @route("/create_session")
    async def create_session(request, body):
        await _parse(types.CreateSessionRequest, body, "create_session")
        return types.CreateSessionResponse(session_id=front.open_session())

    @route("/session_heartbeat")
    async def heartbeat(request, body):
        front.live_session(
            (await _parse(types.SessionHeartbeatRequest, body, "session_heartbeat")).session_id, heartbeat=True
        )
        return types.SessionHeartbeatResponse()

    @route("/telemetry")
    async def telemetry(request, body):  # accepted and dropped: nothing leaves the cluster
        return types.TelemetryResponse(status="accepted")

    @route("/sessions/{session_id}/finish")
    async def finish(request, body):
        front.end_session(request.path_params["session_id"])
        return JSONResponse(None)

    @route("/cancel_future")
    async def cancel(request, body):
        req = await _parse(CancelRequest, body, "cancel_future")
        if front.futures.cancel(req.request_id) is None:
            return JSONResponse({"detail": f"unknown request_id {req.request_id!r:.80}"}, status_code=404)
        return JSONResponse(None)  # a running request finishes; a queued one never runs

    @route("/create_model")
    async def create_model(request, body):
        req = await _parse(types.CreateModelRequest, body, "create_model")
        front.check_base_model(req.base_model)
        rank = front.lora_rank(req.lora_config)
        if not isinstance(req.optimizer_config, types.AdamOptimizerConfig):
            raise ConfigError(f"optimizer_config.type={req.optimizer_config.type!r}: only 'adamw' is supported")
        front.live_session(req.session_id)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"

        def run():
            front.new_model(model_id, rank)
            return types.CreateModelResponse(model_id=model_id)

        return front.submit(front.train, run, model_id)

    @route("/get_info")
    async def get_info(request, body):
        return front.info((await _parse(types.GetInfoRequest, body, "get_info")).model_id)

    @route("/forward_backward")
    async def forward_backward(request, body):
        if request.headers.get("content-encoding"):
            raise ProtocolError("compressed forward_backward bodies are not accepted (client config says so)")
        call = await run_in_threadpool(
            conv.parse_forward_backward, body, front.limits
        )  # sizes checked before anything is decoded; off the event loop
        conv.check_loss_fn(call.loss_fn)
        conv.check_inputs(call)
        return front.submit(front.train, lambda: front.forward_backward(call), call.model_id)

    @route("/optim_step")
    async def optim_step(request, body):
        req = await _parse(types.OptimStepRequest, body, "optim_step")
        if not isinstance(req.optim_params, types.AdamParams):
            raise ConfigError(f"optim_params of type {req.optim_params.type!r}: only AdamParams are supported")
        return front.submit(front.train, lambda: front.optim_step(req.model_id, req.optim_params), req.model_id)

    @route("/save_weights")
    async def save_weights(request, body):
        req = await _parse(types.SaveWeightsRequest, body, "save_weights")
        name = req.path or f"step-{uuid.uuid4().hex[:8]}"
        return front.submit(front.train, lambda: front.save_weights(req.model_id, name), req.model_id)

    @route("/load_weights")
    async def load_weights(request, body):
        req = await _parse(types.LoadWeightsRequest, body, "load_weights")
        if req.model_id is None:  # a new training client from a checkpoint (ServiceClient)
            if req.session_id is None or req.model_seq_id is None:
                raise ProtocolError("load_weights needs model_id, or session_id and model_seq_id")
            front.check_base_model(req.base_model)
            front.live_session(req.session_id)
            model_id = f"{req.session_id}:train:{req.model_seq_id}"
        else:
            model_id = req.model_id
            front.model(model_id)
        front.checkpoint_of(req.path)  # a bad path is refused when sent, not as the future's error
        return front.submit(front.train, lambda: front.load_weights(model_id, req.path, req.optimizer), model_id)

    @route("/save_weights_for_sampler")
    async def save_for_sampler(request, body):
        req = await _parse(types.SaveWeightsForSamplerRequest, body, "save_weights_for_sampler")
        if req.path is None and req.sampling_session_seq_id is None:
            raise ProtocolError("save_weights_for_sampler needs path or sampling_session_seq_id")
        session = req.model_id.split(":train:")[0]
        return front.submit(front.train, lambda: front.save_for_sampler(req, session), req.model_id)

    @route("/create_sampling_session")
    async def create_sampling_session(request, body):
        req = await _parse(types.CreateSamplingSessionRequest, body, "create_sampling_session")
        return types.CreateSamplingSessionResponse(sampling_session_id=front.new_sampler(req))

    @route("/samplers/{sampler_id}", "GET")
    async def get_sampler(request, body):
        s = front.sampler(request.path_params["sampler_id"])
        return types.GetSamplerResponse(sampler_id=s.sampler_id, base_model=cfg.model_name, model_path=s.model_path)

    @route("/asample")
    async def asample(request, body):
        req = await _parse(types.SampleRequest, body, "asample")
        front.sampler(req.sampling_session_id)
        for what in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if getattr(req, what):
                raise ConfigError(f"{what} is not supported by this server")
        if req.target_prompt_logprobs is not None or req.prompt_logprobs_last_n is not None:
            raise ConfigError("target_prompt_logprobs / prompt_logprobs_last_n are not supported by this server")
        # before sample_sequence_ids, which num_samples sizes; off the event loop: it walks the prompt's tokens
        await run_in_threadpool(front.check_sample, req)
        session = _session_of(req.sampling_session_id or "")
        out = front.submit(front.sample, lambda: front.run_sample(req), session=session)
        out["sample_sequence_ids"] = [f"{out['request_id']}:{k}" for k in range(req.num_samples)]
        return out

    @route("/retrieve_future")
    async def retrieve_future(request, body):
        req = await _parse(types.FutureRetrieveRequest, body, "retrieve_future")
        return await front.retrieve(req.request_id)

    return front
