"""Off-policy corrections of the grpo loss against verl 0.9.1's own code (installed --no-deps in .venv/verl-ref):
rejection sampling (rollout_rs, every option), IS weights (token/sequence, TIS/IcePop, batch-normalized),
bypass mode (ppo_clip, reinforce); the mini-batch normalization across micro-batches; the config's errors.

verl's reference, decoupled mode: rollout_corr_helper.compute_rollout_correction_and_rejection_mask(old, rollout)
gives the weights and the mask, fed to core_algos.compute_policy_loss_vanilla (and, as verl's ppo_loss does, to
the entropy and KL terms: the trainer replaced the batch's response_mask). Bypass mode: core_algos's
compute_policy_loss_bypass_mode with its rollout_correction config. Loss and gradient must agree to 1e-6.

Legend: B rows, R response columns.
"""

from __future__ import annotations

import pytest
import torch
from repo_paths import verl_module

from arctic_rl.losses import global_loss_keys
from arctic_rl.losses.config import RS_OPTIONS
from arctic_rl.losses.grpo import SUM_METRICS, grpo_loss

LENGTHS = [7, 3, 1, 7, 0, 5, 2, 6, 4, 7, 1, 6]  # one empty row
B, R = len(LENGTHS), 7
TOL = dict(rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def verl():
    """verl's core_algos, rollout_corr_helper and configs; setup_env.sh installs them (absence is a failure)."""
    core = verl_module("verl.trainer.ppo.core_algos")
    rc = verl_module("verl.trainer.ppo.rollout_corr_helper")
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig

    return core, rc, ActorConfig, PolicyLossConfig, RolloutCorrectionConfig


def make_batch(seed: int) -> tuple[dict, dict]:
    """Log-ratios of every size: most near 0, some rows far off, so truncation, IcePop and every
    rejection statistic act on some tokens or rows and keep others."""
    g = torch.Generator().manual_seed(seed)
    d = dict(dtype=torch.float64)
    mask_BR = torch.arange(R)[None, :] < torch.tensor(LENGTHS)[:, None]
    logp_BR = -torch.rand(B, R, generator=g, **d) * 2 - 0.05
    old_BR = logp_BR + 0.3 * torch.randn(B, R, generator=g, **d)
    rollout_BR = old_BR + 0.35 * torch.randn(B, R, generator=g, **d)
    rollout_BR[::3] += 0.6 * torch.randn(len(range(0, B, 3)), 1, generator=g, **d)  # whole rows shifted
    rollout_BR[1, 1] += 3.0  # one far token (k2 = 4.5)
    batch = {
        "response_mask": mask_BR.long(),
        "old_log_probs": old_BR,
        "rollout_log_probs": rollout_BR,
        "advantages": torch.randn(B, R, generator=g, **d),
        "ref_log_prob": logp_BR + 0.3 * torch.randn(B, R, generator=g, **d),
    }
    outputs = {
        "log_probs": logp_BR.clone().requires_grad_(),
        "entropy": (torch.rand(B, R, generator=g, **d) * 3).requires_grad_(),
    }
    return outputs, batch


def ours(outputs: dict, batch: dict, cfg: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    loss, metrics = grpo_loss(outputs, batch, cfg)
    return loss, torch.autograd.grad(loss, outputs["log_probs"])[0], metrics


def actor_config(verl, mode: str, rollout_corr: dict | None = None, n_tok=None, n_seq=None):
    _, _, ActorConfig, PolicyLossConfig, RolloutCorrectionConfig = verl
    kw = {}
    if rollout_corr is not None:  # bypass mode: verl's apply_bypass_mode puts the config here
        kw["policy_loss"] = PolicyLossConfig(
            loss_mode="bypass_mode", rollout_correction=RolloutCorrectionConfig(**rollout_corr)
        )
    cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=mode,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        **kw,
    )
    if n_tok is not None:
        cfg.global_batch_info.update(dp_size=1, batch_num_tokens=n_tok, global_batch_size=n_seq, loss_scale_factor=None)
    return cfg


def verl_decoupled(verl, outputs, batch, corr: dict, mode="token-mean", n_tok=None, n_seq=None, extra=True):
    """verl's trainer (weights and mask over the whole batch) then its ppo_loss: pg - 0.01 * entropy + 0.05 * k3."""
    core, rc, *_ = verl
    w_proto, mask, metrics = rc.compute_rollout_correction_and_rejection_mask(
        batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], **corr
    )
    weights = w_proto.batch["rollout_is_weights"] if w_proto is not None else None
    logp = outputs["log_probs"].detach().clone().requires_grad_()
    vcfg = actor_config(verl, mode, n_tok=n_tok, n_seq=n_seq)
    mask = mask.bool()
    loss, pg_metrics = core.compute_policy_loss_vanilla(
        old_log_prob=batch["old_log_probs"],
        log_prob=logp,
        advantages=batch["advantages"],
        response_mask=mask,
        loss_agg_mode=mode,
        config=vcfg,
        rollout_is_weights=weights,
    )
    if extra:
        info = vcfg.global_batch_info
        loss = loss - 0.01 * core.agg_loss(outputs["entropy"].detach(), mask, mode, **info)
        kl = core.kl_penalty(logp, batch["ref_log_prob"], "low_var_kl")
        loss = loss + 0.05 * core.agg_loss(kl, mask, mode, **info)
    loss.backward()
    return loss, logp.grad, mask, {**metrics, **pg_metrics}


