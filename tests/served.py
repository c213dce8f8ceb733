"""An app served by uvicorn in a thread, on the config's port and as `arctic-rl serve` runs it (the server's own
connection limits, arctic_rl.server.edges.uvicorn_config): the unit tests of the HTTP fronts talk to it over real
sockets."""

from __future__ import annotations

import threading
import time


class UvicornThread:
    def __init__(self, app, cfg) -> None:
        import uvicorn

        from arctic_rl.server.http import uvicorn_config

        self.cfg, self.base = cfg, f"http://127.0.0.1:{cfg.port}"
        self.server = uvicorn.Server(uvicorn_config(app, cfg, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
