"""The Tinker front driven by the official SDK, unmodified (ServiceClient, TrainingClient, SamplingClient), against
one `arctic-rl serve --tinker` deployment of a tiny random model on CPU (LoRA rank 8, ZoRRo Train on): a
supervised loop whose loss falls, an RL loop whose sampler log-probs match the trainer's, a state round trip
that continues identically, errors answered as the SDK's own error types, and a tinker-cookbook RL recipe run
unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from repo_paths import REPO

from arctic_rl import wire

pytestmark = pytest.mark.slow
TOKEN = "tml-arctic-front-key-not-shown"  # the SDK takes only keys that start with tml-
PORT = 7433
LP_ATOL = 2e-3  # the sampler's float32 log-probs vs the trainer's (vLLM CPU and torch differ in summation order)


@pytest.fixture(scope="module")
def front(ray_cluster, tiny_llama, tmp_path_factory):
    os.environ["TINKER_TELEMETRY"] = "0"  # the SDK would post its telemetry to the server (accepted, dropped)
    import tinker

    root = tmp_path_factory.mktemp("tinker-ckpt")
    log = tmp_path_factory.mktemp("tinker-log") / "serve.log"
    cfg = {
        "model_name": str(tiny_llama),
        "training_config": {
            "dtype": "float32",
            "zero_stage": 1,
            "micro_batch_size": 8,
            "grad_clip": 0.0,
            "zorro_train": {"enable": True},
            "lora": {"rank": 8},  # the SDK creates LoRA models; the deployment trains rank-8 adapters
        },
        "vllm_config": {"max_seq_len": 256, "dtype": "float32"},
        "server": {"checkpoint_root": str(root)},
        "use_reference": False,
    }
    cmd = [sys.executable, "-m", "arctic_rl.server", "serve", "--config", json.dumps(cfg), "--port", str(PORT)]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cmd, "--tinker"], stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "ARCTIC_RL_TOKEN": TOKEN}
        )
    deadline = time.time() + 900
    while "serving job" not in log.read_text():
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(1)
    # closed before the server goes: an open client's session heartbeat would go on failing to the session's end
    with tinker.ServiceClient(base_url=f"http://127.0.0.1:{PORT}", api_key=TOKEN) as service:
        yield {"service": service, "model": str(tiny_llama), "root": root}
    # The wire's content type: the HTTP edges refuse any other before the op runs (a web page's POST has none).
    headers = {"Authorization": f"Bearer {TOKEN}", "content-type": wire.CONTENT_TYPE}
    httpx.post(f"http://127.0.0.1:{PORT}/v1/shutdown", headers=headers, timeout=60)
    proc.wait(timeout=60)


def _datum(prompt: list[int], completion: list[int], **per_token):
    """Tinker's next-token layout: input = full[:-1], targets = full[1:]; per-token inputs on the completion only."""
    from tinker import types

    full = prompt + completion
    pad = [0.0] * (len(prompt) - 1)
    inputs = {k: np.asarray(pad + list(v), dtype=np.float32) for k, v in per_token.items()}
    inputs["target_tokens"] = np.asarray(full[1:], dtype=np.int64)
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs)


def test_a_supervised_loop_with_the_sdk_lowers_the_loss(front):
    from tinker import types

    tc = front["service"].create_lora_training_client(base_model=front["model"], rank=8).result()
    info = tc.get_info()
    assert (info.model_data.model_name, info.is_lora, info.lora_rank) == (front["model"], True, 8)
    tok = tc.get_tokenizer()  # the tokenizer resolves from the deployment's (local) model name
    pairs = [("where was the founder", " born"), ("answer:", " paris"), ("the quick brown", " fox jumps")]
    data = []
    for p, c in pairs:
        prompt, completion = tok.encode(p), tok.encode(c)
        data.append(_datum(prompt, completion, weights=[1.0] * len(completion)))
    losses = []
    for _ in range(6):
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=3e-3))
        losses.append(fb.result().metrics["loss:sum"])
        assert opt.result().metrics["lr"] == pytest.approx(3e-3)  # the request's, not the deployment's 1e-5
    assert losses[-1] < 0.5 * losses[0], losses
    out = tc.forward(data, "cross_entropy").result()
    for d, o in zip(data, out.loss_fn_outputs):
        assert o["logprobs"].shape == [d.model_input.length]
    total = sum(
        -float((o["logprobs"].to_numpy() * d.loss_fn_inputs["weights"].to_numpy()).sum())
        for d, o in zip(data, out.loss_fn_outputs)
    )
    assert out.metrics["loss:sum"] == pytest.approx(total, rel=1e-5)