def verl_bypass(verl, outputs, batch, corr: dict, mode="token-mean", n_tok=None, n_seq=None):
    """verl's compute_policy_loss_bypass_mode (old_log_prob = rollout_log_probs), entropy over the batch's mask."""
    core, *_ = verl
    logp = outputs["log_probs"].detach().clone().requires_grad_()
    vcfg = actor_config(verl, mode, {**corr, "bypass_mode": True}, n_tok=n_tok, n_seq=n_seq)
    mask = batch["response_mask"].bool()
    loss, metrics = core.compute_policy_loss_bypass_mode(
        old_log_prob=batch["rollout_log_probs"],
        log_prob=logp,
        advantages=batch["advantages"],
        response_mask=mask,
        loss_agg_mode=mode,
        config=vcfg,
    )
    loss = loss - 0.01 * core.agg_loss(outputs["entropy"].detach(), mask, mode, **vcfg.global_batch_info)
    loss.backward()
    return loss, logp.grad, metrics


EXTRA = {"entropy_coeff": 0.01, "use_kl_loss": True, "kl_loss_coef": 0.05, "kl_loss_type": "low_var_kl"}
CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}

# A threshold per option that rejects some of this data and keeps the rest (the test checks it does both).
RS_THRESHOLDS = {
    "token_k1": "0.6_1.5",
    "token_k2": 0.1,
    "token_k3": 0.1,
    "seq_sum_k1": "0.5_1.6",
    "seq_sum_k2": 0.3,
    "seq_sum_k3": 0.3,
    "seq_mean_k1": "0.8_1.2",
    "seq_mean_k2": 0.06,
    "seq_mean_k3": 0.06,
    "seq_max_k2": 0.15,
    "seq_max_k3": 0.15,
}
assert set(RS_THRESHOLDS) == set(RS_OPTIONS)  # every option verl 0.9.1 has
RS_CASES = [
    *((o, t) for o, t in RS_THRESHOLDS.items()),
    ("token_k1", 1.5),  # k1 with an upper bound alone: lower = 1 / upper
    ("seq_mean_k1", "0.9_1.05"),  # verl's "geometric" RS (Geo-RS): the row's mean log-ratio, asymmetric bounds
    ("token_k1, seq_mean_k3,token_k1", "0.6_1.5,0.06"),  # several options, one threshold each, a duplicate
    ("token_k2,seq_max_k3", 0.15),  # one threshold shared by both
]


def check_rs_metrics(m: dict, vm: dict, options: str) -> None:
    names = ["rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction"]
    for option in dict.fromkeys(o.strip() for o in options.split(",")):
        names += [f"rollout_rs_{option}_{k}" for k in ("mean", "masked_fraction", "seq_masked_fraction")]
    for name in names:
        assert m[f"rollout_corr/{name}"] == pytest.approx(vm[f"rollout_corr/{name}"], rel=1e-6, abs=1e-9), name


