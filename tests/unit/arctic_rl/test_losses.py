"""The grpo and sft losses: each option against a plain reference, micro-batch invariance, and
verl 0.9.1's own core_algos (installed --no-deps in .venv/verl-ref by scripts/setup_env.sh).

Legend: B rows, R response columns.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from repo_paths import REPO, verl_module

from arctic_rl.losses import LOSS_FNS, resolve_loss_fn
from arctic_rl.losses.grpo import AGG_MODES, SUM_METRICS, agg_loss, grpo_loss
from arctic_rl.losses.sft import sft_loss

REPO = REPO
LENGTHS = [6, 3, 1, 6, 0, 4, 2, 5]  # one empty row: it must not count as a sequence
B, R = len(LENGTHS), 6


@pytest.fixture(scope="module")
def verl():
    """verl's core_algos. setup_env.sh installs it, so its absence is a failure, not a skip."""
    core = verl_module("verl.trainer.ppo.core_algos")
    rc = verl_module("verl.trainer.ppo.rollout_corr_helper")
    from verl.workers.config import ActorConfig

    return core, rc, ActorConfig


def make_batch(seed: int = 0, token_adv: bool = False) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    d = dict(dtype=torch.float64)
    mask_BR = torch.arange(R)[None, :] < torch.tensor(LENGTHS)[:, None]
    logp_BR = -torch.rand(B, R, generator=g, **d) * 2 - 0.05
    old_BR = logp_BR + 0.4 * torch.randn(B, R, generator=g, **d)
    old_BR[::2, 0] -= 1.2  # ratios ~3.3: past every clip, the dual clip included
    adv = torch.randn(B, R, generator=g, **d) if token_adv else torch.randn(B, generator=g, **d)
    batch = {
        "response_mask": mask_BR.long(),
        "old_log_probs": old_BR,
        "advantages": adv,
        "ref_log_prob": logp_BR + 0.3 * torch.randn(B, R, generator=g, **d),
        "rollout_log_probs": old_BR + 0.5 * torch.randn(B, R, generator=g, **d),
    }
    outputs = {
        "log_probs": logp_BR.clone().requires_grad_(),
        "entropy": (torch.rand(B, R, generator=g, **d) * 3).requires_grad_(),
    }
    return outputs, batch


def tokens(mask_BR):
    return [(i, t) for i in range(mask_BR.shape[0]) for t in range(mask_BR.shape[1]) if mask_BR[i, t]]


def adv_at(batch, i, t) -> float:
    a = batch["advantages"]
    return float(a[i] if a.dim() == 1 else a[i, t])


def plain_agg(loss, mask_BR, mode, num_tokens=None, num_seqs=None, scale=None) -> float:
    """loss: function (i, t) -> float. Sums written out token by token."""
    rows = [[loss(i, t) for t in range(R) if mask_BR[i, t]] for i in range(mask_BR.shape[0])]
    rows_nonempty = [r for r in rows if r]
    n_tok = num_tokens if num_tokens is not None else sum(len(r) for r in rows)
    n_seq = num_seqs if num_seqs is not None else len(rows_nonempty)
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / n_tok
    if mode == "token-sum":
        return sum(sum(r) for r in rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows_nonempty) / n_seq
    seq_sum = sum(sum(r) for r in rows_nonempty) / n_seq
    return seq_sum / (scale or R) if mode == "seq-mean-token-sum-norm" else seq_sum


def clamp(x, lo, hi):
    return max(lo, min(hi, x))


def mean_over(mask_BR, f) -> float:
    toks = tokens(mask_BR)
    return sum(f(i, t) for i, t in toks) / len(toks)


# ----------------------------------------------------------------------------------------------
# plain references, one option at a time


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("global_counts", [False, True])
def test_agg_modes_match_plain_sums(mode, global_counts):
    outputs, batch = make_batch()
    x_BR, mask_BR = outputs["entropy"].detach(), batch["response_mask"]
    kw = dict(num_tokens=50.0, num_seqs=11.0) if global_counts else {}
    got = agg_loss(x_BR, mask_BR, mode, **kw)
    want = plain_agg(lambda i, t: float(x_BR[i, t]), mask_BR, mode, **kw)
    assert got.item() == pytest.approx(want, rel=1e-12)
    scaled = agg_loss(x_BR, mask_BR, mode, scale_factor=4.0)
    assert scaled.item() == pytest.approx(plain_agg(lambda i, t: float(x_BR[i, t]), mask_BR, mode, scale=4.0))


