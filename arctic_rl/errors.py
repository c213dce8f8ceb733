"""Typed errors shared by client and server. Over HTTP they travel as {"type", "message"} and the
client raises the same class again; over Ray the controller raises them directly."""

from __future__ import annotations


class ArcticRLError(RuntimeError):
    """Base class; `str(e)` is the server's message."""

    http_status = 500


class ConfigError(ArcticRLError, ValueError):
    http_status = 422


class BatchFormatError(ArcticRLError, ValueError):
    """A malformed batch (missing key, wrong shape or dtype)."""

    http_status = 422


class UnknownNameError(ArcticRLError, ValueError):
    """An unknown loss / post-processor / engine name."""

    http_status = 422


class EngineError(ArcticRLError):
    """An engine raised while running an op; the message carries the engine's traceback tail."""

    http_status = 500


class EngineStartError(EngineError):
    """An engine failed while starting (its constructor or setup); the message names the engine (role and
    rank or replica) and the root cause's exception type and message, on one line."""

    http_status = 500


class EngineDeadError(ArcticRLError):
    """An engine worker process died or stopped answering; `health()` names it."""

    http_status = 503


class WeightSyncError(ArcticRLError):
    """The sampler's weights did not match the trainer's after sync."""

    http_status = 500


class ProtocolError(ArcticRLError):
    """A malformed wire message (HTTP body)."""

    http_status = 400


class TooLargeError(ProtocolError):
    """A request body over the server's limit (server.max_body_bytes)."""

    http_status = 413


class AuthError(ArcticRLError):
    http_status = 401


class ForbiddenError(ArcticRLError):
    """A request from a browser page of another site, or naming a host the server does not serve (DNS rebinding)."""

    http_status = 403


class MediaTypeError(ProtocolError):
    """A request body of a content type the route does not take (a browser's cross-site form or text/plain POST)."""

    http_status = 415


class ServerBusyError(ArcticRLError):
    """More requests in flight than server.max_concurrent_requests, or an engine's lock held past
    request_timeout_s by another request: nothing ran; send it again later."""

    http_status = 503


class RequestTimeoutError(ArcticRLError):
    """The controller did not answer within request_timeout_s; the op may still be running: a retry with the same
    request id returns its result once it is done, never runs it twice."""

    http_status = 504


ERRORS = {
    c.__name__: c
    for c in (
        ArcticRLError,
        ConfigError,
        BatchFormatError,
        UnknownNameError,
        EngineError,
        EngineStartError,
        EngineDeadError,
        WeightSyncError,
        ProtocolError,
        TooLargeError,
        AuthError,
        ForbiddenError,
        MediaTypeError,
        ServerBusyError,
        RequestTimeoutError,
    )
}