@pytest.mark.parametrize("options,threshold", RS_CASES, ids=[f"{o}@{t}" for o, t in RS_CASES])
def test_rejection_sampling_matches_verl(verl, options, threshold):
    outputs, batch = make_batch(1)
    corr = {"rollout_is": None, "rollout_rs": options, "rollout_rs_threshold": threshold}
    loss, grad, m = ours(outputs, batch, {**corr, **EXTRA, **CLIP})
    want, want_grad, vmask, vm = verl_decoupled(verl, outputs, batch, corr)
    torch.testing.assert_close(loss, want, **TOL)
    torch.testing.assert_close(grad, want_grad, **TOL)
    check_rs_metrics(m, vm, options)
    rejected = batch["response_mask"].bool() & ~vmask
    assert rejected.any() and vmask.any(), "the data must exercise the mask, and keep some tokens"
    # rejected tokens get no gradient, and leave the batch (verl's global token count drops them)
    assert (grad[rejected] == 0).all()
    keys = global_loss_keys("grpo", batch, corr)
    assert keys == {"global_num_tokens": float(vmask.sum()), "global_num_seqs": float(vmask.any(-1).sum())}


IS_CASES = [
    (level, threshold, normalize)
    for level in ("token", "sequence")
    for threshold in (1.5, "0.5_2.0")
    for normalize in (False, True)
]


