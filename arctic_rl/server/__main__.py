"""`python -m arctic_rl.server deploy CONFIG_JSON`: start a deployment on the Ray cluster named in
the config (or RAY_ADDRESS), print its config (with job_id) as the last line, and exit; the engines
keep running as detached Ray actors. `serve` runs the HTTP front end (see arctic_rl.server.http)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "deploy":
        from arctic_rl.config import ArcticRLClientConfig
        from arctic_rl.errors import ArcticRLError
        from arctic_rl.server.deploy import deploy

        try:
            cfg, _ = deploy(ArcticRLClientConfig.from_json(argv[1]))
        except ArcticRLError as e:
            print(f"ARCTIC_RL_ERROR {type(e).__name__}: {e}", flush=True)
            return 1
        print("ARCTIC_RL_CONFIG " + cfg.to_json(), flush=True)
        return 0
    if argv and argv[0] == "serve":
        from arctic_rl.server.http import main as serve

        return serve(argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
