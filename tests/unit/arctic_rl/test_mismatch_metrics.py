"""The training-inference mismatch metrics (arctic_rl.losses.mismatch) the loop logs every step: verl 0.9.1's
off-policy diagnostics (rollout_corr_helper, installed --no-deps in .venv/verl-ref by scripts/setup_env.sh) to
1e-6 on padded random batches, the untruncated ratio, the staleness histogram, and the loop's use of them.

Legend: B rows, R response columns.
"""

from __future__ import annotations

import pytest
import torch
from repo_paths import REPO, verl_module

from arctic_rl.losses.mismatch import mismatch_metrics

LENGTHS = [6, 3, 1, 6, 0, 4, 2, 5]  # one empty row: verl counts it as a row in its row means
B, R = len(LENGTHS), 6
OFFPOLICY = (
    "training_ppl training_log_ppl kl k3_kl rollout_ppl rollout_log_ppl log_ppl_diff log_ppl_abs_diff "
    "log_ppl_diff_max log_ppl_diff_min ppl_ratio chi2_token chi2_seq"
).split()


@pytest.fixture(scope="module")
def rc():
    """verl's rollout_corr_helper. setup_env.sh installs it, so its absence is a failure, not a skip."""
    return verl_module("verl.trainer.ppo.rollout_corr_helper")


