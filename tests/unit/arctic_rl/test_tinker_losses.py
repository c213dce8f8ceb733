"""Tinker's built-in losses (arctic_rl/losses/tinker.py) against the formulas of Tinker's loss docs, written out
per token in plain Python; their gradients against autograd of those formulas; micro-batch invariance (the
losses are sums); and the Datum -> batch translation of the Tinker front (arctic_rl/server/tinker_convert.py),
whose "shared" layout gives the same loss and gradient as the full one.

Legend: B rows, R response columns, N targets of a datum.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tinker import types

from arctic_rl.batch import validate_batch
from arctic_rl.errors import BatchFormatError, ConfigError, UnknownNameError
from arctic_rl.losses import resolve_loss_fn
from arctic_rl.losses.config import TINKER_LOSSES
from arctic_rl.server import tinker_convert as conv

LIMITS = conv.Limits(max_seq_len=256, max_rows=64, max_cells=4096)

B, R = 4, 5
LENGTHS = [5, 3, 1, 4]


def _batch(seed: int = 0) -> tuple[torch.Tensor, dict]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1] * n + [0] * (R - n) for n in LENGTHS])
    lp = -torch.rand(B, R, generator=g) * 2
    batch = {
        "response_mask": mask,
        "weights": torch.rand(B, R, generator=g),
        "rollout_log_probs": lp + 0.3 * torch.randn(B, R, generator=g),  # ratios on both sides of the clip range
        "advantages": torch.randn(B, R, generator=g),
    }
    return lp, batch


def _reference(name: str, lp: list, q: list, a: list, w: list, cfg: dict) -> float:
    """One token's loss term, as Tinker's docs write it."""
    lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
    ratio = math.exp(lp - q)
    if name == "cross_entropy":
        return -lp * w
    if name == "importance_sampling":
        return -ratio * a
    if name == "ppo":
        return -min(ratio * a, min(max(ratio, lo), hi) * a)
    if name == "cispo":
        return -min(max(ratio, lo), hi) * lp * a
    return -(lp * a - 0.5 * cfg["beta"] * (lp - q) ** 2)


CONFIGS = {"ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, "dro": {"beta": 0.05}}


@pytest.mark.parametrize("name", TINKER_LOSSES)
def test_each_loss_is_the_sum_of_tinkers_per_token_formula(name):
    lp, batch = _batch()
    cfg = CONFIGS.get(name, {})
    loss, metrics = resolve_loss_fn(name)({"log_probs": lp}, batch, cfg)
    want = sum(
        _reference(
            name,
            float(lp[i, j]),
            float(batch["rollout_log_probs"][i, j]),
            float(batch["advantages"][i, j]),
            float(batch["weights"][i, j]),
            cfg,
        )
        for i in range(B)
        for j in range(LENGTHS[i])
    )
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert metrics["loss:sum"] == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("name", TINKER_LOSSES)
def test_gradients_match_the_formula_and_add_up_over_micro_batches(name):
    lp, batch = _batch(1)
    cfg = CONFIGS.get(name, {})
    fn = resolve_loss_fn(name)
    x = lp.clone().requires_grad_(True)
    fn({"log_probs": x}, batch, cfg)[0].backward()
    # autograd of the formula, token by token (cispo: the clipped ratio is a constant)
    y = lp.clone().requires_grad_(True)
    q, a, w = batch["rollout_log_probs"], batch["advantages"], batch["weights"]
    ratio = torch.exp(y - q)
    terms = {
        "cross_entropy": -y * w,
        "importance_sampling": -ratio * a,
        "ppo": -torch.minimum(ratio * a, ratio.clamp(0.9, 1.1) * a),
        "cispo": -ratio.clamp(0.8, 1.2).detach() * y * a,
        "dro": -(y * a - 0.025 * (y - q) ** 2),
    }[name]
    (terms * batch["response_mask"]).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)
    halves = [fn({"log_probs": lp[s]}, {k: v[s] for k, v in batch.items()}, cfg)[0] for s in (slice(0, 2), slice(2, B))]
    assert float(sum(halves)) == pytest.approx(float(fn({"log_probs": lp}, batch, cfg)[0]), rel=1e-6)


def test_bad_configs_name_the_key():
    lp, batch = _batch()
    with pytest.raises(ValueError, match="beta"):
        resolve_loss_fn("dro")({"log_probs": lp}, batch, {})
    with pytest.raises(ConfigError, match="clip_low_threshold"):
        resolve_loss_fn("ppo")({"log_probs": lp}, batch, {"clip_low_threshold": 1.5})
    with pytest.raises(ConfigError, match="bogus"):
        resolve_loss_fn("cispo")({"log_probs": lp}, batch, {"bogus": 1.0})


def _datum(prompt: list[int], completion: list[int], **per_token) -> types.Datum:
    full = prompt + completion
    pad = [0.0] * (len(prompt) - 1)
    inputs = {k: np.asarray(pad + list(v), dtype=np.float32) for k, v in per_token.items()}
    inputs["target_tokens"] = np.asarray(full[1:], dtype=np.int64)
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs)


def test_the_shared_layout_groups_a_prompt_and_keeps_the_loss_and_its_gradient():
    prompt = [5, 6, 7, 8]
    data = [
        _datum(prompt, [9, 10, 11], logprobs=[-1.0, -2.0, -0.5], advantages=[1.0] * 3),
        _datum(prompt, [12], logprobs=[-0.7], advantages=[-1.0]),
        _datum([5, 6], [13, 14], logprobs=[-0.2, -0.4], advantages=[0.5] * 2),
    ]
    full = conv.to_batch(data, "ppo", shared=False)
    shared = conv.to_batch(data, "ppo", shared=True)
    assert validate_batch(full.batch) == (3, 1, 6) and validate_batch(shared.batch) == (3, 4, 3)
    assert shared.batch["uid"] == [0, 0, 1]  # the two samples of one prompt: one group for ZoRRo
    assert shared.prompt_lens == [4, 4, 2] and full.num_targets == [6, 4, 3]

    # any per-token log-probs of the full sequences, laid out in each batch
    g = torch.Generator().manual_seed(0)
    per_target = [-torch.rand(n, generator=g) for n in full.num_targets]

    def laid_out(rows):
        x = torch.zeros_like(rows.batch["advantages"], requires_grad=False)
        for i, (p, t) in enumerate(zip(rows.prompt_lens, per_target)):
            x[i, : len(t) - p + 1] = t[p - 1 :]
        return x.requires_grad_(True)

    fn = resolve_loss_fn("ppo")
    a, b = laid_out(full), laid_out(shared)
    la, lb = fn({"log_probs": a}, full.batch, {})[0], fn({"log_probs": b}, shared.batch, {})[0]
    assert float(la.detach()) == pytest.approx(float(lb.detach()), rel=1e-6)
    la.backward()
    lb.backward()
    for i, p in enumerate(shared.prompt_lens):  # the same gradient per target position
        n = full.num_targets[i]
        torch.testing.assert_close(a.grad[i, p - 1 : n], b.grad[i, : n - p + 1])
        assert not a.grad[i, : p - 1].any()
    back = conv.target_log_probs(full, a.detach())
    np.testing.assert_allclose(back[0], per_target[0].numpy())


def test_requests_the_engine_cannot_train_are_refused_by_name():
    with pytest.raises(UnknownNameError, match="'gspo'"):
        conv.to_batch([_datum([1, 2], [3], weights=[1.0])], "gspo", shared=False)
    d = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": np.array([2, 9, 4]), "weights": np.ones(3, dtype=np.float32)},
    )
    with pytest.raises(BatchFormatError, match="next tokens"):
        conv.to_batch([d], "cross_entropy", shared=False)
    with pytest.raises(BatchFormatError, match=r"data\[0\].loss_fn_inputs is missing 'advantages'"):
        conv.to_batch([_datum([1, 2], [3], logprobs=[-1.0])], "importance_sampling", shared=False)
    short = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": np.array([2, 3, 4]), "weights": np.ones(2, dtype=np.float32)},
    )
    with pytest.raises(BatchFormatError, match=r"'weights'\] has 2 entries; model_input has 3"):
        conv.to_batch([short], "cross_entropy", shared=False)


def test_the_forward_backward_protobuf_round_trips_through_the_sdks_own_codecs():
    from tinker.proto.request_conv import forward_backward_request_to_proto
    from tinker.proto.response_conv import deserialize_forward_backward_output

    data = [_datum([1, 2, 3], [4, 5], weights=[1.0, 0.5])]
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="ppo", loss_fn_config={"beta": 0.1}),
        model_id="m",
        seq_id=3,
    )
    call = conv.parse_forward_backward(forward_backward_request_to_proto(req).SerializeToString(), LIMITS)
    assert (call.model_id, call.seq_id, call.loss_fn, call.loss_fn_config) == ("m", 3, "ppo", {"beta": 0.1})
    assert call.data[0].model_input.to_ints() == [1, 2, 3, 4]
    np.testing.assert_array_equal(call.data[0].loss_fn_inputs["weights"].to_numpy(), [0, 0, 1.0, 0.5])
    with pytest.raises(Exception, match="not a ForwardBackwardRequest"):
        conv.parse_forward_backward(b"\xff\xff\xff", LIMITS)
    out = deserialize_forward_backward_output(
        conv.forward_backward_output(
            [np.array([-1.0, -2.0], np.float32), np.array([-3.0], np.float32)], {"loss:sum": 2.5}
        )
    )
    assert out.metrics == {"loss:sum": 2.5}
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-1.0, -2.0], [-3.0]]


def test_optimizer_step_checks_its_optim_params(tmp_path):
    from arctic_rl.config import ArcticRLClientConfig
    from arctic_rl.server.requests import check_request

    cfg = ArcticRLClientConfig(model_name="unused", server={"checkpoint_root": str(tmp_path)})
    check_request("optimizer_step", {"optim_params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8}}, cfg)
    check_request("optimizer_step", {"optim_params": None}, cfg)
    for bad, key in (({"lr": -1.0}, "lr"), ({"betas": [0.9, 1.0]}, "betas"), ({"momentum": 0.9}, "momentum")):
        with pytest.raises(ConfigError, match=key):
            check_request("optimizer_step", {"optim_params": bad}, cfg)