@pytest.mark.parametrize("token_adv", [False, True])
def test_ppo_clip_and_dual_clip(token_adv):
    outputs, batch = make_batch(1, token_adv)
    cfg = {"clip_ratio_low": 0.15, "clip_ratio_high": 0.28, "clip_ratio_c": 2.0}
    loss, m = grpo_loss(outputs, batch, cfg)
    lp, old, mask = outputs["log_probs"].detach(), batch["old_log_probs"], batch["response_mask"]

    def ratio(i, t):
        return math.exp(clamp(float(lp[i, t] - old[i, t]), -20, 20))

    def token_loss(i, t):
        a, r = adv_at(batch, i, t), ratio(i, t)
        clipped = max(-a * r, -a * clamp(r, 1 - 0.15, 1 + 0.28))
        return min(clipped, -a * 2.0) if a < 0 else clipped

    assert loss.item() == pytest.approx(plain_agg(token_loss, mask, "token-mean"), rel=1e-10)
    assert m["actor/pg_loss"] == pytest.approx(loss.item())

    def clip(i, t):
        return float(-adv_at(batch, i, t) * clamp(ratio(i, t), 0.85, 1.28) > -adv_at(batch, i, t) * ratio(i, t))

    assert m["actor/pg_clipfrac"] == pytest.approx(mean_over(mask, clip))

    def lower(i, t):
        return float(
            adv_at(batch, i, t) < 0
            and max(-adv_at(batch, i, t) * ratio(i, t), -adv_at(batch, i, t) * clamp(ratio(i, t), 0.85, 1.28))
            > -adv_at(batch, i, t) * 2.0
        )

    assert m["actor/pg_clipfrac_lower"] == pytest.approx(mean_over(mask, lower))
    assert 0 < m["actor/pg_clipfrac"] and 0 < m["actor/pg_clipfrac_lower"], "the data must exercise both clips"
    assert m["actor/ppo_kl"] == pytest.approx(mean_over(mask, lambda i, t: float(old[i, t] - lp[i, t])))


def test_gspo_sequence_ratio_value_and_gradient():
    outputs, batch = make_batch(2)
    loss, m = grpo_loss(outputs, batch, {"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-mean"})
    loss.backward()
    lp, old, mask = outputs["log_probs"].detach(), batch["old_log_probs"], batch["response_mask"]
    seq_ratio = {
        i: math.exp(sum(float(lp[i, t] - old[i, t]) for t in range(LENGTHS[i])) / LENGTHS[i])
        for i in range(B)
        if LENGTHS[i]
    }

    def token_loss(i, t):
        a, s = adv_at(batch, i, t), seq_ratio[i]
        return max(-a * s, -a * clamp(s, 0.8, 1.2))

    assert loss.item() == pytest.approx(plain_agg(token_loss, mask, "seq-mean-token-mean"), rel=1e-10)
    # d/d logp_it of s_it = s_i * exp(logp_it - sg(logp_it)) is s_i: each token its own gradient
    for i, t in tokens(mask):
        a, s = adv_at(batch, i, t), seq_ratio[i]
        unclipped = -a * s >= -a * clamp(s, 0.8, 1.2)
        want = (-a * s if unclipped else 0.0) / LENGTHS[i] / sum(1 for n in LENGTHS if n)
        assert float(outputs["log_probs"].grad[i, t]) == pytest.approx(want, abs=1e-12)
    assert m["actor/pg_clipfrac_lower"] == 0.0


