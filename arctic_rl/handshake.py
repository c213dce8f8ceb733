"""The HTTP client's check that the server it reached holds the token, before it sends the token or any data.

On every connection it opens, before any request goes on it, the client sends a fresh random nonce
(`GET PROOF_ROUTE?nonce=...`, no token); the server answers `proof(token, nonce, address, port)`, an HMAC of the
nonce keyed by the token over the address and port the server received that connection on (its local end). The
client requires the proof for the address and port it is connected to (the connection's remote end). Whoever
answers without the token (another user's process that took the port first, on that address or on another address
of the same name: `localhost` as ::1 beside a server on 127.0.0.1) cannot compute it, so it never sees the token or
a batch. A process that relays the nonce to the real server gets a proof for the real server's own address and
port, which the client, connected elsewhere, refuses. A connection dropped and opened again proves itself again: a
process that took the address and port meanwhile (the server restarted, or gone) gets nothing either. Shared by the
client and the server, so it imports neither.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets

PROOF_ROUTE = "/auth/proof"
NONCE = re.compile(r"[0-9a-f]{32,128}")


def new_nonce() -> str:
    return secrets.token_hex(32)


def address(host: str) -> str:
    """One spelling per address, as both ends of a connection see it: IPv6 compressed without brackets or zone, an
    IPv4-mapped IPv6 address (a dual-stack socket's view of an IPv4 peer) as the IPv4 one; a name lower-cased."""
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return host.lower()
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return ip.compressed


def proof(token: str, nonce: str, host: str, port: int) -> str:
    """HMAC-SHA256 keyed by the token over a label, the server's address and port for the connection, and the
    nonce (hex)."""
    msg = f"arctic-rl server proof v2\0{address(host)}\0{int(port)}\0{nonce}".encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def verify(token: str, nonce: str, host: str, port: int, answer: object) -> bool:
    return isinstance(answer, str) and hmac.compare_digest(answer.encode(), proof(token, nonce, host, port).encode())
