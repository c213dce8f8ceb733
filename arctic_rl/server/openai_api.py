"""The OpenAI-compatible front: POST /v1/chat/completions answered by the deployment's sampler, so agent code that
speaks OpenAI (the official `openai` client, agent frameworks built on it) produces rollouts the trainer can use
as they were sampled. On with `server.openai: true` (`arctic-rl serve --openai`); auth is the bearer token.

Conversations, token in / token out. A request names its conversation in the header X-Conversation-Id (or the
body's `conversation_id`: the openai client's extra_body). Per conversation the server records one token
sequence (arctic_rl.rollout.multiturn's layout): the first request's messages rendered by the chat template
(its `tools` included) as the prompt; each answer's tokens as the sampler produced them, with their log-probs
(loss mask 1); each later request's new messages (tool results, user turns) rendered once by the template and
appended (loss mask 0). The next answer is sampled from that sequence as token ids, so the assistant's earlier
answers are never re-tokenized from their text. A later request must repeat the conversation so far (its
messages and the answers as returned, compared by role and text); one that does not is refused naming the
first message that differs (409), since its tokens would no longer be the ones recorded.

GET /v1/conversations/{id} answers the record as a sample (prompt_token_ids, token_ids, loss_mask, logprobs,
num_turns) for arctic_rl.batch.from_samples; DELETE drops it. Without an id a request is answered and not
recorded.

Limits (docs/security.md, "The OpenAI front"): a body is JSON within server.max_json_bytes; the messages' and tools'
characters within server.max_prompt_chars before the template or the tokenizer reads them; sampling as the generate
op checks it (max_tokens, stop strings, the sequence shorter than max_seq_len). A conversation is recorded only once
its first request was accepted and answered; a refused request leaves its record as it was. Records are bounded by
the tokens they hold (server.openai_max_record_tokens), the least recently used dropped first. A conversation's
requests run one at a time: one that waits past server.openai_conversation_wait_s for the one before is a 503.
Completions run on server.openai_max_concurrent threads of their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from arctic_rl import ops
from arctic_rl.chat import ObservationTemplate
from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.errors import ArcticRLError, AuthError, BatchFormatError, ProtocolError, ServerBusyError
from arctic_rl.server.edges import check_content_type, json_body_limit, read_bytes
from arctic_rl.server.requests import max_prompt_chars

ROUTE = ops.ROUTE_PREFIX + "/chat/completions"  # OpenAI's path under the base URL .../v1
CONVERSATIONS = ops.ROUTE_PREFIX + "/conversations/{cid}"
CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")


class ConflictError(ProtocolError):
    """A request that does not continue its conversation as recorded."""

    http_status = 409


class ChatRequest(BaseModel):
    """The fields of OpenAI's chat-completions request this front reads; others (the clients send many) are
    ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None
    conversation_id: str | None = None


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise ProtocolError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def _turn(message: dict) -> tuple[str, bytes]:
    """(role, digest of the text): what a later request's repeat of the message is compared with. A digest, not the
    text: a record holds tokens, and its size is counted in tokens (server.openai_max_record_tokens)."""
    role = message.get("role")
    if not isinstance(role, str) or role not in ("system", "user", "assistant", "tool", "developer"):
        raise ProtocolError(f"message role must be system, user, assistant, tool or developer, got {role!r:.40}")
    return role, _digest(_text(message.get("content")))


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _chars(req: ChatRequest) -> int:
    """The characters a request hands the chat template: its messages' texts, their other fields (tool calls, names)
    as JSON, and its tools as JSON."""
    n = len(json.dumps(req.tools)) if req.tools else 0
    for m in req.messages:
        n += len(_text(m.get("content")))
        rest = {k: v for k, v in m.items() if k not in ("role", "content")}
        n += len(json.dumps(rest)) if rest else 0
    return n


@dataclass
class Record:
    """One conversation as sampled: token ids, loss mask and log-probs in compact arrays (a few bytes a token)."""

    turns: list[tuple[str, bytes]]  # the conversation so far: (role, digest of its text), answers included
    prompt: array
    tokens: array = field(default_factory=lambda: array("q"))
    mask: array = field(default_factory=lambda: array("b"))
    logprobs: array = field(default_factory=lambda: array("d"))
    answers: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # one request of the conversation at a time

    @property
    def size(self) -> int:  # tokens held; every turn renders to at least one of them
        return len(self.prompt) + len(self.tokens)

    def add(self, new: list[int], out: dict, turns: list[tuple[str, bytes]]) -> None:
        """The new messages' tokens (mask 0) and the answer's (mask 1, its log-probs)."""
        answer = list(out["token_ids"])
        self.tokens.extend(new)
        self.mask.extend([0] * len(new))
        self.logprobs.extend([0.0] * len(new))
        self.tokens.extend(answer)
        self.mask.extend([1] * len(answer))
        self.logprobs.extend(list(out.get("logprobs") or [0.0] * len(answer)))
        self.turns = [*turns, ("assistant", _digest(out["text"]))]
        self.answers += 1

    def sample(self) -> dict:
        return {
            "prompt_token_ids": self.prompt.tolist(),
            "token_ids": self.tokens.tolist(),
            "loss_mask": self.mask.tolist(),
            "logprobs": self.logprobs.tolist(),
            "num_turns": self.answers,
        }


