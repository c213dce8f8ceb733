"""The root cause of an actor that failed to start, out of what Ray raises to the actor's caller.

In Ray 2.60 an actor whose constructor raised reaches its callers as ActorDiedError, which keeps no `.cause`:
only a message ending in the creation task's traceback, whose last line is the exception's `Type: message`.
When that exception could not be unpickled, the caller gets UnserializableException instead, holding the
original traceback followed by the pickling failure. Engines raise one-line messages (arctic_rl.engines.startup),
so the last line of the first traceback is the whole root cause.
"""

from __future__ import annotations

import re

import ray

from arctic_rl.errors import ERRORS, ArcticRLError, ConfigError, EngineError, EngineStartError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the task name in the message
_EXCEPTION_LINE = re.compile(r"^(?:\w+\.)*(\w+): (.*)$")  # "arctic_rl.errors.EngineStartError: msg"
_PICKLING_FAILURE = "During handling of the above exception, another exception occurred"


def is_start_failure(err: BaseException) -> bool:
    return isinstance(err, ray.exceptions.UnserializableException) or (
        isinstance(err, ray.exceptions.RayActorError) and err.actor_init_failed
    )


def root_cause_line(err: BaseException) -> str:
    """`Type: message` of the exception behind `err` (an actor's failed start, or a failure to unpickle an
    exception), or the last line Ray gave when there is no traceback (a process that died outright)."""
    text = getattr(err, "_original_stack_trace", None) or str(err)  # UnserializableException keeps it there
    text = _ANSI.sub("", text).split(_PICKLING_FAILURE)[0]  # the real error, not the pickling one after it
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    # A traceback's frames are indented; the exception's line is not, and a multi-line message follows it.
    starts = [i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line)]
    if starts:
        return " | ".join(line.strip() for line in lines[starts[-1] :])
    return lines[-1].strip() if lines else type(err).__name__


def _typed(line: str) -> tuple[type[ArcticRLError] | None, str]:
    """(our error class, its message) when `line` is one of our errors, else (None, line)."""
    m = _EXCEPTION_LINE.match(line)
    if m and m.group(1) in ERRORS:
        return ERRORS[m.group(1)], m.group(2)
    return None, line


def engine_start_error(err: BaseException, engine: str) -> ArcticRLError:
    """The error the controller raises for an engine actor of group `engine` that failed to start. Our engines
    name themselves (role, rank or replica) in their message; anything else is named by its group."""
    if not is_start_failure(err):
        raise ValueError(f"not an actor start failure: {type(err).__name__}")
    cls, message = _typed(root_cause_line(err))
    if cls is not None:
        return cls(message)
    if isinstance(err, ray.exceptions.UnserializableException):  # also raised for an op's unpicklable error
        return EngineError(f"{engine} engine failed: {message}")
    return EngineStartError(f"{engine} engine failed to start: {message}")


def deployment_start_error(err: BaseException) -> ArcticRLError:
    """The error `deploy` raises when the controller actor failed to start: the controller's own typed error
    (an engine's EngineStartError, a ConfigError), else a ConfigError with the root cause."""
    cls, message = _typed(root_cause_line(err))
    return (cls or ConfigError)(f"the deployment failed to start: {message}")
