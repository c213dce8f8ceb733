"""The edges of every HTTP request, at the real app over real HTTP (no deployment: what these check happens before
a request reaches one): cross-site requests, DNS rebinding, the client's proof that the server holds its token,
work off the event loop and the concurrency cap, request ids and retries. tests/e2e/test_security_deploy.py shows
the same against a running deployment (the server does not act; a retried forward_backward counts once)."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
import time

import httpx
import pytest
import torch
from served import UvicornThread

from arctic_rl import wire
from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.errors import AuthError

TOKEN = "tok-edges-5ecret-never-sent"
MODEL = "org/model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(port: int = 7000, token: str | None = None, **server) -> ArcticRLClientConfig:
    return ArcticRLClientConfig(
        model_name=MODEL,
        comm_protocol="http",
        port=port,
        auth_token=token,
        vllm_config={"max_seq_len": 512},
        server={"max_n": 8, "max_batch_rows": 64, **server},
    )


class Served(UvicornThread):
    """build_app(None, cfg) served by uvicorn in a thread on cfg's port (a request that got past every check would
    fail at handle None: the tests send none such)."""

    def __init__(self, cfg: ArcticRLClientConfig, tinker: bool = False, handle=None):
        from arctic_rl.server.http import build_app

        super().__init__(build_app(handle, cfg, tinker=tinker), cfg)


# -- cross-site requests ----------------------------------------------------------------------------------------


def test_a_cross_site_text_plain_post_is_refused_and_nothing_runs():
    """A web page can POST text/plain (or a form) to a loopback server without a CORS preflight: refused before any
    op runs (the tokenless default)."""
    from fastapi.testclient import TestClient

    from arctic_rl.server.http import build_app

    stopped = []
    cfg = config()
    app = TestClient(
        build_app(None, cfg, on_shutdown=lambda: stopped.append(1), tinker=True), base_url="http://127.0.0.1:7000"
    )
    save = wire.encode({"path": "xsite"})  # a page can send any bytes as text/plain
    for route, body in (("/v1/shutdown", b""), ("/v1/save_checkpoint", save), ("/api/v1/create_session", b"{}")):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
            headers = {"content-type": ctype} if ctype else {}
            r = app.post(route, content=body, headers=headers)
            assert r.status_code == 415, (route, ctype, r.status_code, r.text[:200])
            assert "content-type" in r.json().get("message", r.json().get("detail", ""))
    assert not stopped


def test_a_foreign_origin_and_a_rebinding_host_are_refused():
    from fastapi.testclient import TestClient

    from arctic_rl.server.http import build_app

    app = TestClient(build_app(None, config(), tinker=True), base_url="http://127.0.0.1:7000")
    ok = {"content-type": wire.CONTENT_TYPE}
    for headers in (
        {"origin": "https://evil.example"},
        {"origin": "http://127.0.0.1.evil.example:7000"},
        {"origin": "null"},
        {"sec-fetch-site": "cross-site"},
        {"host": "evil.example:7000"},  # DNS rebinding: the page's own name, now resolving to 127.0.0.1
        {"host": "127.0.0.1.nip.io:7000"},
    ):
        for method, route in (("POST", "/v1/health"), ("GET", "/healthz"), ("POST", "/api/v1/create_session")):
            r = app.request(method, route, content=b"", headers={**ok, **headers})
            assert r.status_code == 403 and r.json()["type"] == "ForbiddenError", (headers, route, r.text[:200])
    # The bound address and localhost (loopback), and a host listed in server.allowed_hosts, are served.
    for host in ("127.0.0.1:7000", "localhost:7000"):
        assert app.get("/healthz", headers={"host": host}).status_code == 200
    listed = TestClient(build_app(None, config(allowed_hosts=["trainer.lan"])), base_url="http://trainer.lan:7000")
    assert listed.get("/healthz").status_code == 200
    assert listed.get("/healthz", headers={"origin": "http://trainer.lan:7000"}).status_code == 200


def test_the_real_client_and_the_tinker_sdk_pass_the_edges(monkeypatch):
    """The client's requests pass (a bad checkpoint path: answered by the request checks, past the edges); the
    official SDK creates its session and reads the capabilities."""
    import tinker

    from arctic_rl.client.http_transport import REQUEST_ID_HEADER

    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    cfg = config(port=free_port())
    with Served(cfg, tinker=True) as srv:
        r = httpx.post(
            f"{srv.base}/v1/save_checkpoint",
            content=wire.encode({"path": 5}),
            headers={"content-type": wire.CONTENT_TYPE, REQUEST_ID_HEADER: "a1"},
        )
        assert r.status_code == 422 and "checkpoint_root" in r.json()["message"], r.text
        with tinker.ServiceClient(base_url=srv.base, api_key="tml-any-key") as service:
            caps = service.get_server_capabilities()
        assert [m.model_name for m in caps.supported_models] == [MODEL]


# -- the client's token goes only to a server that proves it holds it --------------------------------------------


class Squatter:
    """A plain HTTP server on a port the client means to reach, without the token: answers /healthz, makes up a
    proof (or relays the nonce to `relay_to`), records every request."""

    def __init__(self, relay_to: str | None = None, port: int = 0):
        self.requests: list[tuple[str, str, dict, bytes]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _record(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else b""
                outer.requests.append((self.command, self.path, dict(self.headers), body))

            def _answer(self, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._record()
                if self.path.startswith("/auth/proof") and relay_to:
                    self._answer(httpx.get(relay_to + self.path).json())
                elif self.path.startswith("/auth/proof"):
                    self._answer({"proof": "0" * 64})
                else:
                    self._answer({"ok": True})

            def do_POST(self):
                self._record()
                self._answer({})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _assert_never_got_the_token(squatter: Squatter) -> None:
    assert squatter.requests, "the client never reached the squatter"
    for method, path, headers, body in squatter.requests:
        assert method == "GET", (method, path)  # no op, so no data
        assert TOKEN not in json.dumps(headers) and TOKEN.encode() not in body and TOKEN not in path


def test_a_squatter_on_the_port_never_gets_the_token_or_data():
    from arctic_rl.client.http_transport import HttpTransport

    squatter = Squatter()
    try:
        cfg = config(port=squatter.port, token=TOKEN).model_copy(update={"job_id": "job-squatted"})
        with pytest.raises(AuthError, match=f"did not prove it holds this client's token.*port {squatter.port}"):
            HttpTransport(cfg)
    finally:
        squatter.close()
    _assert_never_got_the_token(squatter)


def test_a_squatter_relaying_the_challenge_to_the_real_server_is_refused_and_the_real_one_passes():
    from arctic_rl.client.http_transport import HttpTransport, proving_transport

    cfg = config(port=free_port(), token=TOKEN)
    with Served(cfg) as srv:
        with httpx.Client(base_url=srv.base, transport=proving_transport(TOKEN)) as http:
            assert http.get("/healthz").status_code == 200  # the real server proves it
        with httpx.Client(base_url=srv.base, transport=proving_transport("another-token")) as http:
            with pytest.raises(AuthError):
                http.get("/healthz")
        squatter = Squatter(relay_to=srv.base)  # gets the real server's proof, for the real server's port
        try:
            with pytest.raises(AuthError, match="did not prove"):
                HttpTransport(config(port=squatter.port, token=TOKEN).model_copy(update={"job_id": "job-relayed"}))
        finally:
            squatter.close()
    _assert_never_got_the_token(squatter)
    assert any(p.startswith("/auth/proof") for _, p, _, _ in squatter.requests)


class Controller:
    """What the client's start-up asks the controller (`reconnect_config`, `health`), answered without engines."""

    def __init__(self, cfg: ArcticRLClientConfig):
        self.cfg, self.dispatch, self.ops = cfg, self, []

    def remote(self, op: str, args: dict):
        import concurrent.futures
        import types

        self.ops.append(op)
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(self.cfg.to_json() if op == "reconnect_config" else {"ok": True})
        return types.SimpleNamespace(future=lambda: done)


