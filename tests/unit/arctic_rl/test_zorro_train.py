"""ZoRRo Train is exact: log-probs, entropy, loss and every parameter gradient equal the naive batch.

Tolerances (fp32, tiny random models): outputs |diff| <= 2e-5 (seen ~5e-7); gradients
|diff| <= 1e-5 + 1e-4 * max|grad| per parameter (seen ~2e-6).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from arctic_rl.batch import BatchError
from arctic_rl.engines.forward import naive_log_probs, response_log_probs
from arctic_rl.zorro import train as zt

VOCAB = 101
TINY = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    num_hidden_layers=2,
    vocab_size=VOCAB,
    max_position_embeddings=512,
)
MODELS = {
    "llama": (LlamaForCausalLM, LlamaConfig, {}),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, {}),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, {"head_dim": 16}),
    "mistral": (MistralForCausalLM, MistralConfig, {"sliding_window": 4096}),
    # every layer sparse: 4 experts, 2 per token; the routing of each token is computed from its hidden state,
    # which ZoRRo computes exactly, so each token goes to the same experts as in the naive batch
    "qwen3_moe": (
        Qwen3MoeForCausalLM,
        Qwen3MoeConfig,
        {
            "head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
    ),
}


def tiny_model(name: str, seed: int = 0):
    cls, cfg_cls, extra = MODELS[name]
    torch.manual_seed(seed)
    cfg = cfg_cls(**TINY, **extra)
    cfg._attn_implementation = "sdpa"
    return cls(cfg).train()  # train mode: attention_dropout is 0, but it is the mode training runs in


def make_batch(groups, *, P: int, R: int, seed: int = 0, uid_tensor: bool = False):
    """groups: list of (prompt_len, [responses]), a response being its length (random tokens) or its token list.
    Prompts left-padded to P, responses right-padded to R, rows of the groups interleaved so that a group's rows
    are not adjacent."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for gi, (plen, responses) in enumerate(groups):
        prompt = torch.randint(1, VOCAB, (plen,), generator=g)
        for r in responses:
            resp = torch.randint(1, VOCAB, (r,), generator=g) if isinstance(r, int) else torch.tensor(r).long()
            rows.append((gi, prompt, resp))
    perm = torch.randperm(len(rows), generator=g).tolist()
    rows = [rows[i] for i in perm]
    B = len(rows)
    ids = torch.zeros(B, P + R, dtype=torch.long)
    mask = torch.zeros(B, P + R, dtype=torch.long)
    for i, (_, prompt, resp) in enumerate(rows):
        ids[i, P - len(prompt) : P] = prompt
        mask[i, P - len(prompt) : P] = 1
        ids[i, P : P + len(resp)] = resp
        mask[i, P : P + len(resp)] = 1
    uid = [f"q{gi}" for gi, _, _ in rows]
    if uid_tensor:
        uid = torch.tensor([gi for gi, _, _ in rows])
    adv = torch.randn(B, generator=g)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "responses": ids[:, P:],
        "response_mask": mask[:, P:],
        "uid": uid,
        "advantages": adv,
        "old_log_probs": -torch.rand(B, R, generator=g),
    }


def toy_loss(out, batch):
    """A PPO-clip style loss with an entropy bonus: touches every output and every parameter."""
    m = batch["response_mask"].float()
    ratio = torch.exp(out["log_probs"] - batch["old_log_probs"])
    adv = batch["advantages"].unsqueeze(1)
    pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    return ((pg - 0.01 * out["entropy"]) * m).sum() / m.sum().clamp(min=1)


