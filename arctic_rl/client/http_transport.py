"""HTTP transport: `POST /v1/<op>` (arctic_rl.ops.route) with wire messages. With no server at host:port (and no job_id),
starts `arctic-rl serve` on this machine and waits for it.

With a token, the server first proves it holds it, on every connection (arctic_rl/handshake.py): until it has, no
request goes on that connection, so none carries the token or any data to a server that has not. Every request carries a fresh id (REQUEST_ID_HEADER); a request whose answer was lost
(connection dropped, read timeout) is sent again with the same id, and the server answers it from the first
run instead of running it again (a retried forward_backward never doubles the gradient)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import h11
import httpcore
import httpx

from arctic_rl import handshake, ops, wire
from arctic_rl.config import TOKEN_ENV, ArcticRLClientConfig, state_dir
from arctic_rl.errors import ERRORS, ArcticRLError, AuthError, EngineDeadError

REQUEST_ID_HEADER = "x-arctic-rl-request-id"  # the server's (arctic_rl/server/http.py; the client imports no server)
RETRIES = 2  # sends of a request again after its answer was lost, with the same id
# The server answers a request that outlives request_timeout_s itself (504): wait that long and a little more.
TIMEOUT_MARGIN_S = 30.0


def _server_log(config: ArcticRLClientConfig) -> Path:
    d = state_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    host = "".join(c if c.isalnum() or c in ".-" else "_" for c in config.host)
    return d / f"server-{host}-{config.port}.log"


def _follow(log, proc: subprocess.Popen, deadline: float):
    """Lines of a log file another process writes, until it exits (then the rest) or the deadline."""
    pending = ""
    while True:
        chunk = log.readline()
        if chunk:
            pending += chunk
            if pending.endswith("\n"):
                yield pending.rstrip("\n")
                pending = ""
            continue
        if proc.poll() is not None:
            rest = pending + log.read()
            yield from rest.splitlines()
            return
        if time.time() > deadline:
            return
        time.sleep(0.1)


PROOF_BODY_LIMIT = 4096  # bytes of a proof answer read: a JSON object with one 64-hex-digit string


def prove_connection(stream: httpcore.NetworkStream, token: str, host: str, timeout: float | None) -> None:
    """Raises AuthError unless the server at the other end of `stream` (a new connection, nothing sent on it yet)
    proves it holds `token` for the address and port this connection reached (arctic_rl/handshake.py). Sends a nonce
    only: no token, no data. The exchange is one plain HTTP/1.1 request and its answer; the connection is then left
    at a request boundary for the requests it is opened for."""
    peer = stream.get_extra_info("server_addr")
    addr, port = (handshake.address(str(peer[0])), int(peer[1])) if peer else ("?", 0)
    where = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"

    def refused(why: str) -> AuthError:
        return AuthError(
            f"the server at {where} (reached for host {host!r}) did not prove it holds this client's token ({why}): a "
            f"wrong token, or not the arctic-rl server meant (another process may hold port {port} on that address, "
            "or relay to the server from it); nothing was sent to it"
        )

    if peer is None:
        raise refused("no address for the connection")
    nonce = handshake.new_nonce()
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method="GET",
        target=f"{handshake.PROOF_ROUTE}?nonce={nonce}",
        headers=[("host", f"[{host}]:{port}" if ":" in host else f"{host}:{port}"), ("accept", "application/json")],
    )
    stream.write(conn.send(request) + conn.send(h11.EndOfMessage()), timeout)
    status, body = 0, b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(stream.read(PROOF_BODY_LIMIT, timeout))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > PROOF_BODY_LIMIT:
                    raise refused(f"an answer over {PROOF_BODY_LIMIT} bytes")
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
    except h11.RemoteProtocolError as e:
        raise refused(f"not an HTTP answer: {e}") from None
    try:
        answer = json.loads(body).get("proof") if status == 200 else None
    except (ValueError, AttributeError):
        answer = None
    if not handshake.verify(token, nonce, addr, port, answer):
        raise refused(f"HTTP {status}, no valid proof for {where}" if status else "no answer")
    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
        raise refused("it closed the connection after its proof")


class ProvingBackend(httpcore.NetworkBackend):
    """httpcore's own socket backend, with every new connection proved (prove_connection) before httpcore sends
    anything on it: the first request, and every reconnect after a connection dropped."""

    def __init__(self, token: str) -> None:
        self.token, self.inner = token, httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = self.inner.connect_tcp(host, port, timeout, local_address, socket_options)
        try:
            prove_connection(stream, self.token, host, timeout)
        except BaseException:
            stream.close()
            raise
        return stream

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise AuthError(f"a token is proved over TCP only, not to unix socket {path!r}")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


def proving_transport(token: str) -> httpx.HTTPTransport:
    """httpx's transport whose connections each prove the token first (ProvingBackend). No proxy: the proof is
    of the server at the other end of the socket."""
    limits = httpx.Limits()  # httpx's defaults, as the transport would have them
    transport = httpx.HTTPTransport(trust_env=False, limits=limits)
    transport._pool = httpcore.ConnectionPool(  # httpx builds its pool without a way to name the backend
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=ProvingBackend(token),
    )
    return transport


def base_url(host: str, port: int) -> str:
    """http://host:port, an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host and not host.startswith("[") else f"http://{host}:{port}"