def _rollouts(sc, prompt: list[int], seed: int):
    from tinker import types

    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=seed)
    return sc.sample(types.ModelInput.from_ints(prompt), num_samples=4, sampling_params=params).result().sequences


def test_an_rl_loop_samples_the_trainers_weights(front):
    import tinker
    from tinker import types

    tc = front["service"].create_lora_training_client(base_model=front["model"], rank=8).result()
    prompt = tc.get_tokenizer().encode("how many albums did")
    sc = tc.save_weights_and_get_sampling_client().result()
    for step, loss_fn in enumerate(("importance_sampling", "ppo")):
        seqs = _rollouts(sc, prompt, seed=step)
        rewards = np.array([float(len(set(s.tokens))) for s in seqs])  # any reward: distinct tokens
        adv = rewards - rewards.mean()
        data = [
            _datum(prompt, s.tokens, logprobs=s.logprobs, advantages=[a] * len(s.tokens)) for s, a in zip(seqs, adv)
        ]
        out = tc.forward_backward(data, loss_fn).result()
        # on-policy: the trainer's log-probs of the sampled tokens are the sampler's
        for s, o in zip(seqs, out.loss_fn_outputs):
            np.testing.assert_allclose(o["logprobs"].to_numpy()[len(prompt) - 1 :], s.logprobs, atol=LP_ATOL)
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        new_sc = tc.save_weights_and_get_sampling_client().result()
        with pytest.raises(tinker.APIStatusError, match="sampler weights version"):
            _rollouts(sc, prompt, seed=0)  # the old weights are gone from the sampler: said, not sampled
        sc = new_sc
    seqs = _rollouts(sc, prompt, seed=7)
    data = [_datum(prompt, s.tokens, weights=[1.0] * len(s.tokens)) for s in seqs]
    out = tc.forward(data, "cross_entropy").result()
    for s, o in zip(seqs, out.loss_fn_outputs):
        np.testing.assert_allclose(o["logprobs"].to_numpy()[len(prompt) - 1 :], s.logprobs, atol=LP_ATOL)


def _sft_data(tok):
    pairs = [("where was the founder", " born"), ("answer:", " paris")]
    return [_datum(tok.encode(p), tok.encode(c), weights=[1.0] * len(tok.encode(c))) for p, c in pairs]


def _steps(tc, data, n: int) -> list[float]:
    from tinker import types

    out = []
    for _ in range(n):
        fb = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=3e-3)).result()
        out.append(fb.result().metrics["loss:sum"])
    return out


def test_saved_state_with_the_optimizer_continues_identically(front):
    import tinker

    service = front["service"]
    tc = service.create_lora_training_client(base_model=front["model"], rank=8).result()
    data = _sft_data(tc.get_tokenizer())
    _steps(tc, data, 2)  # Adam's moments are not zero at the save
    path = tc.save_state("round-trip").result().path
    assert path == f"tinker://{tc.model_id}/weights/round-trip"
    assert (front["root"] / "tinker" / tc.model_id.replace(":", "_") / "round-trip" / "arctic_rl.json").is_file()
    first = _steps(tc, data, 2)
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert _steps(resumed, data, 2) == pytest.approx(first, rel=1e-6)
    with pytest.raises(tinker.RequestFailedError, match="no longer on the trainer"):
        tc.forward_backward(data, "cross_entropy").result()  # the trainer holds the resumed model now