def test_cispo_stop_gradient_weight():
    outputs, batch = make_batch(3)
    loss, m = grpo_loss(outputs, batch, {"policy_loss": "cispo", "clip_ratio_high": 0.3})
    loss.backward()
    lp, old, mask = outputs["log_probs"].detach(), batch["old_log_probs"], batch["response_mask"]
    n = sum(LENGTHS)

    def weight(i, t):
        return clamp(math.exp(float(lp[i, t] - old[i, t])), 0.8, 1.3)

    want = plain_agg(lambda i, t: -weight(i, t) * adv_at(batch, i, t) * float(lp[i, t]), mask, "token-mean")
    assert loss.item() == pytest.approx(want, rel=1e-10)
    for i, t in tokens(mask):  # clipped tokens keep a gradient: -w * A / N
        assert float(outputs["log_probs"].grad[i, t]) == pytest.approx(-weight(i, t) * adv_at(batch, i, t) / n)
    frac = mean_over(mask, lambda i, t: float(weight(i, t) != math.exp(float(lp[i, t] - old[i, t]))))
    assert m["actor/pg_clipfrac"] == pytest.approx(frac) and frac > 0


def test_m2po_drops_largest_second_moments_until_threshold():
    outputs, batch = make_batch(4, token_adv=True)
    tau = 0.03
    loss, m = grpo_loss(outputs, batch, {"policy_loss": "m2po", "m2_threshold": tau})
    lp, old, mask = outputs["log_probs"].detach(), batch["old_log_probs"], batch["response_mask"]
    lr = {(i, t): float(lp[i, t] - old[i, t]) for i, t in tokens(mask)}
    cands = [k for k, v in lr.items() if (adv_at(batch, *k) > 0 < v) or (adv_at(batch, *k) < 0 > v)]
    kept = sorted(cands, key=lambda k: lr[k] ** 2)
    m2_before = sum(lr[k] ** 2 for k in kept) / len(kept)
    while kept and sum(lr[k] ** 2 for k in kept) / len(kept) > tau:  # Algorithm 1, one token at a time
        kept.pop()
    dropped = set(cands) - set(kept)
    assert dropped, "the data must exercise the mask"
    want = plain_agg(
        lambda i, t: 0.0 if (i, t) in dropped else -adv_at(batch, i, t) * math.exp(lr[i, t]), mask, "token-mean"
    )  # dropped tokens still count in the normalizer
    assert loss.item() == pytest.approx(want, rel=1e-10)
    assert m["actor/m2po_m2_before"] == pytest.approx(m2_before)
    assert m["actor/m2po_m2_after"] == pytest.approx(sum(lr[k] ** 2 for k in kept) / len(kept))
    assert m["actor/m2po_m2_after"] <= tau
    assert m["actor/pg_clipfrac"] == pytest.approx(len(dropped) / len(lr))


PLAIN_KL = {
    "k1": lambda d: d,
    "kl": lambda d: d,
    "abs": abs,
    "k2": lambda d: 0.5 * d * d,
    "mse": lambda d: 0.5 * d * d,
    "k3": lambda d: clamp(math.exp(-d) + d - 1, -10, 10),
    "low_var_kl": lambda d: clamp(math.exp(-d) + d - 1, -10, 10),
}


@pytest.mark.parametrize("kind", [*PLAIN_KL, "k3+", "k1+"])
def test_kl_loss_types(kind):
    outputs, batch = make_batch(5)
    cfg = {"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": kind}
    loss, m = grpo_loss(outputs, batch, cfg)
    pg, _ = grpo_loss(outputs, batch, {})
    lp, ref, mask = outputs["log_probs"].detach(), batch["ref_log_prob"], batch["response_mask"]
    want = plain_agg(lambda i, t: PLAIN_KL[kind.rstrip("+")](float(lp[i, t] - ref[i, t])), mask, "token-mean")
    assert m["actor/kl_loss"] == pytest.approx(want, rel=1e-10)
    assert m["actor/kl_coef"] == pytest.approx(0.1)
    assert loss.item() == pytest.approx(pg.item() + 0.1 * want, rel=1e-10)
    if kind.endswith("+"):  # straight-through: k2's gradient, (logp - ref) / N per token
        grad = torch.autograd.grad(loss - pg, outputs["log_probs"])[0]
        for i, t in tokens(mask):
            assert float(grad[i, t]) == pytest.approx(0.1 * float(lp[i, t] - ref[i, t]) / sum(LENGTHS))