class OpenAIFront:
    """The records and the work. Completions run on an executor of their own (server.openai_max_concurrent threads):
    each blocks a thread for its whole generate, and the server's shared thread pool must stay free for the other
    routes (a /v1 op's decoding, Tinker's parsing and heartbeats)."""

    def __init__(self, cfg: ArcticRLClientConfig, call: Callable[[str, dict], Any]):
        from transformers import AutoTokenizer

        self.cfg, self.call = cfg, call
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_name)
        self.template = ObservationTemplate(self.tokenizer)
        self.records: OrderedDict[str, Record] = OrderedDict()
        self.held = 0  # tokens of all records
        self.lock = threading.Lock()  # records, held, and every record's growth
        self.executor = ThreadPoolExecutor(cfg.server.openai_max_concurrent, thread_name_prefix="openai")

    # -- records: only of accepted requests, bounded by the tokens they hold ------------------------------------
    def _evict(self, keep: str) -> None:
        limit = self.cfg.server.openai_max_record_tokens
        while self.held > limit and len(self.records) > 1:
            cid, rec = next(iter(self.records.items()))
            if cid == keep:  # the newest is at the end; only a lone record over the limit is left
                break
            del self.records[cid]
            self.held -= rec.size

    def _start(self, cid: str, rec: Record) -> None:
        with self.lock:
            if cid in self.records:
                raise ConflictError(
                    f"conversation {cid!r}: another request started it meanwhile; a conversation's requests go one "
                    "at a time, each repeating the conversation so far"
                )
            self.records[cid] = rec
            self.held += rec.size
            self._evict(cid)

    def _grow(self, cid: str, rec: Record, new: list[int], out: dict, turns: list[tuple[str, bytes]]) -> None:
        with self.lock:
            before = rec.size
            rec.add(new, out, turns)
            if self.records.get(cid) is rec:  # not dropped meanwhile
                self.held += rec.size - before
                self.records.move_to_end(cid)
                self._evict(cid)

    def drop(self, cid: str) -> None:
        with self.lock:
            rec = self.records.pop(cid, None)
            if rec is not None:
                self.held -= rec.size

    def sample_of(self, cid: str) -> dict:
        with self.lock:
            rec = self.records.get(cid)
            if rec is not None:
                return rec.sample()
        raise ProtocolError(
            f"no conversation {cid!r:.60} is recorded (records are kept within server.openai_max_record_tokens="
            f"{self.cfg.server.openai_max_record_tokens} tokens, the least recently used go first)"
        )

    # -- a completion ----------------------------------------------------------------------------------------------
    def _new_ids(self, cid: str, rec: Record, turns: list[tuple[str, bytes]], req: ChatRequest) -> list[int]:
        """The tokens of the messages a request adds to its recorded conversation."""
        for i, (had, got) in enumerate(zip(rec.turns, turns)):
            if had != got:
                raise ConflictError(
                    f"conversation {cid!r}: message {i} ({got[0]}) differs from the one recorded ({had[0]}); a "
                    f"request repeats the conversation so far and adds new messages (start a new conversation id)"
                )
        new = turns[len(rec.turns) :]
        if len(turns) < len(rec.turns) or not new or any(role == "assistant" for role, _ in new):
            raise ConflictError(
                f"conversation {cid!r}: a request continues it with new tool or user messages after the "
                f"{len(rec.turns)} recorded ones, got {len(turns)} messages"
            )
        messages = list(req.messages[len(rec.turns) :])
        ids = [] if rec.tokens and rec.tokens[-1] == self.template.eos_id else [self.template.eos_id]
        return ids + self.template.messages_ids(messages)

    def _generate(self, ids: list[int], req: ChatRequest, cid: str | None) -> dict:
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        params: dict[str, Any] = {
            "n": 1,
            "max_tokens": req.max_completion_tokens or req.max_tokens or 256,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "stop": stop,
        }
        if req.seed is not None:
            params["seed"] = req.seed
        args: dict[str, Any] = {"prompts": [ids], "sampling_params": params}
        if cid:  # a conversation's turns on one replica: its prefix cache holds the earlier ones
            args["routing_keys"] = [cid]
        return self.call("generate", args)[0]  # the /v1 checks first: a refused request raises here

    def complete(self, req: ChatRequest, cid: str | None) -> dict:
        if req.n != 1:
            raise ProtocolError(f"n={req.n}: this front answers one choice per request (send n=1)")
        turns = [_turn(m) for m in req.messages]
        chars, limit = _chars(req), max_prompt_chars(self.cfg)
        if limit is not None and chars > limit:  # before the chat template or the tokenizer reads them
            raise BatchFormatError(
                f"the request's messages and tools hold {chars} characters; the server takes at most {limit} "
                "(server.max_prompt_chars): shorten the conversation"
            )
        with self.lock:
            rec = self.records.get(cid) if cid else None
        if rec is None:
            tools: list[Any] | None = list(req.tools) if req.tools else None
            text = self.tokenizer.apply_chat_template(
                req.messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            out = self._generate(ids, req, cid)
            if cid:  # recorded once the request was accepted and answered
                rec = Record(turns=[], prompt=array("q", ids))
                rec.add([], out, turns)
                self._start(cid, rec)
        else:
            wait = self.cfg.server.openai_conversation_wait_s
            if not rec.lock.acquire(timeout=wait):
                raise ServerBusyError(
                    f"conversation {cid!r}: another request of it is still running after {wait:g}s "
                    "(server.openai_conversation_wait_s); a conversation's requests go one at a time"
                )
            try:
                new = self._new_ids(cid, rec, turns, req)  # type: ignore[arg-type]
                ids = rec.prompt.tolist() + rec.tokens.tolist() + new
                out = self._generate(ids, req, cid)
                self._grow(cid, rec, new, out, turns)  # type: ignore[arg-type]
            finally:
                rec.lock.release()
        finish = out.get("finish_reason") if out.get("finish_reason") in ("stop", "length") else "stop"
        answer = ChatCompletion.model_validate(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": req.model or self.cfg.model_name,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": finish,
                        "message": {"role": "assistant", "content": out["text"]},
                    }
                ],
                "usage": {
                    "prompt_tokens": len(ids),
                    "completion_tokens": len(out["token_ids"]),
                    "total_tokens": len(ids) + len(out["token_ids"]),
                },
            }
        )
        return answer.model_dump(mode="json", exclude_none=True)