class Relay:
    """Another user's listener on [::1]:port, beside a server on 127.0.0.1:port: every connection relayed byte
    for byte to the server (the proof exchange included), what the client sends recorded."""

    def __init__(self, port: int):
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        self.sock.bind(("::1", port))
        self.sock.listen()
        self.port, self.received, self.connections = port, bytearray(), 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool):
        try:
            while data := src.recv(65536):
                if record:
                    self.received += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine: the relay cannot listen there")
def test_a_relay_on_the_other_loopback_address_of_the_port_never_gets_the_token():
    """The server on 127.0.0.1:P; another user's listener on [::1]:P, relaying every byte to it. A client that
    reaches [::1]:P (what `localhost` or any dual-stack name resolves to first on many machines) got the real
    server's proof for port P through the relay, and sent its token. The proof names the address too: refused."""
    from arctic_rl.client.http_transport import HttpTransport

    cfg = config(port=free_port(), token=TOKEN)
    with Served(cfg, handle=Controller(cfg)):
        relay = Relay(cfg.port)
        try:
            client = config(port=cfg.port, token=TOKEN).model_copy(update={"host": "[::1]", "job_id": "job-relayed"})
            with pytest.raises(AuthError, match=r"server at \[::1\]:\d+ .*did not prove"):
                HttpTransport(client)
        finally:
            relay.close()
        assert relay.connections and b"/auth/proof" in relay.received  # the client did reach the relay
        assert TOKEN.encode() not in relay.received and b"/v1/" not in relay.received
        direct = HttpTransport(cfg.model_copy(update={"job_id": "job-direct"}))  # 127.0.0.1: the server itself
        assert direct.config.job_id == cfg.job_id
        direct.close()


