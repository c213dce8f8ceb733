"""A stand-in recipe that checks a job end to end without a model: it connects to the job's Ray cluster
(RAY_ADDRESS), spreads `engines` placeholder actors over the nodes and reports where they landed, logs
`steps` fake training steps to MLflow under verl's metric names, checkpoints after every step and resumes
from the last checkpoint (resume=auto), as `arctic-rl run` does. Same command line shape:

    python -m jobs.smoke CONFIG.yaml steps=3 step_s=0.5 engines=2 checkpoint.dir=/tmp/ck resume=auto

CONFIG.yaml may hold the same keys (`-` for none); `key=value` overrides win. Use it to try a new cluster
(`python -m jobs.slurm submit --recipe smoke --command "python -m jobs.smoke - engines=2" --nodes 2 ...`);
under a job, checkpoint.dir defaults to $ARCTIC_RL_JOB_DIR/checkpoints.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import yaml
from pydantic import Field, ValidationError

from arctic_rl.strict import Strict, explain


class SmokeConfig(Strict):
    steps: int = 3
    step_s: float = 0.2
    engines: int = 1
    checkpoint_dir: str | None = Field("", alias="checkpoint.dir")
    resume: str = "auto"
    experiment: str | None = ""
    run_name: str = "smoke"
    fail_at_step: int = -1


DEFAULTS: dict[str, object] = SmokeConfig().model_dump(by_alias=True)


def parse(argv: Sequence[str]) -> dict[str, object]:
    """The config (CONFIG.yaml, then key=value overrides) by key, checked by SmokeConfig."""
    if not argv:
        raise SystemExit("usage: python -m jobs.smoke CONFIG.yaml [key=value ...]")
    raw: dict[str, object] = {}
    if argv[0] != "-":
        raw.update(yaml.safe_load(Path(argv[0]).read_text()) or {})
    for item in argv[1:]:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"jobs.smoke: bad override {item!r}: expected key=value; keys: {', '.join(DEFAULTS)}")
        raw[key] = value
    try:
        return SmokeConfig.model_validate(raw).model_dump(by_alias=True)
    except ValidationError as e:
        raise SystemExit(f"jobs.smoke: {explain(e, SmokeConfig)}") from None


def last_checkpoint(folder: Path) -> int:
    steps = [int(p.stem.split("_")[1]) for p in folder.glob("step_*.json")] if folder.is_dir() else []
    return max(steps, default=0)


def place_engines(num_engines: int) -> list[str]:
    """Starts placeholder engine actors spread over the nodes; returns each one's node rank label."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0.01)
    class Engine:
        def node_id(self) -> str:
            return ray.get_runtime_context().get_node_id()

    pg = placement_group([{"CPU": 0.01}] * num_engines, strategy="SPREAD")
    ray.get(pg.ready(), timeout=120)
    engines = [
        Engine.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
        ).remote()
        for i in range(num_engines)
    ]
    node_ids = ray.get([e.node_id.remote() for e in engines])
    rank_of = {n["NodeID"]: (n.get("Labels") or {}).get("arctic-rl/rank", n["NodeID"][:8]) for n in ray.nodes()}
    return [rank_of.get(nid, nid[:8]) for nid in node_ids]


def main(argv: Sequence[str] | None = None) -> int:
    import ray

    from arctic_rl.tracking import (
        TAG_BACKEND,
        TAG_FRAMEWORK,
        TAG_MODEL,
        TIMING_GEN,
        TIMING_STEP,
        TIMING_UPDATE_ACTOR,
        Tracker,
    )

    cfg = parse(sys.argv[1:] if argv is None else argv)
    # Under a job (ARCTIC_RL_JOB_DIR, set by jobs.bootstrap) checkpoints default to the job's folder, as the
    # launchers give `arctic-rl run`; a requeued attempt resumes from there.
    job_dir = os.environ.get("ARCTIC_RL_JOB_DIR")
    default_dir = str(Path(job_dir) / "checkpoints") if job_dir else ""
    ckpt_dir = Path(str(cfg["checkpoint.dir"] or default_dir)) if cfg["checkpoint.dir"] or default_dir else None
    start = last_checkpoint(ckpt_dir) if ckpt_dir and cfg["resume"] in ("auto", "true") else 0
    ray.init(address=os.environ.get("RAY_ADDRESS"), logging_level="ERROR", log_to_driver=False)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    engine_nodes = place_engines(int(cfg["engines"]))
    print(
        f"[smoke] {len(nodes)} Ray node(s); engines on node ranks {engine_nodes}; resume from step {start}", flush=True
    )
    experiment = str(cfg["experiment"] or os.environ.get("ARCTIC_RL_RECIPE", "smoke"))
    tags = {
        TAG_FRAMEWORK: "arctic-rl",
        TAG_BACKEND: "arctic-rl",
        TAG_MODEL: "none",
        "engine_nodes": ",".join(engine_nodes),
    }
    with Tracker.start(experiment, run_name=str(cfg["run_name"]), tags=tags, params={"smoke": cfg}) as tracker:
        for step in range(start + 1, int(cfg["steps"]) + 1):
            if step == cfg["fail_at_step"]:
                raise RuntimeError(f"fail_at_step={step} reached (asked for by the config)")
            t0 = time.monotonic()
            time.sleep(float(cfg["step_s"]))
            elapsed = time.monotonic() - t0
            tracker.log_metrics(
                {
                    TIMING_GEN: elapsed * 0.6,
                    TIMING_UPDATE_ACTOR: elapsed * 0.4,
                    TIMING_STEP: elapsed,
                    "cluster/nodes": len(nodes),
                    "cluster/attempt": float(os.environ.get("SLURM_RESTART_COUNT", 0)),
                },
                step=step,
            )
            if ckpt_dir:
                ckpt_dir.mkdir(parents=True, exist_ok=True)
                (ckpt_dir / f"step_{step}.json").write_text(json.dumps({"step": step}))
            print(f"[smoke] step {step}/{cfg['steps']} done ({elapsed:.2f} s)", flush=True)
    print(f"[smoke] finished: {int(cfg['steps']) - start} step(s) run, MLflow run {tracker.run_id}", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