@pytest.mark.parametrize("level,threshold,normalize", IS_CASES)
def test_rollout_is_matches_verl(verl, level, threshold, normalize):
    outputs, batch = make_batch(2)
    corr = {"rollout_is": level, "rollout_is_threshold": threshold, "rollout_is_batch_normalize": normalize}
    loss, grad, m = ours(outputs, batch, {**corr, **EXTRA, **CLIP})
    want, want_grad, _, vm = verl_decoupled(verl, outputs, batch, corr)
    torch.testing.assert_close(loss, want, **TOL)
    torch.testing.assert_close(grad, want_grad, **TOL)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(vm["rollout_corr/rollout_is_mean"], rel=1e-9)
    assert 0 < vm["rollout_corr/rollout_is_ratio_fraction_high"] < 1, "the data must exercise the truncation"
    if level == "token":  # verl's sequence-level fraction is over rows, ours over tokens
        high = vm["rollout_corr/rollout_is_ratio_fraction_high"]
        assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(high, rel=1e-6)
    if isinstance(threshold, str):
        oob = vm["rollout_corr/rollout_is_oob_ratio"]
        assert m["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(oob, rel=1e-6) and oob > 0
    if normalize:
        factor = vm["rollout_corr/rollout_is_batch_norm_factor"]
        assert m["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(factor, rel=1e-7)
        assert abs(factor - 1) > 0.02, "a factor near 1 would not show the normalization"
        assert global_loss_keys("grpo", batch, corr)["rollout_is_batch_mean"] == pytest.approx(factor, rel=1e-7)


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_is_and_rs_together_with_global_counts_match_verl(verl, mode):
    outputs, batch = make_batch(3)
    corr = {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.5,
        "rollout_is_batch_normalize": True,
        "rollout_rs": "token_k1,seq_mean_k3",
        "rollout_rs_threshold": "0.5_2.0,0.06",
    }
    n_tok, n_seq = 97, 23  # as if the mini-batch had more micro-batches
    cfg = {**corr, **EXTRA, **CLIP, "loss_agg_mode": mode, "global_num_tokens": n_tok, "global_num_seqs": n_seq}
    loss, grad, m = ours(outputs, batch, cfg)
    want, want_grad, _, vm = verl_decoupled(verl, outputs, batch, corr, mode, n_tok, n_seq)
    torch.testing.assert_close(loss, want, **TOL)
    torch.testing.assert_close(grad, want_grad, **TOL)
    check_rs_metrics(m, vm, corr["rollout_rs"])
    for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert m[k] == pytest.approx(vm[k], rel=1e-9, abs=1e-12), k


BYPASS_CASES = {
    "ppo_clip": {"loss_type": "ppo_clip", "rollout_is": None},
    "ppo_clip+rs": {"loss_type": "ppo_clip", "rollout_is": None, "rollout_rs": "token_k3", "rollout_rs_threshold": 0.1},
    # IS weights computed for the metrics only: the ratio pi_theta / pi_rollout is the correction
    "ppo_clip+is+geo_rs": {
        "loss_type": "ppo_clip",
        "rollout_is": "token",
        "rollout_is_threshold": 1.5,
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.8_1.2",
    },
    "reinforce": {"loss_type": "reinforce", "rollout_is": None},
    "reinforce+token_tis": {"loss_type": "reinforce", "rollout_is": "token", "rollout_is_threshold": 1.5},
    "reinforce+seq_icepop+rs": {
        "loss_type": "reinforce",
        "rollout_is": "sequence",
        "rollout_is_threshold": "0.3_3.0",
        "rollout_rs": "seq_max_k2",
        "rollout_rs_threshold": 0.15,
    },
    "reinforce+token_tis+normalize+rs": {
        "loss_type": "reinforce",
        "rollout_is": "token",
        "rollout_is_threshold": 1.5,
        "rollout_is_batch_normalize": True,
        "rollout_rs": "token_k1",
        "rollout_rs_threshold": "0.6_1.5",
    },
}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("global_counts", [False, True])
@pytest.mark.parametrize("case", BYPASS_CASES)
def test_bypass_mode_matches_verl(verl, case, global_counts, mode):
    outputs, batch = make_batch(4)
    corr = BYPASS_CASES[case]
    mask = batch["response_mask"]
    n_tok, n_seq = (int(mask.sum()), int(mask.any(-1).sum())) if global_counts else (None, None)
    # the engine fills the counts of the whole batch: rejected tokens count, as in verl's bypass training
    glob = {"global_num_tokens": n_tok, "global_num_seqs": n_seq} if global_counts else {}
    no_old = {k: v for k, v in batch.items() if k != "old_log_probs"}  # not read in bypass mode
    cfg = {**corr, "bypass_mode": True, "entropy_coeff": 0.01, "loss_agg_mode": mode, **CLIP, **glob}
    loss, grad, m = ours(outputs, no_old, cfg)
    want, want_grad, vm = verl_bypass(verl, outputs, batch, corr, mode, n_tok, n_seq)
    torch.testing.assert_close(loss, want, **TOL)
    torch.testing.assert_close(grad, want_grad, **TOL)
    assert m["actor/ppo_kl"] == pytest.approx(vm["actor/ppo_kl"], rel=1e-9, abs=1e-12)
    if corr.get("rollout_rs"):
        check_rs_metrics(m, vm, corr["rollout_rs"])
        assert 0 < vm["rollout_corr/rollout_rs_masked_fraction"] < 1
    if corr.get("rollout_is"):
        assert m["rollout_corr/rollout_is_mean"] == pytest.approx(vm["rollout_corr/rollout_is_mean"], rel=1e-9)
    assert global_loss_keys("grpo", batch, cfg) == {}  # needs the current log-probs: nothing to fill in advance


# ----------------------------------------------------------------------------------------------
# the mini-batch, split into micro-batches


def split_calls(outputs: dict, batch: dict, cfg: dict, num_micro: int) -> tuple[float, torch.Tensor, dict]:
    """The engine's way: global keys over the whole batch (controller), one loss call per micro-batch,
    gradients summed."""
    mask = batch["response_mask"]
    glob = {"global_num_tokens": float(mask.sum()), "global_num_seqs": float(mask.any(-1).sum())}
    glob = {**glob, **global_loss_keys("grpo", batch, cfg)}
    logp = outputs["log_probs"].detach().clone().requires_grad_()
    total, sums = 0.0, {}
    for rows in torch.arange(B).chunk(num_micro):
        mb_out = {"log_probs": logp[rows], "entropy": outputs["entropy"][rows]}
        loss, m = grpo_loss(mb_out, {k: v[rows] for k, v in batch.items()}, {**cfg, **glob})
        total = total + loss
        for k in SUM_METRICS & m.keys():
            sums[k] = sums.get(k, 0.0) + m[k]
    total.backward()
    return float(total.detach()), logp.grad, sums


SPLIT_CONFIGS = {
    "token_is_normalized": {"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_is_batch_normalize": True},
    "seq_icepop_normalized+rs": {
        "rollout_is": "sequence",
        "rollout_is_threshold": "0.3_3.0",
        "rollout_is_batch_normalize": True,
        "rollout_rs": "seq_sum_k1,token_k2",
        "rollout_rs_threshold": "0.5_1.6,0.1",
    },
    "bypass_reinforce+rs": {
        "bypass_mode": True,
        "loss_type": "reinforce",
        "rollout_is": "token",
        "rollout_is_threshold": 1.5,
        "rollout_rs": "token_k3",
        "rollout_rs_threshold": 0.1,
    },
}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("case", SPLIT_CONFIGS)
def test_micro_batches_sum_to_the_mini_batch(case, mode):
    outputs, batch = make_batch(5)
    cfg = {**SPLIT_CONFIGS[case], **EXTRA, "loss_agg_mode": mode}
    if cfg.get("bypass_mode"):
        cfg.pop("use_kl_loss")
    full, full_grad, full_m = ours(outputs, batch, cfg)  # one call: the whole mini-batch, its own counts and mean
    if not cfg.get("bypass_mode"):  # the mean is this call's own: the engine's keys change nothing here
        keyed, _, _ = ours(outputs, batch, {**cfg, **global_loss_keys("grpo", batch, cfg)})
        torch.testing.assert_close(keyed, full, rtol=1e-12, atol=1e-14)
    for num_micro in (1, 2, 4):
        total, grad, sums = split_calls(outputs, batch, cfg, num_micro)
        if cfg.get("bypass_mode"):
            # verl's bypass training counts rejected tokens (its counts precede the mask); one call alone
            # drops them, so compare with one call given the same counts
            glob = {"global_num_tokens": float(batch["response_mask"].sum())}
            glob["global_num_seqs"] = float(batch["response_mask"].any(-1).sum())
            full, full_grad, full_m = ours(outputs, batch, {**cfg, **glob})
        assert total == pytest.approx(full.item(), rel=1e-12, abs=1e-14), num_micro
        torch.testing.assert_close(grad, full_grad, rtol=1e-12, atol=1e-14)
        for k, v in sums.items():
            assert v == pytest.approx(full_m[k], rel=1e-12, abs=1e-14), k


def test_normalizing_per_micro_batch_would_differ():
    """The mini-batch mean matters: each micro-batch dividing by its own mean gives another loss."""
    outputs, batch = make_batch(5)
    cfg = {"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_is_batch_normalize": True}
    full, _, _ = ours(outputs, batch, cfg)
    mask = batch["response_mask"]
    glob = {"global_num_tokens": float(mask.sum()), "global_num_seqs": float(mask.any(-1).sum())}
    local = sum(
        grpo_loss({"log_probs": outputs["log_probs"][r]}, {k: v[r] for k, v in batch.items()}, {**cfg, **glob})[0]
        for r in torch.arange(B).chunk(2)
    )
    assert abs(float(local.detach()) - full.item()) > 1e-4


def test_controller_forward_backward_normalizes_over_the_mini_batch():
    """The controller's forward_backward (no Ray: its workers are stubs that run the loss in-process) deals the
    mini-batch to two ranks in micro-batches of three rows, with the loss's global keys; the summed gradient
    equals one call on the whole batch. The 'model' is a table of log-probs indexed by token id."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from arctic_rl.server.controller import Controller

    _, batch = make_batch(9)
    V, P = 40, 2
    g = torch.Generator().manual_seed(9)
    responses = torch.randint(0, V, (B, R), generator=g)
    batch |= {
        "input_ids": torch.cat([torch.ones(B, P, dtype=torch.long), responses], 1),
        "attention_mask": torch.ones(B, P + R, dtype=torch.long),
        "responses": responses,
        "uid": list(range(B)),
    }
    table = -torch.rand(V, generator=g, dtype=torch.float64) * 2 - 0.05
    theta = table.clone().requires_grad_()
    seen: list[dict] = []

    def forward_backward(mbs, loss_fn, cfg, pp):
        seen.append(cfg)
        out = []
        for mb in (m for m in mbs if m is not None):
            loss, metrics = grpo_loss({"log_probs": theta[mb["responses"]]}, mb, cfg)
            loss.backward()
            out.append({**metrics, "loss": float(loss.detach())})
        return out

    ctl = Controller.__new__(Controller)
    ctl.cfg = SimpleNamespace(
        server=SimpleNamespace(allow_imports=False), training_config=SimpleNamespace(micro_batch_size=3)
    )
    ctl.trainers = [SimpleNamespace(forward_backward=SimpleNamespace(remote=forward_backward)) for _ in range(2)]
    ctl._locked = lambda *engines: nullcontext()
    ctl._get = lambda refs, engine: refs
    cfg = {**SPLIT_CONFIGS["seq_icepop_normalized+rs"], "loss_agg_mode": "token-mean"}
    metrics = ctl.forward_backward(batch, "grpo", cfg)

    ref = table.clone().requires_grad_()
    full, _ = grpo_loss({"log_probs": ref[batch["responses"]]}, batch, cfg)
    full.backward()
    assert metrics["loss"] == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(theta.grad, ref.grad, rtol=1e-12, atol=1e-14)
    assert len(seen) == 2 and all(c == seen[0] and "rollout_is_batch_mean" in c for c in seen)


def test_global_keys_need_the_batch_tensors():
    _, batch = make_batch(6)
    cfg = {"rollout_is": "token", "rollout_is_batch_normalize": True}
    with pytest.raises(ValueError, match="rollout_log_probs"):
        global_loss_keys("grpo", {k: v for k, v in batch.items() if k != "rollout_log_probs"}, cfg)
    assert global_loss_keys("grpo", batch, {"rollout_is": "token"}) == {}  # nothing needs the whole batch
    loglinear = {**cfg, "prox_logp_method": "loglinear", "prox_alpha": 0.5}
    assert global_loss_keys("grpo", batch, loglinear) == {}  # weights depend on the current log-probs
    assert global_loss_keys("sft", batch, {}) == {}


# ----------------------------------------------------------------------------------------------
# config errors


@pytest.mark.parametrize(
    "cfg,match",
    [
        (
            {"rollout_rs": "token_k4", "rollout_rs_threshold": 2.0},
            r"'rollout_rs'\] = 'token_k4'.*token_k4.*known.*seq_max_k3",
        ),
        ({"rollout_rs": "seq_max_k1", "rollout_rs_threshold": 2.0}, r"'rollout_rs'\] = 'seq_max_k1'.*seq_max_k1"),
        ({"rollout_rs": ",", "rollout_rs_threshold": 2.0}, r"'rollout_rs'\] = ','"),
        ({"rollout_rs": 3, "rollout_rs_threshold": 2.0}, r"'rollout_rs'\] = 3"),
        ({"rollout_rs": "token_k2"}, r"'rollout_rs'\] needs loss_config\['rollout_rs_threshold'\]"),
        ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.1_2"}, r"'rollout_rs_threshold'\] = '0.1_2'.*token_k2"),
        ({"rollout_rs": "token_k1", "rollout_rs_threshold": "2_1"}, r"'rollout_rs_threshold'\] = '2_1'.*token_k1"),
        ({"rollout_rs": "token_k3", "rollout_rs_threshold": -1}, r"'rollout_rs_threshold'\] = -1.0.*token_k3"),
        ({"rollout_rs": "token_k3", "rollout_rs_threshold": "x"}, r"'rollout_rs_threshold'\] = 'x'"),
        ({"rollout_rs": "token_k3", "rollout_rs_threshold": True}, r"'rollout_rs_threshold'\] = True"),
        ({"rollout_rs": "token_k1,token_k2", "rollout_rs_threshold": "1,2,3"}, r"'rollout_rs_threshold'\].*one per"),
        ({"rollout_rs_threshold": 2.0}, r"'rollout_rs_threshold'\] only applies with.*'rollout_rs'"),
        ({"rollout_is_batch_normalize": True}, r"'rollout_is_batch_normalize'\] only applies with.*'rollout_is'"),
        ({"rollout_is": "token", "rollout_is_batch_normalize": "yes"}, r"'rollout_is_batch_normalize'\] = 'yes'"),
        ({"bypass_mode": 1}, r"'bypass_mode'\] = 1"),
        ({"bypass_mode": True, "loss_type": "vanilla"}, r"'loss_type'\] = 'vanilla'.*ppo_clip.*reinforce"),
        ({"loss_type": "reinforce"}, r"'loss_type'\] = 'reinforce' only applies with bypass_mode"),
        ({"bypass_mode": True, "policy_loss": "gspo"}, r"'bypass_mode'\].*'policy_loss'\] = 'gspo'"),
        (
            {"bypass_mode": True, "prox_logp_method": "loglinear", "prox_alpha": 0.5},
            r"'bypass_mode'\].*'prox_logp_method'\] = 'loglinear'",
        ),
        ({"rollout_is": "token", "rollout_is_batch_mean": -1.0}, r"'rollout_is_batch_mean'\] = -1.0"),
    ],
)
def test_bad_correction_config_names_key_and_value(cfg, match):
    outputs, batch = make_batch(7)
    with pytest.raises(ValueError, match=match):
        grpo_loss(outputs, batch, cfg)


def test_bypass_needs_rollout_log_probs():
    outputs, batch = make_batch(8)
    with pytest.raises(ValueError, match="rollout_log_probs.*bypass_mode"):
        grpo_loss(outputs, {k: v for k, v in batch.items() if k != "rollout_log_probs"}, {"bypass_mode": True})