def test_a_reconnect_proves_the_server_again_before_the_token_goes():
    """The proof holds for one connection: once it drops, the next one proves itself again before any request goes
    on it. The server stops and another process takes its address and port: the client's next call reaches it, and
    it gets a nonce and nothing else. The server back on the port: the client goes on."""
    from arctic_rl.client.http_transport import HttpTransport

    cfg = config(port=free_port(), token=TOKEN)
    controller = Controller(cfg)
    with Served(cfg, handle=controller):
        client = HttpTransport(cfg.model_copy(update={"job_id": "job-reconnected"}))
        assert client.call("health") == {"ok": True}
    squatter = Squatter(port=cfg.port)  # the same address and port, now another process's
    try:
        with pytest.raises(AuthError, match="did not prove"):
            client.call("health")
    finally:
        squatter.close()
    _assert_never_got_the_token(squatter)
    with Served(cfg, handle=controller):
        assert client.call("health") == {"ok": True}
    client.close()
    assert controller.ops == ["reconnect_config", "health", "health"]


# -- work off the event loop; the concurrency cap ---------------------------------------------------------------


def test_requests_over_the_concurrency_cap_get_503_and_healthz_still_answers():
    cfg = config(port=free_port(), max_concurrent_requests=1)
    with Served(cfg) as srv:
        # A client that sends its body slowly holds a slot meanwhile: headers and half a body, then nothing.
        slow = socket.create_connection(("127.0.0.1", cfg.port))
        body = wire.encode({})
        head = f"POST /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{cfg.port}\r\ncontent-type: {wire.CONTENT_TYPE}\r\n"
        slow.sendall(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body[:4])
        try:
            headers = {"content-type": wire.CONTENT_TYPE}
            deadline = time.time() + 30
            while True:  # until the server took the slow request in
                r = httpx.post(f"{srv.base}/v1/health", content=body, headers=headers, timeout=10)
                if r.status_code == 503 or time.time() > deadline:
                    break
                time.sleep(0.05)
            assert r.status_code == 503 and r.json()["type"] == "ServerBusyError", r.text[:300]
            assert "max_concurrent_requests=1" in r.json()["message"] and r.headers["retry-after"] == "1"
            assert httpx.get(f"{srv.base}/healthz", timeout=10).status_code == 200
        finally:
            slow.close()


