"""The OpenAI front's limits at its real routes (FastAPI and uvicorn, served over real HTTP), without a deployment: the
op that would reach the sampler is a stand-in that runs the /v1 routes' checks (requests.check_request, as the
server's own call does) and answers a fixed sample, or waits on a gate the test opens. tests/e2e/test_loop.py's
check_openai_front drives the same front with the official openai client against a deployment."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from served import UvicornThread

from arctic_rl.config import ArcticRLClientConfig, model_vocab_size
from arctic_rl.server.requests import check_request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sampler:
    """What `call` reaches: the /v1 checks, then a two-token answer; `gate` closed: each call waits for it."""

    def __init__(self, cfg: ArcticRLClientConfig):
        from transformers import AutoTokenizer

        self.cfg, self.vocab = cfg, model_vocab_size(cfg.model_name, cfg.model_overrides)
        tok = AutoTokenizer.from_pretrained(cfg.model_name)
        self.answer = tok("ok", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = 0  # calls waiting at the gate
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, op: str, args: dict):
        check_request(op, args, self.cfg, self.vocab)
        with self.lock:
            self.calls += 1
            self.waiting += 1
        try:
            assert self.gate.wait(120), "the test never opened the gate"
        finally:
            with self.lock:
                self.waiting -= 1
        n = len(self.answer)
        return [{"token_ids": list(self.answer), "text": "ok", "logprobs": [-0.5] * n, "finish_reason": "stop"}]

    def wait_for(self, waiting: int) -> None:
        deadline = time.time() + 60
        while self.waiting < waiting:
            assert time.time() < deadline, f"{self.waiting} calls at the gate, expected {waiting}"
            time.sleep(0.02)


class Served(UvicornThread):
    """The OpenAI routes (and, with tinker=True, the Tinker ones) on one FastAPI app, served by uvicorn as
    `arctic-rl serve` runs it."""

    def __init__(self, cfg: ArcticRLClientConfig, tinker: bool = False):
        from fastapi import FastAPI

        from arctic_rl.server import openai_api, tinker_api
        from arctic_rl.server.http import read_bytes

        self.sampler = Sampler(cfg)
        app = FastAPI()
        self.front = openai_api.mount(app, cfg, self.sampler)
        if tinker:
            tinker_api.mount(app, cfg, self.sampler, lambda r: read_bytes(r, cfg.server.max_body_bytes))
        super().__init__(app, cfg)

    def __exit__(self, *exc):
        self.sampler.gate.set()
        super().__exit__(*exc)

    def chat(self, messages: list[dict], cid: str | None = None, timeout: float = 60, **params) -> httpx.Response:
        headers = {"x-conversation-id": cid} if cid else {}
        body = {"model": "tiny", "messages": messages, "max_tokens": 4, **params}
        return httpx.post(f"{self.base}/v1/chat/completions", json=body, headers=headers, timeout=timeout)

    def record(self, cid: str) -> httpx.Response:
        return httpx.get(f"{self.base}/v1/conversations/{cid}", timeout=30)


def _config(model, **server) -> ArcticRLClientConfig:
    return ArcticRLClientConfig(
        model_name=str(model),
        comm_protocol="http",
        port=free_port(),
        vllm_config={"max_seq_len": 1024},
        server={"openai": True, **server},
    )


USER = [{"role": "user", "content": "how many artists are there"}]


def test_only_accepted_requests_are_recorded(tiny_llama):
    """A refused first request leaves no record (main kept it: 20 refused requests left 27 MB); a refused later one
    leaves its conversation's record as it was; an accepted one is recorded."""
    with Served(_config(tiny_llama)) as srv:
        r = srv.chat(USER, "c1", max_tokens=10**6)
        assert r.status_code == 422 and "max_tokens" in r.json()["error"]["message"], r.text[:300]
        r = srv.record("c1")
        assert r.status_code == 400 and "no conversation 'c1'" in r.json()["error"]["message"], r.text[:300]
        for i in range(20):  # long refused prompts leave nothing held
            assert srv.chat([{"role": "user", "content": "w " * 2000}], f"big{i}").status_code == 422
        assert not srv.front.records and srv.front.held == 0
        assert srv.chat(USER, "c1").status_code == 200
        first = srv.record("c1").json()
        assert first["num_turns"] == 1 and sum(first["loss_mask"]) == len(srv.sampler.answer)
        more = [*USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and albums?"}]
        r = srv.chat(more, "c1", stop=["x"] * 1000)
        assert r.status_code == 422 and "server.max_stops" in r.json()["error"]["message"], r.text[:300]
        assert srv.record("c1").json() == first
        assert srv.chat(more, "c1").status_code == 200 and srv.record("c1").json()["num_turns"] == 2


def test_max_prompt_chars_applies_before_the_template_reads_the_messages(tiny_llama):
    """The messages' and tools' characters are bounded by server.max_prompt_chars before the chat template or the
    tokenizer reads them, as /v1 bounds a string prompt (main applied none: the request was answered)."""
    with Served(_config(tiny_llama, max_prompt_chars=1000)) as srv:
        r = srv.chat([{"role": "system", "content": "s" * 600}, {"role": "user", "content": "u" * 401}], "c")
        assert r.status_code == 422, r.text[:300]
        message = r.json()["error"]["message"]
        assert "1001 characters" in message and "at most 1000 (server.max_prompt_chars)" in message, message
        tools = [{"type": "function", "function": {"name": "f", "description": "d" * 1000}}]
        r = srv.chat(USER, tools=tools)
        assert r.status_code == 422 and "server.max_prompt_chars" in r.json()["error"]["message"], r.text[:300]
        assert srv.sampler.calls == 0 and not srv.front.records
        assert srv.chat([{"role": "user", "content": "u" * 900}], "c").status_code == 200


def test_records_are_bounded_by_the_tokens_they_hold(tiny_llama):
    """Past server.openai_max_record_tokens the least recently used records are dropped (main bounded them by count
    only, 4096 of any size); the total held is what the records hold."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)

    def ask(i: int) -> list[dict]:
        return [{"role": "user", "content": f"question {i}"}]

    one = len(tok.apply_chat_template(ask(0), tokenize=True, add_generation_prompt=True, return_dict=False)) + 3
    with Served(_config(tiny_llama, openai_max_record_tokens=int(3.5 * one))) as srv:
        sizes = {}
        for i in range(6):
            assert srv.chat(ask(i), f"c{i}").status_code == 200
            if i == 2:  # c0 continued: the least recently used is c1 now
                more = [*ask(0), {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
                assert srv.chat(more, "c0").status_code == 200
        for cid in list(srv.front.records):
            rec = srv.record(cid).json()
            sizes[cid] = len(rec["prompt_token_ids"]) + len(rec["token_ids"])
        kept = list(srv.front.records)
        assert srv.front.held == sum(sizes.values()) <= int(3.5 * one), (kept, sizes, one)
        assert kept[-1] == "c5" and "c1" not in kept and len(kept) < 6, kept
        assert srv.record("c1").status_code == 400
        assert "server.openai_max_record_tokens" in srv.record("c1").json()["error"]["message"]


def test_a_conversation_s_next_request_waits_a_bounded_time(tiny_llama):
    """While a request of a conversation runs, the next one waits server.openai_conversation_wait_s, then is a 503
    naming it (main waited without a bound, a worker thread held meanwhile); the running one completes."""
    with Served(_config(tiny_llama, openai_conversation_wait_s=0.2)) as srv:
        assert srv.chat(USER, "c").status_code == 200
        more = [*USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and albums?"}]
        srv.sampler.gate.clear()
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(srv.chat, more, "c")
            srv.sampler.wait_for(1)
            r = srv.chat(more, "c", timeout=30)
            assert r.status_code == 503 and r.json()["error"]["type"] == "ServerBusyError", r.text[:300]
            assert "server.openai_conversation_wait_s" in r.json()["error"]["message"]
            srv.sampler.gate.set()
            assert running.result().status_code == 200
        assert srv.record("c").json()["num_turns"] == 2


def test_slow_completions_leave_the_shared_threads_to_the_other_routes(tiny_llama):
    """More completions than the server's shared thread pool has threads wait in the sampler: a Tinker session and
    its heartbeat (parsed on that pool) are still answered meanwhile (on main the completions held every thread of
    it, and the heartbeat waited for them); once the sampler answers, every completion is answered."""
    import anyio
    import anyio.to_thread

    async def pool_size() -> int:  # starlette's run_in_threadpool takes its threads from anyio's default limiter
        return int(anyio.to_thread.current_default_thread_limiter().total_tokens)

    shared = anyio.run(pool_size)
    cfg = _config(tiny_llama)
    with Served(cfg, tinker=True) as srv:
        srv.sampler.gate.clear()
        with ThreadPoolExecutor(shared + 5) as pool:
            slow = [pool.submit(srv.chat, USER, None, 120) for _ in range(shared + 5)]
            srv.sampler.wait_for(min(shared, cfg.server.openai_max_concurrent))
            hello = {"tags": [], "user_metadata": None, "sdk_version": "0.38.0"}
            r = httpx.post(f"{srv.base}/api/v1/create_session", json=hello, timeout=30)
            assert r.status_code == 200, r.text[:300]
            beat = {"session_id": r.json()["session_id"]}
            r = httpx.post(f"{srv.base}/api/v1/session_heartbeat", json=beat, timeout=30)
            assert r.status_code == 200, r.text[:300]
            assert not any(f.done() for f in slow)
            srv.sampler.gate.set()
            assert [f.result().status_code for f in slow] == [200] * len(slow)


@pytest.mark.parametrize(
    "key,value",
    [("openai_max_record_tokens", 0), ("openai_conversation_wait_s", -1), ("openai_max_concurrent", 0)],
)
def test_the_openai_limits_are_checked_naming_the_key(tiny_llama, key, value):
    from arctic_rl.errors import ConfigError

    with pytest.raises(ConfigError, match=f"server.{key}"):
        _config(tiny_llama, **{key: value})