def test_bad_requests_are_answered_as_the_sdk_expects(front):
    import tinker
    from tinker import types

    base = f"http://127.0.0.1:{PORT}/api/v1"
    caps = tinker.RestClient(base_url=base[: -len("/api/v1")], api_key=TOKEN).get_server_capabilities().result()
    assert [m.model_name for m in caps.supported_models] == [front["model"]]
    raw = httpx.get(f"{base}/get_server_capabilities", headers={"X-API-Key": TOKEN}).json()
    assert raw["supported_losses"] == ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]
    assert httpx.get(f"{base}/healthz", headers={"X-API-Key": TOKEN}).json() == {"status": "ok"}
    assert httpx.get(f"{base}/healthz", headers={"X-API-Key": "tml-wrong"}).status_code == 401
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=base[: -len("/api/v1")], api_key="tml-wrong").create_lora_training_client(
            base_model=front["model"], rank=8
        ).result()
    # malformed bodies: a 4xx naming the field
    # (with the content types the SDK sends: any other is refused before the body is read, 415)
    json_type, proto_type = {"content-type": "application/json"}, {"content-type": "application/x-protobuf"}
    r = httpx.post(f"{base}/optim_step", headers={"X-API-Key": TOKEN, **json_type}, content=b'{"model_id": 3}')
    assert r.status_code == 400 and "optim_params" in r.json()["detail"]
    r = httpx.post(f"{base}/forward_backward", headers={"X-API-Key": TOKEN, **proto_type}, content=b"\xff\x00garbage")
    assert r.status_code == 400 and "ForwardBackwardRequest" in r.json()["detail"]

    service = front["service"]
    with pytest.raises(tinker.APIStatusError, match="not served here"):
        service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=8).result()
    with pytest.raises(tinker.APIStatusError, match=r"lora_config.rank=16 but this deployment trains LoRA rank 8"):
        service.create_lora_training_client(base_model=front["model"], rank=16).result()
    tc = service.create_lora_training_client(base_model=front["model"], rank=8).result()
    data = _sft_data(tc.get_tokenizer())
    # a request the engine cannot run fails at its future: the SDK raises RequestFailedError, category user
    bad = types.Datum(
        model_input=data[0].model_input,
        loss_fn_inputs={**data[0].loss_fn_inputs, "target_tokens": np.zeros(data[0].model_input.length, np.int64)},
    )
    with pytest.raises(tinker.RequestFailedError, match="next tokens of model_input") as e:
        tc.forward([bad], "cross_entropy").result()
    assert e.value.category == types.RequestErrorCategory.User
    # an unknown loss is refused when sent (422: the SDK raises its status error and does not retry)
    tc = service.create_lora_training_client(base_model=front["model"], rank=8).result()
    with pytest.raises(tinker.UnprocessableEntityError, match="unknown loss_fn 'gspo'"):
        tc.forward_backward(data, "gspo").result()
    # sizes past the deployment's limits are refused when sent, before anything is queued or allocated
    long = _datum(list(range(3, 303)), [5, 6], weights=[1.0, 1.0])  # 301 input tokens; max_seq_len is 256
    with pytest.raises(tinker.UnprocessableEntityError, match=r"data\[0\].model_input has 301 tokens"):
        tc.forward_backward([long], "cross_entropy").result()
    sc = tc.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=4)
    with pytest.raises(tinker.UnprocessableEntityError, match=r"sampling_params\['n'\]"):
        sc.sample(types.ModelInput.from_ints([3, 4, 5]), num_samples=300_000, sampling_params=params).result()


def test_a_new_model_never_steps_with_an_earlier_models_gradient(front):
    """A forward_backward never stepped, then create_model: the new model's steps equal those of a model created
    with no gradient pending (the load of the initial state clears gradients; DeepSpeed alone keeps them)."""
    service = front["service"]
    tc = service.create_lora_training_client(base_model=front["model"], rank=8).result()
    tok = tc.get_tokenizer()
    # Another batch than the steps': Adam's first step is lr * sign(gradient), so the same batch's gradient
    # added twice would move the weights exactly as once.
    completion = tok.encode(" fox jumps")
    stale = [_datum(tok.encode("the quick brown"), completion, weights=[1.0] * len(completion))]
    tc.forward_backward(stale, "cross_entropy").result()
    data = _sft_data(tok)
    after_stale = _steps(service.create_lora_training_client(base_model=front["model"], rank=8).result(), data, 2)
    clean = _steps(service.create_lora_training_client(base_model=front["model"], rank=8).result(), data, 2)
    assert after_stale == pytest.approx(clean, rel=1e-6)


def _cookbook() -> Path:
    """tinker-cookbook 0.5.8, installed --no-deps by scripts/setup_env.sh (absent: a failure, not a skip)."""
    for folder in (REPO / ".venv" / "tinker-cookbook", REPO / ".tinker-cookbook"):
        if (folder / "tinker_cookbook").is_dir():
            return folder
    pytest.fail("tinker-cookbook is missing: run scripts/setup_env.sh")


def test_a_cookbook_rl_recipe_runs_unchanged(front, tmp_path):
    """The cookbook's math_rl recipe on its generated arithmetic problems (no hub dataset), two steps."""
    log = tmp_path / "run"
    args = {
        "model_name": front["model"],
        "base_url": f"http://127.0.0.1:{PORT}",
        "env": "arithmetic",
        "renderer_name": "role_colon",  # the tiny tokenizer has no model family to pick a renderer from
        "lora_rank": 8,
        "group_size": 4,
        "groups_per_batch": 2,
        "max_tokens": 5,
        "learning_rate": 1e-4,
        "max_steps": 2,
        "eval_every": 0,
        "save_every": 0,
        "log_path": log,
        "behavior_if_log_dir_exists": "delete",
    }
    cmd = [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train", *(f"{k}={v}" for k, v in args.items())]
    env = {**os.environ, "TINKER_API_KEY": TOKEN, "PYTHONPATH": f"{_cookbook()}{os.pathsep}{REPO}"}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    assert [s["progress/batch"] for s in steps if "progress/batch" in s] == [0, 1]