def test_low_var_kl_is_clamped_like_verl():
    out, batch = make_batch()
    batch["ref_log_prob"] = out["log_probs"].detach() + 30.0  # exp(20) - 20 - 1 would be huge
    _, m = grpo_loss(out, batch, {"use_kl_loss": True})
    assert m["actor/kl_loss"] == pytest.approx(10.0)


def test_entropy_bonus():
    outputs, batch = make_batch(6)
    loss, m = grpo_loss(outputs, batch, {"entropy_coeff": 0.01, "loss_agg_mode": "seq-mean-token-sum"})
    pg, _ = grpo_loss(outputs, batch, {"loss_agg_mode": "seq-mean-token-sum"})
    ent, mask = outputs["entropy"].detach(), batch["response_mask"]
    want = plain_agg(lambda i, t: float(ent[i, t]), mask, "seq-mean-token-sum")
    assert m["actor/entropy"] == pytest.approx(want)
    assert loss.item() == pytest.approx(pg.item() - 0.01 * want)
    with pytest.raises(ValueError, match="entropy_coeff"):
        grpo_loss({"log_probs": outputs["log_probs"]}, batch, {"entropy_coeff": 0.01})


@pytest.mark.parametrize("level,threshold", [("token", 2.0), ("token", 1.3), ("sequence", 2.0), ("token", "0.7_1.4")])
def test_rollout_is_decoupled_weights(level, threshold):
    outputs, batch = make_batch(7)
    cfg = {"rollout_is": level, "rollout_is_threshold": threshold}
    loss, m = grpo_loss(outputs, batch, cfg)
    old, beh, mask = batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
    lo, hi = (float(x) for x in threshold.split("_")) if isinstance(threshold, str) else (None, threshold)

    def weight(i, t):
        if level == "sequence":
            raw = math.exp(clamp(sum(float(old[i, s] - beh[i, s]) for s in range(LENGTHS[i])), -20, 20))
        else:
            raw = math.exp(float(old[i, t] - beh[i, t]))
        if lo is None:
            return min(raw, hi)
        return raw if lo <= raw <= hi else 0.0

    def unweighted(i, t):  # the plain PPO token loss, from the ppo test's definition
        lp = float(outputs["log_probs"].detach()[i, t])
        a, r = adv_at(batch, i, t), math.exp(lp - float(old[i, t]))
        clipped = max(-a * r, -a * clamp(r, 0.8, 1.2))
        return min(clipped, -a * 3.0) if a < 0 else clipped

    want = plain_agg(lambda i, t: unweighted(i, t) * weight(i, t), mask, "token-mean")
    assert loss.item() == pytest.approx(want, rel=1e-10)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(mean_over(mask, weight))
    with pytest.raises(ValueError, match="rollout_log_probs"):
        grpo_loss(outputs, {k: v for k, v in batch.items() if k != "rollout_log_probs"}, cfg)


@pytest.mark.parametrize(
    "alpha_key,value,alpha", [("prox_alpha", 0.25, 0.25), ("prox_staleness", 4, 0.75), ("prox_staleness", 1, 0.0)]
)
def test_loglinear_proximal(alpha_key, value, alpha):
    outputs, batch = make_batch(8)
    cfg = {"prox_logp_method": "loglinear", alpha_key: value, "rollout_is": "token"}
    no_old = {k: v for k, v in batch.items() if k != "old_log_probs"}  # not read in this mode
    loss, _ = grpo_loss(outputs, no_old, cfg)
    lp, beh = outputs["log_probs"].detach(), batch["rollout_log_probs"]
    prox = beh + alpha * (lp - beh)
    # the same as "recompute" with old_log_probs = that proximal policy, taken as a constant
    want, _ = grpo_loss(outputs, {**batch, "old_log_probs": prox}, {"rollout_is": "token"})
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    g1 = torch.autograd.grad(loss, outputs["log_probs"])[0]
    g2 = torch.autograd.grad(want, outputs["log_probs"])[0]
    torch.testing.assert_close(g1, g2)


