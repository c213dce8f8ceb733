"""What an engine reports when it fails to start.

Ray hands the caller of a dead actor only a string (ActorDiedError keeps no `.cause`), and an exception
that cannot be pickled (or unpickled: pydantic's ValidationError, a library's exception with extra
constructor arguments) arrives as Ray's serialization failure with the real reason buried in a worker log.
So an engine's constructor and setup turn any failure into a plain EngineStartError whose one-line message
names the engine and the root cause; the controller digs that line out (arctic_rl.server.startup).
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from pathlib import Path

from arctic_rl.errors import ArcticRLError, EngineStartError

MAX_MESSAGE_CHARS = 2000  # a vLLM config error can quote a whole config object


def one_line(text: str) -> str:
    """The deploy command passes errors on as one line of output; a multi-line message would be cut."""
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def describe(e: BaseException) -> str:
    """`Type: message (at file:line in function)`, then the exceptions it was raised from, innermost last."""
    parts = []
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        frames = traceback.extract_tb(cur.__traceback__)
        where = f" (at {'/'.join(Path(frames[-1].filename).parts[-2:])}:{frames[-1].lineno} in {frames[-1].name})"
        parts.append(f"{type(cur).__name__}: {one_line(str(cur))}{where if frames else ''}")
        cur = cur.__cause__
    text = " <- caused by ".join(parts)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def reports_start_failure(engine_name: Callable[..., str]):
    """Decorates an engine's constructor or setup method. `engine_name(self, *args, **kwargs)` names the engine
    (role and rank or replica) from the method's arguments, since a failing constructor may not have set them."""

    def wrap(method):
        @functools.wraps(method)
        def guarded(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except EngineStartError:
                raise
            except Exception as e:
                traceback.print_exc()  # the whole traceback stays in this worker's log
                # Our own typed errors keep their type (a ConfigError stays a 4xx); `from None` leaves the
                # original, which may not pickle, out of what Ray ships to the controller.
                cls = type(e) if isinstance(e, ArcticRLError) else EngineStartError
                raise cls(f"{engine_name(self, *args, **kwargs)} failed to start: {describe(e)}") from None

        return guarded

    return wrap
