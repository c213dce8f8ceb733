"""Router replay (R3), the trainer's side (arctic_rl/router_replay.py) on a tiny random Qwen3-MoE: the routers take
the routing a batch carries (`routed_experts` [B, T, L, k]), the router's weight still gets a gradient, ZoRRo Train
stays exact with it, and a token without a record (-1) is routed by the trainer."""

from __future__ import annotations

import pytest
import torch
from test_zorro_train import MIXED, assert_same, make_batch, run, tiny_model

from arctic_rl import router_replay
from arctic_rl.batch import BatchError
from arctic_rl.engines.forward import naive_log_probs
from arctic_rl.zorro.train import zorro_log_probs

L, K, E = 2, 2, 4  # tiny_model("qwen3_moe"): 2 layers, top 2 of 4 experts


def own_routing(model, batch) -> torch.Tensor:
    """[B, T, L, k]: where the model's own routers send each token of the naive batch."""
    state = router_replay.install(model)
    state.record = True
    B, T = batch["input_ids"].shape
    with torch.no_grad():
        naive_log_probs(model, batch)
    return torch.stack([state.used[layer] for layer in range(L)], 1).view(B, T, L, K).to(torch.int16)


def other_routing(routed: torch.Tensor) -> torch.Tensor:
    """Each token routed to the k experts `routed` does not send it to (E = 4, k = 2: the other two)."""
    unused = torch.ones(*routed.shape[:-1], E).scatter_(-1, routed.long(), 0)
    return torch.sort(unused, dim=-1, descending=True, stable=True).indices[..., :K].to(routed.dtype)


def test_the_routers_take_the_batch_s_routing_and_the_router_still_learns():
    model = tiny_model("qwen3_moe", seed=3)
    batch = make_batch(MIXED, P=12, R=6, seed=3)
    own = own_routing(model, batch)
    forced = other_routing(own)
    state = router_replay.install(model)
    B, T = batch["input_ids"].shape
    free, _, _ = run(model, batch, zorro=False)
    with torch.no_grad():
        out = naive_log_probs(model, batch, routed_experts=forced)
    used = torch.stack([state.used[layer] for layer in range(L)], 1).view(B, T, L, K)
    assert torch.equal(used, forced.long())  # every token of every layer went where the batch said
    assert state.replayed == B * T * L and state.agree == 0  # none of them where the router would have sent it
    assert (out["log_probs"] - free["log_probs"]).abs().max() > 1e-3
    _, _, grads = run(model, batch, zorro=False, routed_experts=forced)
    gate = "model.layers.0.mlp.gate.weight"
    assert grads[gate].abs().max() > 0  # through the gathered probabilities of the replayed experts


def test_replaying_the_model_s_own_routing_changes_nothing():
    """The replayed weights are the router's own probabilities at the replayed experts, renormalised as the router
    does: replaying its own choice computes exactly what routing freely does, gradients included."""
    model = tiny_model("qwen3_moe", seed=4)
    batch = make_batch(MIXED, P=12, R=6, seed=4)
    own = own_routing(model, batch)
    free = run(model, batch, zorro=False)
    replayed = run(model, batch, zorro=False, routed_experts=own)
    torch.testing.assert_close(replayed[0]["log_probs"], free[0]["log_probs"], atol=0, rtol=0)
    for name, g in free[2].items():
        torch.testing.assert_close(replayed[2][name], g, atol=1e-7, rtol=1e-6, msg=name)


@pytest.mark.parametrize("prefix_tree", [False, True], ids=["zorro", "zorro-tree"])
def test_zorro_train_is_exact_with_replay(prefix_tree):
    """ZoRRo packs a group's prompt once and takes its routing from the group's first row; with routing that is the
    same across each group's prompt (what the sampler's record gives), its outputs and gradients equal the naive
    batch's under the same replay."""
    model = tiny_model("qwen3_moe", seed=5)
    batch = make_batch(MIXED, P=12, R=6, seed=5)
    forced = other_routing(own_routing(model, batch))
    router_replay.install(model)
    kw = {"prefix_tree": True} if prefix_tree else {}
    assert_same(model, batch, routed_experts=forced, naive_kw={"routed_experts": forced}, **kw)