def test_sft_is_masked_cross_entropy():
    outputs, batch = make_batch(9)
    lp, mask = outputs["log_probs"].detach(), batch["response_mask"]
    for mode in AGG_MODES:
        loss, m = sft_loss(outputs, batch, {"loss_agg_mode": mode})
        assert loss.item() == pytest.approx(plain_agg(lambda i, t: -float(lp[i, t]), mask, mode))
        assert m["actor/sft_loss"] == pytest.approx(loss.item())


# ----------------------------------------------------------------------------------------------
# micro-batch split invariance

INVARIANCE_CONFIGS = [
    {"use_kl_loss": True, "kl_loss_type": "k3", "entropy_coeff": 0.01, "clip_ratio_high": 0.28},
    {"policy_loss": "gspo", "rollout_is": "sequence"},
    {"policy_loss": "cispo", "rollout_is": "token", "prox_logp_method": "loglinear", "prox_staleness": 3},
]


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("cfg", INVARIANCE_CONFIGS, ids=["ppo+kl+entropy", "gspo+seq_is", "cispo+loglinear"])
def test_micro_batch_split_invariance(mode, cfg):
    outputs, batch = make_batch(10)
    mask = batch["response_mask"]
    cfg = {**cfg, "loss_agg_mode": mode}
    glob = {"global_num_tokens": int(mask.sum()), "global_num_seqs": int((mask.sum(-1) > 0).sum())}
    full, full_m = grpo_loss(outputs, batch, cfg)  # local counts == global counts for the whole batch
    full_grad = torch.autograd.grad(full, outputs["log_probs"])[0]
    for num_micro in (1, 2, 4):
        logp = outputs["log_probs"].detach().clone().requires_grad_()
        total, sums = 0.0, {}
        for rows in torch.arange(B).chunk(num_micro):
            mb_out = {"log_probs": logp[rows], "entropy": outputs["entropy"][rows]}
            mb_batch = {k: v[rows] for k, v in batch.items()}
            loss, m = grpo_loss(mb_out, mb_batch, {**cfg, **glob})
            total = total + loss
            for k in SUM_METRICS & m.keys():
                sums[k] = sums.get(k, 0.0) + m[k]
        total.backward()
        assert total.item() == pytest.approx(full.item(), rel=1e-12, abs=1e-14), num_micro
        torch.testing.assert_close(logp.grad, full_grad, rtol=1e-12, atol=1e-14)
        for k, v in sums.items():  # the loss-like metrics add up to the full-batch ones
            assert v == pytest.approx(full_m[k], rel=1e-12, abs=1e-14), k


@pytest.mark.parametrize("mode", AGG_MODES)
def test_sft_micro_batch_split_invariance(mode):
    outputs, batch = make_batch(11)
    mask = batch["response_mask"]
    glob = {"global_num_tokens": int(mask.sum()), "global_num_seqs": int((mask.sum(-1) > 0).sum())}
    full, _ = sft_loss(outputs, batch, {"loss_agg_mode": mode})
    parts = [
        sft_loss({"log_probs": outputs["log_probs"][r]}, {"response_mask": mask[r]}, {"loss_agg_mode": mode, **glob})[0]
        for r in torch.arange(B).chunk(4)
    ]
    assert sum(parts).item() == pytest.approx(full.item(), rel=1e-12)


# ----------------------------------------------------------------------------------------------
# against verl 0.9.1's own functions


def verl_actor_config(ActorConfig, mode="token-mean", **kw):
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=mode, **kw)
    return cfg


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_loss_matches_verl(verl, mode):
    core, _, _ = verl
    outputs, batch = make_batch(12)
    x, mask = outputs["entropy"].detach(), batch["response_mask"].bool()
    assert float(agg_loss(x, mask, mode)) == pytest.approx(float(core.agg_loss(x, mask, mode)), rel=1e-12)
    kw = dict(batch_num_tokens=40, global_batch_size=13, loss_scale_factor=512)
    want = core.agg_loss(x, mask, mode, dp_size=1, **kw)
    got = agg_loss(x, mask, mode, num_tokens=40, num_seqs=13, scale_factor=512)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


