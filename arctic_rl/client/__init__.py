"""The client: one op set over two transports (Ray, HTTP). Imports nothing from server or engines:
it runs on CPU-only driver nodes and starts a deployment by launching `python -m arctic_rl.server`."""

from arctic_rl.client.client import ArcticRLClient, create_arctic_rl_client

__all__ = ["ArcticRLClient", "create_arctic_rl_client"]
