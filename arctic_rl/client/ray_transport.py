"""Ray transport: calls the deployment's controller actor directly (`dispatch(op, kwargs)`; tensors go through
Ray's object store)."""

from __future__ import annotations

import os
from typing import Any

import ray

from arctic_rl import ops
from arctic_rl.client.launch import run_deploy
from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.errors import ArcticRLError, EngineDeadError
from arctic_rl.local_ray import start_local_ray


class RayTransport:
    def __init__(self, config: ArcticRLClientConfig):
        address = config.ray_address or os.environ.get("RAY_ADDRESS")
        if not ray.is_initialized():
            opts: dict[str, Any] = {"namespace": ops.NAMESPACE, "ignore_reinit_error": True, "log_to_driver": False}
            if address:  # a cluster of the user's: its own auth settings
                ray.init(address=address, include_dashboard=False, **opts)
            else:
                # A fresh local Ray with token auth (local_ray), never whatever cluster happens to run on
                # this host; the deploy process below attaches with the token this process now holds.
                start_local_ray(include_dashboard=False, **opts)
        if config.job_id is None:
            # Deploy on *this* Ray cluster (the one just started when there was none).
            gcs = ray.get_runtime_context().gcs_address
            config = ArcticRLClientConfig.from_json(
                run_deploy(config.model_copy(update={"ray_address": gcs}).to_json(), config.request_timeout_s)
            )
        self.config = config
        assert config.job_id, "a deployed or attached config carries its job_id"
        try:
            self.handle = ray.get_actor(ops.controller_name(config.job_id), namespace=ops.NAMESPACE)
        except ValueError:
            raise EngineDeadError(f"no running deployment with job_id {config.job_id!r} on this Ray cluster") from None

    def call(self, op: str, **kwargs):
        ops.lookup(op).bind(kwargs)  # a call that does not match the op never reaches the cluster
        ref: Any = self.handle.dispatch.remote(op, kwargs)
        try:
            return ray.get(ref, timeout=self.config.request_timeout_s)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, ArcticRLError):
                raise type(e.cause)(str(e.cause)) from None
            raise ArcticRLError(str(e)) from None
        except ray.exceptions.RayActorError as e:
            if op == "shutdown":
                return "ok"
            raise EngineDeadError(
                f"the arctic-rl controller of job {self.config.job_id} is gone: {str(e).splitlines()[0]}"
            ) from None
        except ray.exceptions.GetTimeoutError:
            raise EngineDeadError(f"{op} got no answer within {self.config.request_timeout_s}s") from None

    def close(self, server_stopping: bool = False) -> None:
        pass  # the controller is a detached actor: nothing of it lives in this process