def make_logprobs(seed: int, scale: float = 0.3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(trainer's old log-probs, sampler's, response mask): the sampler's are the trainer's plus noise of
    `scale`; the padding holds garbage (large values), which a metric that reads it would show."""
    g = torch.Generator().manual_seed(seed)
    mask_BR = torch.arange(R)[None, :] < torch.tensor(LENGTHS)[:, None]
    old_BR = -torch.rand(B, R, generator=g, dtype=torch.float64) * 3 - 0.01
    rollout_BR = old_BR + scale * torch.randn(B, R, generator=g, dtype=torch.float64)
    old_BR[~mask_BR], rollout_BR[~mask_BR] = -50.0, 7.0
    return old_BR, rollout_BR, mask_BR.long()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_offpolicy_metrics_are_verls(rc, seed):
    old_BR, rollout_BR, mask_BR = make_logprobs(seed)
    want = rc.compute_rollout_corr_metrics_from_logprobs(old_BR, rollout_BR, mask_BR)
    got = mismatch_metrics(old_BR, rollout_BR, mask_BR)
    assert {k.removeprefix("rollout_corr/") for k in want} == set(OFFPOLICY), "verl 0.9.1's names changed"
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-9), k
    assert all(isinstance(v, float) for v in got.values())


def test_the_ratio_is_the_untruncated_token_ratio():
    old_BR, rollout_BR, mask_BR = make_logprobs(3, scale=1.0)
    m = mismatch_metrics(old_BR, rollout_BR, mask_BR)
    r = (old_BR - rollout_BR).exp()[mask_BR.bool()]
    assert m["rollout_corr/ratio_max"] == pytest.approx(float(r.max()), rel=1e-12) and float(r.max()) > 2
    assert m["rollout_corr/ratio_mean"] == pytest.approx(float(r.mean()), rel=1e-12)
    assert m["rollout_corr/ratio_min"] == pytest.approx(float(r.min()), rel=1e-12) and float(r.min()) < 0.5
    assert m["rollout_corr/ratio_fraction_high"] == pytest.approx(float((r > 2).double().mean()))
    assert m["rollout_corr/ratio_fraction_low"] == pytest.approx(float((r < 0.5).double().mean()))
    icepop = mismatch_metrics(old_BR, rollout_BR, mask_BR, threshold="0.8_1.5")
    assert icepop["rollout_corr/ratio_fraction_high"] == pytest.approx(float((r > 1.5).double().mean()))
    assert icepop["rollout_corr/ratio_fraction_low"] == pytest.approx(float((r < 0.8).double().mean()))


def test_ratio_fractions_match_verls_truncation_fractions(rc):
    old_BR, rollout_BR, mask_BR = make_logprobs(4, scale=1.0)
    _, vm = rc.compute_rollout_correction_weights(
        log_ratio=old_BR - rollout_BR, response_mask=mask_BR, rollout_is="token", rollout_is_threshold=2.0
    )
    m = mismatch_metrics(old_BR, rollout_BR, mask_BR)
    assert 0 < vm["rollout_is_ratio_fraction_high"] < 1 and 0 < vm["rollout_is_ratio_fraction_low"] < 1
    assert m["rollout_corr/ratio_fraction_high"] == pytest.approx(vm["rollout_is_ratio_fraction_high"], rel=1e-6)
    assert m["rollout_corr/ratio_fraction_low"] == pytest.approx(vm["rollout_is_ratio_fraction_low"], rel=1e-6)


def test_identical_log_probs_have_no_mismatch():
    old_BR, _, mask_BR = make_logprobs(5)
    m = mismatch_metrics(old_BR, old_BR.clone(), mask_BR)
    for k in ("kl", "k3_kl", "log_ppl_diff", "log_ppl_abs_diff", "chi2_token", "chi2_seq", "ratio_fraction_high"):
        assert m[f"rollout_corr/{k}"] == pytest.approx(0.0, abs=1e-12), k
    for k in ("ratio_max", "ratio_mean", "ratio_min", "ppl_ratio"):
        assert m[f"rollout_corr/{k}"] == pytest.approx(1.0, abs=1e-12), k
    assert m["rollout_corr/training_ppl"] == pytest.approx(m["rollout_corr/rollout_ppl"], rel=1e-12)


def test_a_larger_perturbation_gives_a_larger_kl():
    old_BR, _, mask_BR = make_logprobs(6)
    noise_BR = torch.randn(B, R, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    # a sampler that is sharper than the trainer on the sampled tokens (as sampled tokens are), by more each run;
    # chi2_token is left out: E[r^2] - 1 over fixed tokens is a divergence only for tokens drawn from pi_rollout
    runs = [mismatch_metrics(old_BR, old_BR + s * (noise_BR.abs() + 0.1), mask_BR) for s in (0.01, 0.05, 0.2, 0.8)]
    for name in ("kl", "k3_kl", "log_ppl_abs_diff"):
        seq = [m[f"rollout_corr/{name}"] for m in runs]
        assert all(a < b for a, b in zip(seq, seq[1:])) and seq[0] > 0, (name, seq)


def test_the_kl_reads_only_response_tokens():
    old_BR, rollout_BR, mask_BR = make_logprobs(8)
    rollout2_BR = rollout_BR.clone()
    rollout2_BR[~mask_BR.bool()] = -1e4  # padding: any value
    assert mismatch_metrics(old_BR, rollout2_BR, mask_BR) == mismatch_metrics(old_BR, rollout_BR, mask_BR)


def test_staleness_histogram_counts_tokens():
    old_BR, rollout_BR, mask_BR = make_logprobs(9)
    sync = mismatch_metrics(old_BR, rollout_BR, mask_BR)
    assert sync["rollout_corr/staleness/frac_0"] == 1.0 and sync["rollout_corr/staleness/max"] == 0.0
    assert not any(k.startswith("rollout_corr/staleness/frac_") and k != "rollout_corr/staleness/frac_0" for k in sync)
    stale_B = torch.tensor([0, 1, 2, 0, 5, 1, 0, 2])  # row 4 is empty: its 5 does not count
    m = mismatch_metrics(old_BR, rollout_BR, mask_BR, staleness_B=stale_B, max_staleness=3)
    tokens = sum(LENGTHS)
    assert m["rollout_corr/staleness/frac_0"] == pytest.approx((6 + 6 + 2) / tokens)
    assert m["rollout_corr/staleness/frac_1"] == pytest.approx((3 + 4) / tokens)
    assert m["rollout_corr/staleness/frac_2"] == pytest.approx((1 + 5) / tokens)
    assert m["rollout_corr/staleness/frac_3"] == 0.0 and "rollout_corr/staleness/frac_4" not in m
    assert m["rollout_corr/staleness/max"] == 2.0
    assert m["rollout_corr/staleness/mean"] == pytest.approx((7 + 2 * 6) / tokens)


def test_empty_and_misshapen_inputs():
    old_BR, rollout_BR, mask_BR = make_logprobs(10)
    assert mismatch_metrics(old_BR, rollout_BR, torch.zeros_like(mask_BR)) == {}
    with pytest.raises(ValueError, match="one \\[B, R\\] shape"):
        mismatch_metrics(old_BR, rollout_BR[:, :-1], mask_BR)
    with pytest.raises(ValueError, match="one per row"):
        mismatch_metrics(old_BR, rollout_BR, mask_BR, staleness_B=torch.zeros(B - 1))


@pytest.mark.parametrize("async_", [False, True])
def test_the_loop_logs_the_mismatch_with_each_rollouts_staleness(async_, tmp_path):
    from arctic_rl.loop.grpo import step_mismatch
    from arctic_rl.rollout.pipeline import Rollout
    from arctic_rl.runconfig import load_run_config

    overrides = [f"model.name_or_path={tmp_path}"] + (["async.enable=true", "async.max_staleness=2"] if async_ else [])
    cfg = load_run_config(REPO / "tests" / "configs" / "tiny_loop.yaml", overrides)
    old_BR, rollout_BR, mask_BR = make_logprobs(11)
    batch = {"old_log_probs": old_BR, "rollout_log_probs": rollout_BR, "response_mask": mask_BR}
    version = 3 if async_ else 4  # trained at step 5: sampled by the weights after 3 (async) or 4 (sync) steps
    rollout = Rollout(5, [], [{}] * B, version=version, wait_s=0.0, gen_s=0.0)
    m = step_mismatch(cfg, batch, rollout)
    assert m["rollout_corr/kl"] == mismatch_metrics(old_BR, rollout_BR, mask_BR)["rollout_corr/kl"]
    assert m["rollout_corr/staleness/max"] == (1.0 if async_ else 0.0)
    frac = {k.rpartition("_")[2]: v for k, v in m.items() if k.startswith("rollout_corr/staleness/frac_")}
    assert frac == ({"0": 0.0, "1": 1.0, "2": 0.0} if async_ else {"0": 1.0})