VERL_POLICY = {"ppo": "vanilla", "gspo": "gspo", "cispo": "cispo"}


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("policy", VERL_POLICY)
@pytest.mark.parametrize("rollout_is", [None, "token", "sequence"])
def test_policy_loss_matches_verl(verl, policy, mode, rollout_is):
    core, rc, ActorConfig = verl
    outputs, batch = make_batch(13, token_adv=True)
    mask = batch["response_mask"].bool()
    n_tok, n_seq = int(mask.sum()) + 7, int((mask.sum(-1) > 0).sum()) + 2  # as if more micro-batches
    cfg = {
        "policy_loss": policy,
        "loss_agg_mode": mode,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": 2.5,
        "global_num_tokens": n_tok,
        "global_num_seqs": n_seq,
    }
    if rollout_is:
        cfg.update(rollout_is=rollout_is, rollout_is_threshold=1.5)
    loss, m = grpo_loss(outputs, batch, cfg)
    grad = torch.autograd.grad(loss, outputs["log_probs"])[0]

    vcfg = verl_actor_config(ActorConfig, mode, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=2.5)
    vcfg.global_batch_info.update(dp_size=1, batch_num_tokens=n_tok, global_batch_size=n_seq, loss_scale_factor=None)
    weights = None
    if rollout_is:
        weights, _ = rc.compute_rollout_correction_weights(
            batch["old_log_probs"] - batch["rollout_log_probs"],
            batch["response_mask"],
            rollout_is=rollout_is,
            rollout_is_threshold=1.5,
        )
    logp = outputs["log_probs"].detach().clone().requires_grad_()
    want, vm = core.get_policy_loss_fn(VERL_POLICY[policy])(
        old_log_prob=batch["old_log_probs"],
        log_prob=logp,
        advantages=batch["advantages"],
        response_mask=mask,
        loss_agg_mode=mode,
        config=vcfg,
        rollout_is_weights=weights,
    )
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-10)
    torch.testing.assert_close(grad, logp.grad, rtol=1e-10, atol=1e-12)
    for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert m[k] == pytest.approx(vm[k], rel=1e-9, abs=1e-12), k


@pytest.mark.parametrize("kind", ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k3+", "low_var_kl+", "k1+"])
def test_kl_and_entropy_terms_match_verl(verl, kind):
    core, _, ActorConfig = verl
    outputs, batch = make_batch(14)
    mask = batch["response_mask"].bool()
    cfg = {
        "use_kl_loss": True,
        "kl_loss_coef": 0.05,
        "kl_loss_type": kind,
        "entropy_coeff": 0.002,
        "loss_agg_mode": "seq-mean-token-mean",
    }
    loss, m = grpo_loss(outputs, batch, cfg)
    grad = torch.autograd.grad(loss, outputs["log_probs"])[0]

    # verl's ppo_loss composition: pg - entropy_coeff * agg(entropy) + kl_loss_coef * agg(kl)
    logp = outputs["log_probs"].detach().clone().requires_grad_()
    vcfg = verl_actor_config(ActorConfig, "seq-mean-token-mean")
    pg, _ = core.compute_policy_loss_vanilla(
        batch["old_log_probs"], logp, batch["advantages"].unsqueeze(-1).expand(B, R), mask, "seq-mean-token-mean", vcfg
    )
    ent = core.agg_loss(outputs["entropy"], mask, "seq-mean-token-mean")
    kl = core.agg_loss(core.kl_penalty(logp, batch["ref_log_prob"], kind), mask, "seq-mean-token-mean")
    want = pg - 0.002 * ent + 0.05 * kl
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-10)
    torch.testing.assert_close(grad, logp.grad, rtol=1e-10, atol=1e-12)
    assert m["actor/kl_loss"] == pytest.approx(kl.item(), rel=1e-10)
    assert m["actor/entropy"] == pytest.approx(ent.item(), rel=1e-10)


@pytest.mark.parametrize("level,threshold", [("token", 2.0), ("sequence", 3.0), ("token", "0.5_1.8")])
def test_rollout_is_weights_match_verl(verl, level, threshold):
    from arctic_rl.losses.grpo import parse_config, rollout_is_weights

    _, rc, _ = verl
    _, batch = make_batch(15)
    mask = batch["response_mask"]
    cfg = parse_config({"rollout_is": level, "rollout_is_threshold": threshold})
    got, m = rollout_is_weights(batch["old_log_probs"], batch["rollout_log_probs"], mask, cfg)
    want, vm = rc.compute_rollout_correction_weights(
        batch["old_log_probs"] - batch["rollout_log_probs"], mask, rollout_is=level, rollout_is_threshold=threshold
    )
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-12, atol=1e-14)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(vm["rollout_is_mean"], rel=1e-9)


