"""The HTTP client's check that the server it reached holds the token, before it sends the token or any data.

The client sends a fresh random nonce (`GET PROOF_ROUTE?nonce=...`, no token); the server answers
`proof(token, nonce, port)`, an HMAC of the nonce keyed by the token. Whoever answers without the token (another
user's process that took the port first) cannot compute it, so it never sees the token or a batch. The server's
own port is in the proof: a process on another port that relays the nonce to the real server gets a proof for the
real server's port, which the client (expecting its own target port) refuses. Shared by the client and the server,
so it imports neither.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

PROOF_ROUTE = "/auth/proof"
NONCE = re.compile(r"[0-9a-f]{32,128}")


def new_nonce() -> str:
    return secrets.token_hex(32)


def proof(token: str, nonce: str, port: int) -> str:
    """HMAC-SHA256 keyed by the token over a label, the server's port and the nonce (hex)."""
    msg = f"arctic-rl server proof v1\0{port}\0{nonce}".encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def verify(token: str, nonce: str, port: int, answer: object) -> bool:
    return isinstance(answer, str) and hmac.compare_digest(answer.encode(), proof(token, nonce, port).encode())