def test_bodies_held_at_once_are_bounded_across_requests():
    """A request whose body would take the bodies held by requests in flight past server.max_inflight_body_bytes is
    a 503 naming it (main took every body: 64 of 1 GiB); once the holder is gone the same request is served."""
    cfg = config(port=free_port(), max_body_bytes=4096, max_inflight_body_bytes=4096)
    with Served(cfg) as srv:
        # A client that declares 3000 bytes and sends 100 holds its share meanwhile.
        slow = socket.create_connection(("127.0.0.1", cfg.port))
        head = (
            f"POST /v1/save_checkpoint HTTP/1.1\r\nHost: 127.0.0.1:{cfg.port}\r\ncontent-type: {wire.CONTENT_TYPE}\r\n"
        )
        slow.sendall(f"{head}content-length: 3000\r\n\r\n".encode() + b"x" * 100)
        body = wire.encode({"path": 5, "pad": "p" * 1500})  # 4xx past the edges: an unknown argument
        headers = {"content-type": wire.CONTENT_TYPE}
        try:
            deadline = time.time() + 30
            while True:  # until the server took the slow request in
                r = httpx.post(f"{srv.base}/v1/save_checkpoint", content=body, headers=headers, timeout=10)
                if r.status_code == 503 or time.time() > deadline:
                    break
                time.sleep(0.05)
            assert r.status_code == 503 and r.json()["type"] == "ServerBusyError", r.text[:300]
            assert "server.max_inflight_body_bytes" in r.json()["message"] and "4096" in r.json()["message"]
            small = wire.encode({"path": 5})  # fits beside the slow one's 3000 bytes
            r = httpx.post(f"{srv.base}/v1/save_checkpoint", content=small, headers=headers, timeout=10)
            assert r.status_code == 422, r.text[:300]
        finally:
            slow.close()
        deadline = time.time() + 30
        while True:  # the slow one's share is given back when its request ends
            r = httpx.post(f"{srv.base}/v1/save_checkpoint", content=body, headers=headers, timeout=10)
            if r.status_code != 503 or time.time() > deadline:
                break
            time.sleep(0.05)
        assert 400 <= r.status_code < 500 and r.status_code != 503, r.text[:300]


# -- connections: a head timeout, a connection limit, a head size limit -----------------------------------------


def _closed_by_server(s: socket.socket) -> bytes:
    """What the server sent before it closed `s` (b"" for nothing); a socket timeout if it never closes it."""
    s.settimeout(60)
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    return got


def test_connections_that_send_no_whole_head_are_closed():
    """Connections that send nothing, or half a request head, are closed after server.http_head_timeout_s (main kept
    all of them open for good); a request on a new connection is served meanwhile."""
    cfg = config(port=free_port(), http_head_timeout_s=0.5)
    with Served(cfg) as srv:
        idle = [socket.create_connection(("127.0.0.1", cfg.port)) for _ in range(10)]
        half = socket.create_connection(("127.0.0.1", cfg.port))
        half.sendall(f"POST /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{cfg.port}\r\ncontent-".encode())
        try:
            assert httpx.get(f"{srv.base}/healthz", timeout=10).status_code == 200
            for s in [*idle, half]:
                assert _closed_by_server(s) == b""
        finally:
            for s in [*idle, half]:
                s.close()
        with httpx.Client(base_url=srv.base, timeout=10) as client:  # a kept-alive client's requests still pass
            assert [client.get("/healthz").status_code for _ in range(3)] == [200] * 3


def test_connections_past_the_limit_and_heads_past_their_size_are_refused_naming_the_limit():
    """One connection past server.max_connections is answered 503 naming it and closed (main accepted and kept every
    one); a request head past server.max_head_bytes is a 413 naming it, closed (main's httptools parser has no head
    limit). Once connections close, new ones are served."""
    cfg = config(port=free_port(), max_connections=4, max_head_bytes=2048)
    with Served(cfg) as srv:
        held = [socket.create_connection(("127.0.0.1", cfg.port)) for _ in range(4)]
        extra = socket.create_connection(("127.0.0.1", cfg.port))
        try:
            got = _closed_by_server(extra)
            assert got.startswith(b"HTTP/1.1 503") and b"server.max_connections=4" in got, got[:300]
        finally:
            extra.close()
            for s in held:
                s.close()
        deadline = time.time() + 30
        while True:  # the held ones are gone once the server saw them close
            try:
                r = httpx.get(f"{srv.base}/healthz", timeout=10)
            except httpx.TransportError:
                r = None
            if r is not None and r.status_code == 200 or time.time() > deadline:
                break
            time.sleep(0.05)
        assert r is not None and r.status_code == 200
        big = socket.create_connection(("127.0.0.1", cfg.port))
        try:
            big.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{cfg.port}\r\n".encode() + b"x-pad: y\r\n" * 400)
            got = _closed_by_server(big)
            assert got.startswith(b"HTTP/1.1 413") and b"server.max_head_bytes" in got, got[:300]
        finally:
            big.close()


