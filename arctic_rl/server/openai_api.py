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
recorded. The most recent MAX_CONVERSATIONS records are kept.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
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
from arctic_rl.errors import ArcticRLError, AuthError, ProtocolError
from arctic_rl.server.edges import check_content_type, json_body_limit, read_bytes

ROUTE = ops.ROUTE_PREFIX + "/chat/completions"  # OpenAI's path under the base URL .../v1
CONVERSATIONS = ops.ROUTE_PREFIX + "/conversations/{cid}"
MAX_CONVERSATIONS = 4096
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


def _turn(message: dict) -> tuple[str, str]:
    role = message.get("role")
    if not isinstance(role, str) or role not in ("system", "user", "assistant", "tool", "developer"):
        raise ProtocolError(f"message role must be system, user, assistant, tool or developer, got {role!r:.40}")
    return role, _text(message.get("content"))


@dataclass
class Record:
    turns: list[tuple[str, str]]  # the conversation so far: (role, text), answers included
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    answers: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self) -> dict:
        return {
            "prompt_token_ids": list(self.prompt),
            "token_ids": list(self.tokens),
            "loss_mask": list(self.mask),
            "logprobs": list(self.logprobs),
            "num_turns": self.answers,
        }


class OpenAIFront:
    def __init__(self, cfg: ArcticRLClientConfig, call: Callable[[str, dict], Any]):
        from transformers import AutoTokenizer

        self.cfg, self.call = cfg, call
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_name)
        self.template = ObservationTemplate(self.tokenizer)
        self.records: OrderedDict[str, Record] = OrderedDict()
        self.lock = threading.Lock()

    def record(self, cid: str | None, turns: list[tuple[str, str]], req: ChatRequest) -> tuple[Record, list[int]]:
        """The conversation's record (a fresh one for a new id, or none) and the new messages' tokens."""
        with self.lock:
            rec = self.records.get(cid) if cid else None
            if rec is not None:
                self.records.move_to_end(cid)  # type: ignore[arg-type]
        if rec is None:
            tools: list[Any] | None = list(req.tools) if req.tools else None
            text = self.tokenizer.apply_chat_template(
                req.messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
            rec = Record(turns=[], prompt=list(self.tokenizer(text, add_special_tokens=False)["input_ids"]))
            if cid:
                with self.lock:
                    self.records[cid] = rec
                    while len(self.records) > MAX_CONVERSATIONS:
                        self.records.popitem(last=False)
            return rec, []
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
        messages = [m for m in req.messages[len(rec.turns) :]]
        ids = [] if rec.tokens and rec.tokens[-1] == self.template.eos_id else [self.template.eos_id]
        return rec, ids + self.template.messages_ids(messages)

    def complete(self, req: ChatRequest, cid: str | None) -> dict:
        if req.n != 1:
            raise ProtocolError(f"n={req.n}: this front answers one choice per request (send n=1)")
        turns = [_turn(m) for m in req.messages]
        rec, new = self.record(cid, turns, req)
        with rec.lock:  # one request of a conversation at a time: its record grows in order
            ids = rec.prompt + rec.tokens + new
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
            out = self.call("generate", args)[0]
            if cid:
                rec.tokens += new
                rec.mask += [0] * len(new)
                rec.logprobs += [0.0] * len(new)
                rec.tokens += list(out["token_ids"])
                rec.mask += [1] * len(out["token_ids"])
                rec.logprobs += list(out.get("logprobs") or [0.0] * len(out["token_ids"]))
                rec.turns = [*turns, ("assistant", out["text"])]
                rec.answers += 1
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

    def get(self, cid: str) -> Record:
        with self.lock:
            rec = self.records.get(cid)
        if rec is None:
            raise ProtocolError(
                f"no conversation {cid!r:.60} is recorded (an id is kept until {MAX_CONVERSATIONS} newer)"
            )
        return rec


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
            return JSONResponse(await run_in_threadpool(front.complete, req, _conversation_id(request, req)))
        except ArcticRLError as e:
            return error(e)

    @app.get(CONVERSATIONS)
    async def conversation(cid: str, request: Request):
        try:
            check_auth(request)
            if not CONVERSATION_ID.fullmatch(cid):
                raise ProtocolError(f"conversation id {cid!r:.60} must be 1-200 of A-Z a-z 0-9 . _ : -")
            return JSONResponse(front.get(cid).sample())
        except ArcticRLError as e:
            return error(e)

    @app.delete(CONVERSATIONS)
    async def drop(cid: str, request: Request):
        try:
            check_auth(request)
            with front.lock:
                front.records.pop(cid, None)
            return JSONResponse({"ok": True})
        except ArcticRLError as e:
            return error(e)

    return front
