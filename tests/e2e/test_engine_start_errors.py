"""An engine that fails while starting reports its root cause (exception type and message) and names itself
(role, rank or replica) in the error the client raises, not Ray's "the actor died in its creation task"."""

from __future__ import annotations

import re
import shutil

import pytest
import ray

from arctic_rl import ArcticRLClientConfig, EngineStartError, create_arctic_rl_client

pytestmark = pytest.mark.slow


def make_config(model, use_reference: bool = True, **vllm) -> ArcticRLClientConfig:
    return ArcticRLClientConfig(
        model_name=str(model),
        use_reference=use_reference,
        training_config={"dtype": "float32", "zero_stage": 1},
        vllm_config={"max_seq_len": 512, "dtype": "float32", **vllm},
    )


@pytest.fixture
def corrupted_model(tiny_llama, tmp_path):
    """A model folder with a valid config.json (what the client checks) and a weights file that is not a
    safetensors file: hostile or half-downloaded input that only the engines read."""
    path = tmp_path / "corrupted"
    shutil.copytree(tiny_llama, path)
    (path / "model.safetensors").write_bytes(b"\xff" * 64)
    return path


def test_sampling_engine_that_refuses_its_config(ray_cluster, tiny_llama):
    # Passes the client's checks (engine_kwargs go to vLLM as they are); vLLM refuses it in its constructor.
    cfg = make_config(tiny_llama, engine_kwargs={"max_num_batched_tokens": 1})
    with pytest.raises(EngineStartError) as err:
        create_arctic_rl_client(cfg)
    # vLLM's pydantic ValidationError cannot be pickled: before, its reason only reached a worker log.
    msg = str(err.value)
    assert re.search(
        r"sampling engine replica 0 failed to start: ValidationError: .*max_num_batched_tokens \(1\)", msg
    ), msg
    assert "creation task" not in msg, msg


def test_training_engine_with_a_corrupted_weights_file(ray_cluster, corrupted_model):
    # No reference deployed: it loads the same file, and whichever engine fails first is the one named (the
    # controller reports setups in completion order), so with both the name would be a race.
    with pytest.raises(EngineStartError) as err:
        create_arctic_rl_client(make_config(corrupted_model, use_reference=False))
    msg = str(err.value)
    assert "training engine rank 0 failed to start: SafetensorError: " in msg, msg


def test_reference_engine_names_itself(ray_cluster, corrupted_model):
    """The reference is the same actor class in its frozen role; the controller passes its error on as it does
    the trainer's (above), so the reference worker is started directly here (no vLLM, no deployment)."""
    from arctic_rl.engines.training import TrainingWorker
    from arctic_rl.ops import NAMESPACE

    ray.init(address=ray_cluster, namespace=NAMESPACE, ignore_reinit_error=True, log_to_driver=False)
    worker = ray.remote(TrainingWorker).options(num_cpus=0).remote(make_config(corrupted_model).to_json(), 0, 1, False)
    try:
        addr, port = ray.get(worker.rendezvous.remote())
        with pytest.raises(ray.exceptions.RayTaskError) as err:
            ray.get(worker.setup.remote(addr, port))
    finally:
        ray.kill(worker)
    assert isinstance(err.value.cause, EngineStartError)
    assert "reference engine rank 0 failed to start: SafetensorError: " in str(err.value.cause)


def test_a_later_rank_failing_fails_the_start_while_rank_0_still_waits(ray_cluster):
    # Rank 0 blocks in the rendezvous until every rank joins; rank 1 died instead. The controller must report
    # rank 1 now, not wait on rank 0 first (which, without a timeout, never returns).
    import threading

    from arctic_rl.server.controller import get_in_completion_order

    if not ray.is_initialized():
        ray.init()

    @ray.remote
    def rank0_waiting_for_the_others():
        import time

        time.sleep(3600)

    @ray.remote
    def rank1_failing():
        raise RuntimeError("rank 1: CUDA out of memory")

    tagged = [("training", rank0_waiting_for_the_others.remote()), ("training", rank1_failing.remote())]
    raised: list[BaseException] = []

    def start():
        try:
            get_in_completion_order(tagged, lambda ref, engine, timeout: ray.get(ref, timeout=timeout))
        except Exception as e:  # what the deployment would raise
            raised.append(e)

    t = threading.Thread(target=start, daemon=True)
    t.start()
    t.join(timeout=120)
    ray.cancel(tagged[0][1], force=True)
    assert raised and "rank 1: CUDA out of memory" in str(raised[0])