# ----------------------------------------------------------------------------------------------
# registry, errors, imports


def test_registry_resolves_builtins_and_lists_known_names():
    assert resolve_loss_fn("grpo") is grpo_loss and resolve_loss_fn("sft") is sft_loss
    with pytest.raises(ValueError, match=r"unknown loss_fn 'grpoo'.*'grpo'.*'sft'"):
        resolve_loss_fn("grpoo")
    assert {"grpo", "sft"} <= LOSS_FNS.keys()


@pytest.mark.parametrize(
    "cfg,match",
    [
        ({"policy_loss": "vanila"}, r"'policy_loss'\] = 'vanila'.*'ppo'"),
        ({"loss_agg_mode": "mean"}, r"'loss_agg_mode'\] = 'mean'.*token-mean"),
        ({"kl_loss_type": "k4", "use_kl_loss": True}, r"'kl_loss_type'\] = 'k4'"),
        ({"clip_ratio_c": 1.0}, r"'clip_ratio_c'\] = 1.0.*> 1"),
        ({"clip_ratio": "0.2"}, r"'clip_ratio'\] = '0.2'.*number"),
        ({"use_kl_loss": "yes"}, r"'use_kl_loss'\] = 'yes'"),
        ({"rollout_is": "tokens"}, r"'rollout_is'\] = 'tokens'"),
        ({"rollout_is": "token", "rollout_is_threshold": "2_1"}, r"'rollout_is_threshold'\] = '2_1'"),
        ({"prox_logp_method": "loglinear"}, r"prox_alpha.*prox_staleness"),
        ({"prox_alpha": 0.5}, r"prox_alpha.*only apply"),
        ({"prox_logp_method": "loglinear", "prox_alpha": 1.5}, r"'prox_alpha'\] = 1.5"),
        ({"clip_ratio_hgih": 0.3}, r"unknown loss_config key.*clip_ratio_hgih.*known"),
    ],
)
def test_bad_config_values_name_key_and_value(cfg, match):
    outputs, batch = make_batch()
    with pytest.raises(ValueError, match=match):
        grpo_loss(outputs, batch, cfg)


def test_post_processor_keys_are_accepted_and_ignored():
    outputs, batch = make_batch()
    extra = {"temperature": 0.7, "compute_entropy": True}
    assert grpo_loss(outputs, batch, extra)[0].item() == grpo_loss(outputs, batch, {})[0].item()
    assert sft_loss(outputs, batch, extra)[0].item() == sft_loss(outputs, batch, {})[0].item()


def test_bad_batch_names_the_key():
    outputs, batch = make_batch()
    with pytest.raises(ValueError, match="ref_log_prob"):
        grpo_loss(outputs, {k: v for k, v in batch.items() if k != "ref_log_prob"}, {"use_kl_loss": True})
    with pytest.raises(ValueError, match=r"advantages.*\[8, 6\] or \[8\]"):
        grpo_loss(outputs, {**batch, "advantages": torch.zeros(3)}, {})
    with pytest.raises(ValueError, match=r"old_log_probs.*shape \[8, 6\]"):
        grpo_loss(outputs, {**batch, "old_log_probs": torch.zeros(8, 5)}, {})
    with pytest.raises(ValueError, match="unknown loss_config key"):
        sft_loss(outputs, batch, {"clip_ratio": 0.2})
    with pytest.raises(ValueError, match=r"'loss_agg_mode'\] = 'x'"):
        sft_loss(outputs, batch, {"loss_agg_mode": "x"})


def test_loss_modules_import_only_torch():
    code = (
        "import sys, arctic_rl.losses as L; L.resolve_loss_fn('grpo'); import arctic_rl.advantages; "
        "bad = [m for m in ('deepspeed', 'vllm', 'transformers', 'ray', 'verl') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)
