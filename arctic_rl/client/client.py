"""ArcticRLClient: a method per op of arctic_rl/ops.py (the one declaration of the op set). Every op is synchronous; `submit` runs any op in the background
and returns a Future (the async pipeline overlaps generate with training this way).

    from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
    client = create_arctic_rl_client(ArcticRLClientConfig(model_name="/path/to/model"))
    samples = client.generate(["1+1="], {"n": 4, "max_tokens": 8, "temperature": 1.0})
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from arctic_rl import ops
from arctic_rl.config import ArcticRLClientConfig

Batch = dict[str, Any]


class ArcticRLClient:
    def __init__(self, transport, config: ArcticRLClientConfig):
        self._t = transport
        self.config = config  # holds the job_id of the running deployment
        self._pool: ThreadPoolExecutor | None = None

    def _call(self, op: str, **kwargs):
        # Bound against the declared op first: a call with a wrong argument never leaves this process.
        ops.lookup(op).bind(kwargs)
        return self._t.call(op, **kwargs)

    # -- sampling --------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[str] | list[list[int]],
        sampling_params: dict | None = None,
        routing_keys: list[str] | None = None,
    ) -> list[dict]:
        """`len(prompts) * n` samples, prompt-major; each {prompt_token_ids, token_ids, text, logprobs,
        finish_reason, num_cached_tokens}. sampling_params use vLLM's names (n, max_tokens, temperature, top_p, stop,
        seed, ...). routing_keys (one per prompt, e.g. a conversation id): prompts with the same key go to the same
        sampler replica across calls, so its prefix cache holds their earlier turns."""
        kwargs: dict = {"prompts": list(prompts), "sampling_params": dict(sampling_params or {})}
        if routing_keys is not None:
            kwargs["routing_keys"] = list(routing_keys)
        return self._call("generate", **kwargs)

    def sampler_log_probs(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """The sampler's log-probs of the tokens after each sequence's prompt (vLLM prompt log-probs)."""
        return self._call("sampler_log_probs", sequences=sequences, prompt_lens=prompt_lens)

    # -- training -------------------------------------------------------------------------------------------
    def log_probs(
        self,
        batch: Batch,
        reference: bool = False,
        compute_entropy: bool = False,
        temperature: float = 1.0,
        post_processor: str = "log_probs",
    ) -> dict[str, torch.Tensor]:
        """{"log_probs": [B, R], "entropy": [B, R]?} from the trainer (or the reference model).
        `post_processor`: a name in the server's registry (built-ins, or its server.loss_modules)."""
        return self._call(
            "log_probs",
            batch=batch,
            reference=reference,
            compute_entropy=compute_entropy,
            temperature=temperature,
            post_processor=post_processor,
        )

    def forward_backward(
        self, batch: Batch, loss_fn: str = "grpo", loss_config: dict | None = None, post_processor: str = "log_probs"
    ) -> dict[str, float]:
        """Accumulates gradients of `loss_fn` over the batch; returns its metrics. `loss_fn` and
        `post_processor` are names in the server's registry (built-ins, or its server.loss_modules)."""
        return self._call(
            "forward_backward",
            batch=batch,
            loss_fn=loss_fn,
            loss_config=dict(loss_config or {}),
            post_processor=post_processor,
        )

    def optimizer_step(self, optim_params: dict | None = None) -> dict[str, float]:
        """Applies the accumulated gradients; returns {"grad_norm", "lr", "step"}. `optim_params` (any of lr,
        betas, eps, weight_decay) set AdamW's hyper-parameters for this step and the next ones (lr: until the
        deployment's scheduler sets it again)."""
        return self._call("optimizer_step", optim_params=optim_params)

    def sync_weights(self) -> dict[str, float]:
        """Trainer weights -> every sampler replica, then checks they agree (norms and a log-prob probe)."""
        return self._call("sync_weights")

    def update_reference(self) -> dict[str, float]:
        return self._call("update_reference")

    # -- lifecycle ------------------------------------------------------------------------------------------
    def sleep(self, engine: str, level: int | None = None) -> dict:
        """Moves `engine`'s ("training", "reference" or "sampling") device memory to the host until `wake`.
        `level` (sampling only, default 1): vLLM's sleep level; 2 also drops the sampler's weights, so a
        `sync_weights` must follow before the next generate. Returns what moved and how long it took."""
        return self._call("sleep", engine=engine, level=level)

    def wake(self, engine: str) -> dict:
        """Brings a sleeping engine back (bit-identical state); returns what moved and how long it took."""
        return self._call("wake", engine=engine)

    def save_checkpoint(self, path: str) -> dict:
        return self._call("save_checkpoint", path=str(path))

    def load_checkpoint(self, path: str) -> dict:
        return self._call("load_checkpoint", path=str(path))

    def health(self) -> dict:
        return self._call("health")

    def reconnect_config(self) -> ArcticRLClientConfig:
        """A config holding this deployment's job id: `create_arctic_rl_client(it)` re-attaches."""
        # The server's config holds no token (it is never serialized): keep this client's.
        return ArcticRLClientConfig.from_json(self._call("reconnect_config")).model_copy(
            update={"auth_token": self.config.auth_token}
        )

    def submit(self, op: Callable, *args, **kwargs) -> Future:
        """Runs `op` (a method of this client) in the background: `client.submit(client.generate, ...)`."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="arctic-rl")
        return self._pool.submit(op, *args, **kwargs)

    def shutdown(self) -> None:
        """Stops the engines of this deployment (and the HTTP server). The only op that stops anything."""
        try:
            self._call("shutdown")
        finally:
            self._t.close(server_stopping=True)
            self._close_pool()

    def close(self) -> None:
        """Detaches this client; the engines and the server keep running, even a server this client
        started (reconnect with reconnect_config(); stop them with shutdown())."""
        self._t.close()
        self._close_pool()

    def _close_pool(self) -> None:
        if self._pool:
            self._pool.shutdown(wait=False)
            self._pool = None


def create_arctic_rl_client(config: ArcticRLClientConfig) -> ArcticRLClient:
    """Starts a deployment for `config` (or attaches to `config.job_id`) and returns its client."""
    transport: Any  # RayTransport or HttpTransport: the same call/close surface, imported only when used
    if config.comm_protocol == "ray":
        from arctic_rl.client.ray_transport import RayTransport

        transport = RayTransport(config)
    else:
        from arctic_rl.client.http_transport import HttpTransport

        transport = HttpTransport(config)
    return ArcticRLClient(transport, transport.config)