# -- request ids: the client sends one and sends it again; the server keeps answers within bounds ----------------


class DropsTheFirstAnswer(http.server.BaseHTTPRequestHandler):
    """An arctic-rl-speaking server whose first forward_backward answer is lost (the connection closes)."""

    seen: list[dict] = []

    def log_message(self, *args):
        pass

    def _send(self, data: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(b'{"ok": true}', "application/json")

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        if self.path == "/v1/reconnect_config":
            return self._send(wire.encode(config(port=self.server.server_address[1]).to_json()), wire.CONTENT_TYPE)
        type(self).seen.append(dict(self.headers))
        if len(type(self).seen) == 1:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send(wire.encode({"loss": 1.0}), wire.CONTENT_TYPE)


def test_the_client_sends_a_request_again_with_the_same_id_when_its_answer_is_lost():
    from arctic_rl.client.http_transport import REQUEST_ID_HEADER, HttpTransport

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), DropsTheFirstAnswer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        t = HttpTransport(config(port=server.server_address[1]).model_copy(update={"job_id": "job-drops"}))
        assert t.call("forward_backward", batch={"input_ids": torch.ones(1, 2)}) == {"loss": 1.0}
        first = t.call("optimizer_step")
    finally:
        server.shutdown()
        server.server_close()
    ids = [h.get(REQUEST_ID_HEADER) for h in DropsTheFirstAnswer.seen]
    assert len(ids) == 3 and ids[0] and ids[0] == ids[1], ids  # the lost one, sent again with its id
    assert ids[2] != ids[0] and first == {"loss": 1.0}  # the next request: a new id


def test_the_result_cache_is_bounded_by_count_bytes_and_age(monkeypatch):
    from arctic_rl.server import edges
    from arctic_rl.server.edges import Answer, ResultCache

    now = [1000.0]
    monkeypatch.setattr(edges.time, "monotonic", lambda: now[0])

    async def scenario():
        cache = ResultCache(max_entries=3, max_bytes=250, max_age_s=60)

        def done(rid: str, size: int):
            cache.start(rid, "d").answer.set_result(Answer(200, b"x" * size, "t"))

        running = cache.start("running", "d")  # never done: never dropped
        for i in range(4):
            done(f"r{i}", 10)
        cache.prune()
        assert list(cache.entries) == ["running", "r2", "r3"]  # count: the oldest done ones went first
        done("big", 240)
        cache.prune()
        assert "running" in cache.entries and "big" in cache.entries and cache.get("r2") is None  # bytes
        now[0] += 61
        assert cache.get("big") is None and cache.get("running") is running  # age: done ones only
        running.answer.cancel()

    asyncio.run(scenario())


# -- parsing that holds the GIL is capped on every front --------------------------------------------------------


def _model_config(model, **server) -> ArcticRLClientConfig:
    return ArcticRLClientConfig(
        model_name=str(model),
        comm_protocol="http",
        vllm_config={"max_seq_len": 512},
        server={"max_n": 8, "max_batch_rows": 64, **server},
    )