def test_zorro_refuses_a_group_whose_shared_prompt_is_routed_two_ways():
    model = tiny_model("qwen3_moe", seed=6)
    batch = make_batch(MIXED, P=12, R=6, seed=6)
    router_replay.install(model)
    routed = own_routing(model, batch)
    rows = [i for i, u in enumerate(batch["uid"]) if u == "q0"]
    routed[rows[1], 11] = other_routing(routed[rows[1] : rows[1] + 1, 11:12])[0, 0]  # the prompt's last token
    with pytest.raises(BatchError, match=r"rows \d+ and \d+ share the token at column 11 \(packed once\)") as e:
        zorro_log_probs(model, batch, routed_experts=routed)
    assert f" {rows[1]} " in str(e.value)  # the row changed, against the one whose prompt ZoRRo packs
    routed[rows[1], 11] = routed[rows[0], 11]
    zorro_log_probs(model, batch, routed_experts=routed)  # equal again: packed once


def test_unrecorded_tokens_and_route_mode_prompts_are_routed_by_the_trainer():
    model = tiny_model("qwen3_moe", seed=7)
    batch = make_batch(MIXED, P=12, R=6, seed=7)
    own = own_routing(model, batch)
    forced = other_routing(own)
    batch["routed_experts"] = forced
    state = router_replay.install(model)
    B, T = batch["input_ids"].shape
    routed = router_replay.for_forward(batch, "route")
    assert (routed[:, :12] == -1).all() and torch.equal(routed[:, 12:], forced[:, 12:])
    with torch.no_grad():
        naive_log_probs(model, {k: v for k, v in batch.items() if k != "routed_experts"}, routed_experts=routed)
    used = torch.stack([state.used[layer] for layer in range(L)], 1).view(B, T, L, K)
    assert torch.equal(used[:, :12], own[:, :12].long()) and torch.equal(used[:, 12:], forced[:, 12:].long())
    assert state.replayed == B * 6 * L


def test_a_model_without_replayable_routers_is_refused_naming_the_setting():
    from arctic_rl.errors import ConfigError

    with pytest.raises(ConfigError, match="training_config.router_replay: the model .* has no MoE router"):
        router_replay.install(tiny_model("qwen3"))


