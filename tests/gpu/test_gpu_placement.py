"""GPU placement, on a Ray cluster that declares logical GPUs (the engines themselves run on CPU here):
which engines share a device is decided by placement-group bundles, not by Ray packing fractional GPUs."""

from __future__ import annotations

import pytest

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.batch import from_samples

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_gpu_cluster():
    """One cluster for the module (each test hands back every device it took)."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 2})
    cluster.wait_for_nodes()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ADDRESS", cluster.address)
        yield cluster
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


def _gpu(engine: dict) -> str:
    assert len(engine["gpu_ids"]) == 1, engine
    return engine["gpu_ids"][0]


def test_colocated_engines_pair_up_on_devices(tiny_llama, two_gpu_cluster):
    import ray

    c = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(tiny_llama),
            training_gpus=2,
            sampling_gpus=2,
            colocate=True,
            training_config={"dtype": "float32"},
            vllm_config={"max_seq_len": 256, "dtype": "float32"},
        )
    )
    try:
        e = c.health()["engines"]
        # Two trainer ranks on two devices; sampler i on trainer rank i's device; the reference
        # (no GPUs of its own) on rank 0's. The old fractional packing put both ranks on one GPU.
        assert _gpu(e["training[0]"]) != _gpu(e["training[1]"]), e
        assert _gpu(e["sampling[0]"]) == _gpu(e["training[0]"]) and _gpu(e["sampling[1]"]) == _gpu(e["training[1]"]), e
        assert _gpu(e["reference[0]"]) == _gpu(e["training[0]"]), e
        # the deployment works: sample, score, train, sync
        samples = c.generate(["the quick brown fox"], {"n": 2, "max_tokens": 4, "seed": 0})
        batch = from_samples(samples, [0] * 2)
        assert c.log_probs(batch)["log_probs"].shape == batch["response_mask"].shape
        assert ray.available_resources().get("GPU", 0) < 2  # the pool holds both devices
    finally:
        c.shutdown()
    # shutdown hands the devices back (placement groups removed)
    import time

    deadline = time.time() + 30
    while ray.available_resources().get("GPU", 0) < 2 and time.time() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("GPU", 0) == 2


def test_split_engines_get_their_own_devices(two_gpu_cluster):
    """Not colocated: the sampler's bundle is another device than the trainer's; the reference shares the
    trainer's. Each engine's options (the ones the controller starts it with) given to a task that reports
    the GPU Ray assigned it: the devices are Ray's own decision, without starting the engines themselves
    (the colocated test above starts them)."""
    import ray

    from arctic_rl.server.placers import GpuPlacer

    ray.init(address=two_gpu_cluster.address, ignore_reinit_error=True)
    cfg = ArcticRLClientConfig(model_name="unused", training_gpus=1, sampling_gpus=1, colocate=False)
    place = GpuPlacer(cfg)

    @ray.remote
    def device() -> str:
        (gpu,) = ray.get_gpu_ids()
        return str(gpu)

    try:
        trainer = ray.get(device.options(**place.trainer(0)).remote())
        reference = ray.get(device.options(**place.reference(0)).remote())
        sampler = ray.get(device.options(**place.sampler(0)[0]).remote())
        assert trainer != sampler and reference == trainer, (trainer, reference, sampler)
    finally:
        place.release()


def test_tensor_parallel_sampler_layout(two_gpu_cluster):
    """A TP=2 sampler: the driving actor sits in its first bundle with no GPU share (its vLLM Ray
    workers take the shares, on the bundles named in VLLM_RAY_BUNDLE_INDICES) and keeps CUDA visible."""
    import ray

    from arctic_rl.server.placers import GpuPlacer

    ray.init(address=two_gpu_cluster.address, ignore_reinit_error=True)
    cfg = ArcticRLClientConfig(
        model_name="unused", training_gpus=2, sampling_gpus=2, vllm_config={"tensor_parallel_size": 2}
    )
    place = GpuPlacer(cfg)
    try:
        opts, env = place.sampler(0)
        assert opts["num_gpus"] == 0 and opts["scheduling_strategy"].placement_group_bundle_index == 0
        assert opts["scheduling_strategy"].placement_group_capture_child_tasks  # vLLM's workers join the pool
        assert env == {
            "VLLM_RAY_BUNDLE_INDICES": "0,1",
            "VLLM_RAY_PER_WORKER_GPUS": str(GpuPlacer.FRAC),
            "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
        }
        t1 = place.trainer(1)
        assert t1["num_gpus"] == GpuPlacer.FRAC and t1["scheduling_strategy"].placement_group_bundle_index == 1
        # per device at most: trainer + reference + one TP worker
        assert 3 * GpuPlacer.FRAC <= 1
        assert ray.available_resources().get("GPU", 0) == 0  # the colocated pool holds both devices
    finally:
        place.release()