def test_the_tensor_parts_json_header_counts_against_max_json_bytes():
    """The safetensors header inside a /v1 message is JSON too, parsed holding the GIL: a message whose JSON tree is
    small but whose tensor header is 20 KB is refused with max_json_bytes=1024, naming it (main took it)."""
    import struct

    from fastapi.testclient import TestClient
    from safetensors.torch import save as st_save

    from arctic_rl.server.http import build_app

    app = TestClient(build_app(None, config(max_json_bytes=1024)), base_url="http://127.0.0.1:7000")
    tree = json.dumps({"batch": {"__tensor__": "t0"}}).encode()
    blob = st_save({"t0": torch.zeros(2, dtype=torch.int64)}, metadata={"pad": "x" * 20_000})
    body = struct.pack("<Q", len(tree)) + tree + blob
    r = app.post("/v1/log_probs", content=body, headers={"content-type": wire.CONTENT_TYPE})
    assert r.status_code == 400 and r.json()["type"] == "ProtocolError", r.text[:300]
    assert "server.max_json_bytes" in r.json()["message"] and "1024" in r.json()["message"], r.text[:300]
    # within the cap, the same layout decodes (and is then checked as a request)
    small = struct.pack("<Q", len(tree)) + tree + st_save({"t0": torch.zeros(2, dtype=torch.int64)})
    r = app.post("/v1/log_probs", content=small, headers={"content-type": wire.CONTENT_TYPE})
    assert r.status_code == 422 and "max_json_bytes" not in r.json()["message"], r.text[:300]


def test_tinker_and_openai_json_bodies_are_capped_at_max_json_bytes(tiny_llama):
    """A Tinker JSON body and an OpenAI chat body over server.max_json_bytes are refused (413) naming it, before
    they are parsed; main capped them at max_body_bytes only (1 GiB). Protobuf Tinker bodies keep max_body_bytes."""
    from fastapi.testclient import TestClient

    from arctic_rl.server.http import build_app

    cfg = _model_config(tiny_llama, max_json_bytes=1024, openai=True)
    app = TestClient(build_app(None, cfg, tinker=True), base_url="http://127.0.0.1:7000")
    fat = {"tags": ["t" * 100] * 20, "user_metadata": None, "sdk_version": "0.38.0"}
    r = app.post("/api/v1/create_session", json=fat)
    assert r.status_code == 413 and "server.max_json_bytes" in r.json()["detail"], r.text[:300]
    r = app.post("/api/v1/create_session", json={**fat, "tags": []})
    assert r.status_code == 200, r.text[:300]
    chat = {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}], "max_tokens": 4}
    r = app.post("/v1/chat/completions", json=chat)
    assert r.status_code == 413 and "server.max_json_bytes" in r.json()["error"]["message"], r.text[:300]


def test_asample_checks_its_prompt_off_the_event_loop_and_its_length_first(tiny_llama, monkeypatch):
    """asample's prompt checks walk every token: they run in a worker thread, not on the event loop (main ran them on
    the loop), and an over-long prompt is refused by its length before its tokens are walked (main walked them
    first, and named a bad token id instead)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from tinker import types

    from arctic_rl.server import tinker_api
    from arctic_rl.server.http import read_bytes

    cfg = _model_config(tiny_llama)
    app = FastAPI()
    tinker_api.mount(app, cfg, lambda op, args: [], lambda r: read_bytes(r, cfg.server.max_body_bytes))
    client = TestClient(app)
    where: list[str] = []
    check = tinker_api.TinkerFront.check_sample

    def spy(self, req):
        try:
            asyncio.get_running_loop()
            where.append("event loop")
        except RuntimeError:
            where.append("worker thread")
        return check(self, req)

    monkeypatch.setattr(tinker_api.TinkerFront, "check_sample", spy)
    r = client.post("/api/v1/create_session", json={"tags": [], "user_metadata": None, "sdk_version": "0.38.0"})
    session = r.json()["session_id"]
    r = client.post(
        "/api/v1/create_sampling_session",
        json={"session_id": session, "sampling_session_seq_id": 0, "base_model": str(tiny_llama)},
    )
    body = {
        "sampling_session_id": r.json()["sampling_session_id"],
        "seq_id": 0,
        "num_samples": 1,
        "prompt": types.ModelInput.from_ints([1] * 511 + [10**6]).model_dump(mode="json"),  # 512 tokens, one bad
        "sampling_params": {"max_tokens": 4},
    }
    r = client.post("/api/v1/asample", json=body)
    assert r.status_code == 422 and "has 512 tokens" in r.json()["detail"], r.text[:300]
    assert "max_seq_len=512" in r.json()["detail"]
    assert where == ["worker thread"]