def run(model, batch, zorro: bool, **kw):
    model.zero_grad(set_to_none=True)
    out = response_log_probs(model, batch, zorro=zorro, pp_config={"compute_entropy": True}, chunk_tokens=7, **kw)
    loss = toy_loss(out, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    return {k: v.detach() for k, v in out.items()}, loss.detach(), grads


def assert_same(model, batch, naive_kw: dict | None = None, **kw):
    out_n, loss_n, grads_n = run(model, batch, zorro=False, **(naive_kw or {}))
    out_z, loss_z, grads_z = run(model, batch, zorro=True, **kw)
    for k in ("log_probs", "entropy"):
        assert out_z[k].shape == out_n[k].shape
        torch.testing.assert_close(out_z[k], out_n[k], atol=2e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    torch.testing.assert_close(loss_z, loss_n, atol=2e-5, rtol=0)
    assert grads_n.keys() == grads_z.keys()
    for name, gn in grads_n.items():
        tol = 1e-5 + 1e-4 * gn.abs().max().item()
        torch.testing.assert_close(grads_z[name], gn, atol=tol, rtol=0, msg=lambda m, name=name: f"grad {name}: {m}")


MIXED = [(9, [5, 3, 5, 1]), (12, [6]), (4, [2, 6, 6]), (12, [4, 4])]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("attention", ["split", "concat"])
def test_exact_mixed_groups(name, attention):
    model = tiny_model(name)
    assert_same(model, make_batch(MIXED, P=12, R=6, seed=1), attention=attention)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_exact_group_sizes_1_to_16(name):
    # one group of every size 1..16 would be 136 rows; sizes 1, 2, 3, 7 and 16 cover the cases
    groups = [(3 + s % 5, [1 + (s * 7 + j) % 5 for j in range(s)]) for s in (1, 2, 3, 7, 16)]
    assert_same(tiny_model(name, seed=2), make_batch(groups, P=8, R=5, seed=2, uid_tensor=True))


@pytest.mark.parametrize("size", range(1, 17))
def test_exact_each_group_size(size):
    groups = [(6, [1 + (j * 3) % 4 for j in range(size)]), (5, [3])]
    model = tiny_model("qwen2", seed=3)
    out_n = naive_log_probs(model, make_batch(groups, P=6, R=4, seed=size), pp_config={"compute_entropy": True})
    out_z = zt.zorro_log_probs(model, make_batch(groups, P=6, R=4, seed=size), pp_config={"compute_entropy": True})
    for k in out_n:
        torch.testing.assert_close(out_z[k], out_n[k], atol=2e-5, rtol=0)


def test_flash_varlen_path_with_reference_kernel(monkeypatch):
    # The CUDA path's index logic, run on CPU with a plain-SDPA stand-in for flash_attn_varlen_func.
    monkeypatch.setattr(zt, "_flash_varlen_fn", lambda: zt.varlen_reference)
    assert_same(tiny_model("llama", seed=4), make_batch(MIXED, P=12, R=6, seed=4), attention="flash_varlen")


def test_no_grad_log_probs_and_empty_responses():
    model = tiny_model("llama").eval()
    batch = make_batch([(5, [0, 3, 0]), (7, [2])], P=8, R=4, seed=5)
    with torch.no_grad():
        a = naive_log_probs(model, batch)
        b = zt.zorro_log_probs(model, batch)
    assert set(b) == {"log_probs"}
    torch.testing.assert_close(b["log_probs"], a["log_probs"], atol=2e-5, rtol=0)


def test_same_uid_different_prompt_is_not_merged():
    batch = make_batch([(5, [3, 2]), (5, [4])], P=6, R=4, seed=6)
    batch["uid"] = ["same"] * 3  # all rows claim one prompt; two prompts are real
    groups = zt.prompt_groups(batch)
    assert sorted(len(g) for g in groups) == [1, 2]
    model = tiny_model("qwen3")
    torch.testing.assert_close(
        zt.zorro_log_probs(model, batch)["log_probs"], naive_log_probs(model, batch)["log_probs"], atol=2e-5, rtol=0
    )


def test_equal_prompts_with_different_uids_stay_apart():
    batch = make_batch([(5, [3, 2])], P=6, R=4, seed=7)
    batch["uid"] = ["a", "b"]
    assert len(zt.prompt_groups(batch)) == 2


def test_plan_packs_prompt_once_and_positions_continue():
    batch = make_batch([(4, [2, 3]), (3, [1])], P=5, R=3, seed=8)
    plan = zt.build_plan(batch)
    assert plan.num_tokens == 4 + 2 + 3 + 3 + 1
    for g in plan.groups:
        pos = plan.position_ids[0]
        assert pos[g.start : g.start + g.prompt_len].tolist() == list(range(g.prompt_len))
        cur = g.resp_start
        for r in g.resp_lens:
            assert pos[cur : cur + r].tolist() == list(range(g.prompt_len, g.prompt_len + r))
            cur += r


def test_bad_padding_is_rejected():
    batch = make_batch([(4, [2, 3])], P=5, R=3, seed=9)
    batch["attention_mask"][0, 4] = 0  # a hole at the end of the prompt: not left-padded
    with pytest.raises(BatchError, match="left-padded"):
        zt.zorro_log_probs(tiny_model("llama"), batch)


def test_sliding_window_longer_than_sequence_is_refused():
    model = tiny_model("mistral")
    model.config.sliding_window = 4
    for layer in model.model.layers:
        layer.self_attn.config.sliding_window = 4
    with pytest.raises(NotImplementedError, match="sliding window"):
        zt.zorro_log_probs(model, make_batch([(5, [3])], P=5, R=3, seed=10))


def test_plain_forward_after_zorro_and_unknown_backend():
    # ZoRRo's attention stays installed (checkpoint recomputes need it); plain forwards, padding masks
    # included, still run SDPA with transformers' own masks
    model = tiny_model("llama")
    padded = make_batch(MIXED, P=12, R=6, seed=12)
    before = naive_log_probs(model, padded)["log_probs"]
    zt.zorro_log_probs(model, make_batch([(5, [3])], P=5, R=3))
    assert model.config._attn_implementation == zt.ATTN_IMPLEMENTATION
    assert torch.equal(naive_log_probs(model, padded)["log_probs"], before)
    with pytest.raises(ValueError, match="attention="):
        zt.zorro_log_probs(model, make_batch([(5, [3])], P=5, R=3), attention="nope")


def test_micro_batches_keep_prompt_groups_whole():
    from arctic_rl.batch import select_rows, split_micro_batches

    batch = make_batch(MIXED, P=12, R=6, seed=11)
    model = tiny_model("llama", seed=11)
    full = naive_log_probs(model, batch)["log_probs"]
    for rows in split_micro_batches(batch, max_rows=3):
        uids = {batch["uid"][i] for i in rows}
        assert all(sum(u == batch["uid"][i] for i in rows) == batch["uid"].count(u) for u in uids)
        part = zt.zorro_log_probs(model, select_rows(batch, rows))["log_probs"]
        torch.testing.assert_close(part, full[rows], atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_exact_with_gradient_checkpointing(name):
    # Checkpointing recomputes each layer inside the backward, after zorro_log_probs returned: the recompute
    # must run ZoRRo's attention again (it ran the model's own SDPA before, which torch's checkpoint refused
    # for GQA shapes; with equal shapes the gradients would have been silently wrong).
    model = tiny_model(name, seed=6)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    assert_same(model, make_batch(MIXED, P=12, R=6, seed=6))
    # the same model still runs plain forwards with its own attention
    assert_same(model, make_batch(MIXED, P=12, R=6, seed=7))


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "grad-checkpointing"])
def test_exact_with_lora_adapters(checkpointing, name):
    # The engine's own injection (PEFT, in place): only the adapters have gradients, and ZoRRo's equal the
    # naive batch's. PEFT starts B at zero, which would leave A without gradient: B is drawn at random. On the
    # MoE model 'all-linear' adapts the stacked experts and the routers too (PEFT's ParamWrapper).
    from arctic_rl.config import LoraConfig
    from arctic_rl.engines.lora import adapted_layers, apply_lora

    model = tiny_model(name, seed=8)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    apply_lora(model, LoraConfig(rank=4))
    torch.manual_seed(8)
    for layer in adapted_layers(model).values():
        torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.02)
    model.train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert_same(model, make_batch(MIXED, P=12, R=6, seed=8))