class HttpTransport:
    def __init__(self, config: ArcticRLClientConfig):
        self.base = base_url(config.host, config.port)
        # The token: the config's, else ARCTIC_RL_TOKEN (a config read back from a record or a server
        # never holds one).
        self.token = config.auth_token or os.environ.get(TOKEN_ENV) or None
        # With a token, every connection proves the server at its other end holds it before anything is sent on
        # it (ProvingBackend), so the token may ride in every request's headers.
        self.http = httpx.Client(
            base_url=self.base,
            timeout=config.request_timeout_s + TIMEOUT_MARGIN_S,
            transport=proving_transport(self.token) if self.token else None,
            headers={"authorization": f"Bearer {self.token}"} if self.token else None,
        )
        self.proc: subprocess.Popen | None = None
        if not self._alive():
            if config.job_id is not None:
                raise EngineDeadError(f"no arctic-rl server answers at {self.base} (job {config.job_id})")
            self._start_server(config)
        self.config = ArcticRLClientConfig.from_json(self.call("reconnect_config")).model_copy(
            update={"auth_token": self.token}
        )

    def _alive(self) -> bool:
        try:
            return self.http.get("/healthz", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    def _start_server(self, config: ArcticRLClientConfig) -> None:
        t0 = time.time()
        print(f"[arctic-rl] starting server on {self.base} ...", file=sys.stderr, flush=True)
        python, env = sys.executable, dict(os.environ)
        if config.server_python:
            # Another environment: never the Ray this process may be a worker of (another Ray version), but the
            # job's own Ray where a launcher gave one (ARCTIC_RL_RAY_ENV, set by jobs.bootstrap), else its own.
            python = str(Path(config.server_python).expanduser())
            env = {k: v for k, v in env.items() if not k.startswith("RAY_ADDRESS")}
            if os.environ.get("ARCTIC_RL_RAY_ENV"):
                env.update(json.loads(os.environ["ARCTIC_RL_RAY_ENV"]))
        # The token goes by environment (readable by this user only), never in the command line.
        env.pop(TOKEN_ENV, None)
        if self.token:
            env[TOKEN_ENV] = self.token
        # Output goes to an owner-only log file, not a pipe: the server outlives this process when the
        # client only detaches (close()), and a pipe would break under it.
        self.log_path = _server_log(config)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        try:
            self.proc = subprocess.Popen(
                [python, "-m", "arctic_rl.server", "serve", "--config", config.to_json()],
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env=env,
            )
        finally:
            os.close(fd)
        tail: list[str] = []
        with open(self.log_path) as log:
            for line in _follow(log, self.proc, t0 + config.request_timeout_s):
                tail = (tail + [line])[-20:]
                if line.startswith("ARCTIC_RL_ERROR "):
                    name, _, msg = line[len("ARCTIC_RL_ERROR ") :].strip().partition(": ")
                    raise ERRORS.get(name, ArcticRLError)(msg)
                if line.startswith("[arctic-rl] serving"):
                    break
            while not self._alive():
                if self.proc.poll() is not None or time.time() - t0 > config.request_timeout_s:
                    if self.proc.poll() is not None:  # it exited: what it said after "serving" is the reason
                        tail = (tail + log.read().splitlines())[-20:]
                    raise ArcticRLError(
                        f"arctic-rl server did not come up (log: {self.log_path}); last output:\n" + "\n".join(tail)
                    )
                time.sleep(0.2)
        print(f"[arctic-rl] server up in {time.time() - t0:.0f}s (log: {self.log_path})", file=sys.stderr, flush=True)

    def call(self, op: str, **kwargs):
        body = wire.encode(kwargs)
        headers = {"content-type": wire.CONTENT_TYPE, REQUEST_ID_HEADER: uuid.uuid4().hex}
        for attempt in range(RETRIES + 1):
            try:
                r = self.http.post(ops.route(op), content=body, headers=headers)
                break
            except httpx.TransportError as e:
                if op == "shutdown":
                    return "ok"
                # Sent again, same id: if the first one ran, the server answers from it instead of running it again.
                if attempt < RETRIES and not isinstance(e, httpx.ConnectError):
                    continue
                raise EngineDeadError(f"arctic-rl server at {self.base} unreachable: {e}") from None
        if r.status_code != 200:
            try:
                err = r.json()
            except ValueError:
                raise ArcticRLError(f"HTTP {r.status_code}: {r.text[:500]}") from None
            raise ERRORS.get(err.get("type"), ArcticRLError)(err.get("message", r.text))
        return wire.decode(r.content)

    def close(self, server_stopping: bool = False) -> None:
        """Closes the connection; never stops the server. After a shutdown (`server_stopping`), waits for
        a server this transport started to exit, and kills it if it does not within 15 s."""
        self.http.close()
        if server_stopping and self.proc is not None:
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