def aux_of(model, batch, zorro: bool, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """(the auxiliary loss of one forward, its gradient on layer 0's router)."""
    state = router_replay.install(model, replay=False) or router_replay.install(model)
    state.collect = True
    model.zero_grad(set_to_none=True)
    (zorro_log_probs if zorro else naive_log_probs)(model, batch, **kw)
    aux = router_replay.aux_loss(model)
    aux.backward()
    state.collect, state.collected = False, []
    return aux.detach(), model.model.layers[0].mlp.gate.weight.grad.clone()


def test_the_aux_loss_is_transformers_and_zorro_computes_the_naive_batch_s():
    """router_replay.aux_loss is transformers' load_balancing_loss_func over the batch's real tokens (padding left
    out, as its attention_mask does), and ZoRRo's packed batch, each prompt once but weighted by its group's rows,
    gives the same value and router gradient."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    model = tiny_model("qwen3_moe", seed=9)
    batch = make_batch(MIXED, P=12, R=6, seed=9)
    aux, grad = aux_of(model, batch, zorro=False)
    B, T = batch["input_ids"].shape
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_router_logits=True)
    hf = load_balancing_loss_func(out.router_logits, E, K, batch["attention_mask"])
    torch.testing.assert_close(aux, hf.float(), atol=1e-6, rtol=1e-5)
    assert aux > 0 and grad.abs().max() > 0
    for kw in ({}, {"prefix_tree": True}):
        z_aux, z_grad = aux_of(model, batch, zorro=True, **kw)
        torch.testing.assert_close(z_aux, aux, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(z_grad, grad, atol=1e-7, rtol=1e-4)


def test_vllm_routing_record_becomes_one_row_per_token_of_the_sequence():
    """The weight-sync probe's routing from vLLM's own record (CUDA): one row per token of the scored sequence,
    the row of the token generated after it cut off, -1 (the trainer routes) where vLLM recorded fewer tokens,
    None where it returned no record (the probe then routes freely)."""
    import numpy as np

    from arctic_rl.engines.sampling import vllm_routing

    record = np.arange(5 * 2 * 2, dtype=np.int32).reshape(5, 2, 2) % 4
    cut = vllm_routing(record, 4)
    assert cut.dtype == torch.int16 and torch.equal(cut, torch.from_numpy(record[:4]).to(torch.int16))
    padded = vllm_routing(record, 7)
    assert padded.shape == (7, 2, 2) and torch.equal(padded[:5], torch.from_numpy(record).to(torch.int16))
    assert (padded[5:] == -1).all()
    assert vllm_routing(None, 4) is None


def moe_request(tmp_path, replay: bool = True):
    """A tiny Qwen3-MoE's config.json on disk (what the HTTP front and the controller read) and a deployment's config
    for it."""
    from arctic_rl.config import ArcticRLClientConfig

    tiny_model("qwen3_moe").config.save_pretrained(tmp_path)
    return ArcticRLClientConfig(model_name=str(tmp_path), training_config={"router_replay": {"enable": replay}})


def test_routing_the_model_cannot_take_is_refused_with_the_request_naming_the_field_the_value_and_the_bound(tmp_path):
    """Before anything reaches an engine (an id past the experts fails gather on CPU, and is a sticky device assert
    on CUDA): expert ids below num_experts, the layer and top-k dimensions the model's."""
    from arctic_rl.errors import BatchFormatError
    from arctic_rl.server.requests import check_request

    cfg = moe_request(tmp_path)
    batch = make_batch(MIXED, P=12, R=6, seed=5)
    B, T = batch["input_ids"].shape
    good = torch.randint(0, E, (B, T, L, K), dtype=torch.int16)
    good[:, :3] = -1  # no record: allowed
    check_request("log_probs", {"batch": {**batch, "routed_experts": good}}, cfg)
    past = good.clone()
    past[1, 7, 1, 0] = 10000
    bad = {
        r"expert id 10000 .*row 1, column 7, layer 1.*num_\w*experts=4.*\[0, 4\)": past,
        r"expert id 4 .*num_\w*experts=4": good.clamp(min=0) + 1,
        r"3 layers.*num_hidden_layers=2": torch.zeros(B, T, 3, K, dtype=torch.int16),
        r"3 experts per token.*num_experts_per_tok=2": torch.zeros(B, T, L, 3, dtype=torch.int16),
    }
    for message, routed in bad.items():
        for op in ("log_probs", "forward_backward"):
            args = {"batch": {**batch, "routed_experts": routed}, "loss_fn": "sft"}
            with pytest.raises(BatchFormatError, match=r"batch\['routed_experts'\].*" + message):
                check_request(op, args, cfg)
    with pytest.raises(BatchFormatError, match=r"routed_experts.*training_config.router_replay.enable"):
        check_request("log_probs", {"batch": {**batch, "routed_experts": good}}, moe_request(tmp_path, replay=False))


def test_the_trainer_refuses_routing_past_its_experts_before_any_router_gathers_it():
    """The engine's own guard (a batch that did not pass the request checks, e.g. another model's config on disk):
    set_routing names the bound instead of a gather out of range (on CUDA, a device assert that kills the trainer)."""
    model = tiny_model("qwen3_moe", seed=8)
    router_replay.install(model)
    batch = make_batch(MIXED, P=12, R=6, seed=8)
    B, T = batch["input_ids"].shape
    routed = torch.zeros(B * T, L, K, dtype=torch.int16)
    routed[5, 0, 1] = 10000
    with pytest.raises(BatchError, match=r"routed_experts holds expert id 10000.*num_experts=4"):
        router_replay.set_routing(model, routed)
    with pytest.raises(BatchError, match=r"routed_experts has 1 layers.*num_hidden_layers=2"):
        router_replay.set_routing(model, torch.zeros(B * T, 1, K, dtype=torch.int16))
    with pytest.raises(BatchError, match=r"routed_experts has 3 experts per token.*num_experts_per_tok=2"):
        router_replay.set_routing(model, torch.zeros(B * T, L, 3, dtype=torch.int16))