def _conversation_id(request: Request, req: ChatRequest | None = None) -> str | None:
    cid = request.headers.get("x-conversation-id") or (req.conversation_id if req else None)
    if cid is not None and not CONVERSATION_ID.fullmatch(cid):
        raise ProtocolError(f"conversation id {cid!r:.60} must be 1-200 of A-Z a-z 0-9 . _ : -")
    return cid


def mount(app: FastAPI, cfg: ArcticRLClientConfig, call: Callable[[str, dict], Any]) -> OpenAIFront:
    """Adds the OpenAI routes to `app`; `call(op, args)` runs an op with the /v1 routes' checks."""
    front = OpenAIFront(cfg, call)
    token = cfg.auth_token

    def check_auth(request: Request) -> None:
        import hmac

        if token is None:
            return
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
            raise AuthError("missing or wrong API key (the openai client's api_key must be the server's bearer token)")

    def error(e: ArcticRLError) -> JSONResponse:
        # OpenAI's error body, so the client raises its own APIStatusError subclasses with our message
        body = {"error": {"message": str(e), "type": type(e).__name__, "param": None, "code": None}}
        return JSONResponse(body, status_code=e.http_status)

    @app.post(ROUTE)
    async def chat_completions(request: Request):
        try:
            check_auth(request)
            check_content_type(request.headers, ("application/json",))
            # JSON is parsed holding the GIL: capped as the /v1 routes' JSON part is
            body = await read_bytes(request, json_body_limit(cfg), "server.max_json_bytes")
            try:
                req = await run_in_threadpool(ChatRequest.model_validate_json, bytes(body))
            except ValidationError as e:
                first = e.errors()[0]
                where = ".".join(str(x) for x in first["loc"])
                raise ProtocolError(f"chat completion request: {where}: {first['msg']}") from None
            cid = _conversation_id(request, req)
            # on the front's own threads: a completion holds one for its whole generate
            done = await asyncio.get_running_loop().run_in_executor(front.executor, front.complete, req, cid)
            return JSONResponse(done)
        except ArcticRLError as e:
            return error(e)

    @app.get(CONVERSATIONS)
    async def conversation(cid: str, request: Request):
        try:
            check_auth(request)
            if not CONVERSATION_ID.fullmatch(cid):
                raise ProtocolError(f"conversation id {cid!r:.60} must be 1-200 of A-Z a-z 0-9 . _ : -")
            return JSONResponse(front.sample_of(cid))
        except ArcticRLError as e:
            return error(e)

    @app.delete(CONVERSATIONS)
    async def drop(cid: str, request: Request):
        try:
            check_auth(request)
            front.drop(cid)
            return JSONResponse({"ok": True})
        except ArcticRLError as e:
            return error(e)

    return front
