"""Bring a deployment up (or find a running one) on the current Ray cluster, and record it."""

from __future__ import annotations

import os
import time
from typing import Any, cast

import ray

from arctic_rl.config import ArcticRLClientConfig, record_deployment
from arctic_rl.errors import EngineDeadError
from arctic_rl.local_ray import start_local_ray
from arctic_rl.ops import NAMESPACE, controller_name
from arctic_rl.server.controller import Controller
from arctic_rl.server.startup import deployment_start_error


def init_ray(cfg: ArcticRLClientConfig) -> str:
    """Connects to cfg.ray_address / RAY_ADDRESS, or starts the embedded local Ray; returns the GCS address."""
    if not ray.is_initialized():
        address = cfg.ray_address or os.environ.get("RAY_ADDRESS")
        opts: dict[str, Any] = {"namespace": NAMESPACE, "ignore_reinit_error": True, "log_to_driver": False}
        if address:
            ray.init(address=address, include_dashboard=False, **opts)
        else:  # the embedded cluster: token auth, private temp dir (arctic_rl.local_ray)
            start_local_ray(include_dashboard=False, num_cpus=os.cpu_count(), **opts)
    return ray.get_runtime_context().gcs_address


def deploy(cfg: ArcticRLClientConfig) -> tuple[ArcticRLClientConfig, ray.actor.ActorHandle]:
    """Returns (config with job_id and ray_address, controller handle). With cfg.job_id set, attaches."""
    address = init_ray(cfg)
    if cfg.job_id:
        try:
            handle: Any = ray.get_actor(controller_name(cfg.job_id), namespace=NAMESPACE)
        except ValueError:
            raise EngineDeadError(
                f"no running deployment with job_id {cfg.job_id!r} on Ray cluster {address}"
            ) from None
        # The running deployment's own config (its server rules), reached the way this caller asked.
        running = ArcticRLClientConfig.from_json(cast(str, ray.get(handle.config_json.remote())))
        return running.model_copy(update={"host": cfg.host, "port": cfg.port, "auth_token": cfg.auth_token}), handle
    # checkpoint_root's default (job dir or ./runs) and the CPU thread count (OMP_NUM_THREADS) are resolved here,
    # where the deployment is started.
    update = {"ray_address": address, "server": cfg.server.resolved(), "cpu": cfg.cpu.resolved()}
    cfg = cfg.with_new_job_id().model_copy(update=update)
    assert cfg.job_id
    t0 = time.time()
    handle = (
        ray.remote(Controller)
        .options(
            name=controller_name(cfg.job_id), namespace=NAMESPACE, lifetime="detached", max_concurrency=16, num_cpus=0
        )
        .remote(cfg.to_json())
    )
    try:
        ray.get(handle.ready.remote())
    except (ray.exceptions.RayActorError, ray.exceptions.UnserializableException) as e:
        ray.kill(handle)
        raise deployment_start_error(e) from None
    record_deployment(cfg)
    print(f"[arctic-rl] job {cfg.job_id} up in {time.time() - t0:.1f}s on {address}", flush=True)
    return cfg, handle
