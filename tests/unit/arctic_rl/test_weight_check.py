"""The weight-sync verdicts (server/weight_check.py) on the answers sampler workers give; the engines' halves
run in tests/e2e/test_weight_sync.py."""

import pytest
import torch

from arctic_rl.errors import WeightSyncError
from arctic_rl.server import weight_check


def test_the_first_stale_tensor_and_its_replica_are_named():
    ok = {"stale": None, "checked": 5, "unchecked": 1}
    stale = {"stale": ("model.layers.0.mlp.up_proj.weight", 2e-7), "checked": 3, "unchecked": 0}
    assert weight_check.verify_replicas([ok, ok], "float32") == {"checked_tensors": 5, "unchecked_tensors": 1}
    with pytest.raises(WeightSyncError, match=r"replica 1 .*up_proj\.weight .* 2e-07 .* float32; 2 tensors"):
        weight_check.verify_replicas([ok, stale], "float32")


def test_a_replica_that_compared_nothing_fails():
    with pytest.raises(WeightSyncError, match=r"replica 0: no parameter .* \(4 unchecked\)"):
        weight_check.verify_replicas([{"stale": None, "checked": 0, "unchecked": 4}], "bfloat16")


def test_the_probe_bound_is_exact_in_fp32_and_relative_to_start_up_in_bf16():
    worst, mean = weight_check.probe_diff(torch.tensor([0.0, -1.0]), [0.002, -1.0])
    assert (worst, mean) == pytest.approx((0.002, 0.001))
    with pytest.raises(WeightSyncError, match="max 1e-3"):
        weight_check.verify_probe(worst, mean, baseline=0.0, dtype="float32")
    weight_check.verify_probe(0.5, 0.05, baseline=0.03, dtype="bfloat16")  # within 2 x 0.03 + 0.01
    with pytest.raises(WeightSyncError, match=r"mean 0\.07"):
        weight_check.verify_probe(0.5, 0.08, baseline=0.03, dtype="bfloat16")


def test_the_probe_batch_scores_the_tokens_after_its_prompt():
    batch = weight_check.probe_batch()
    assert batch["input_ids"][0].tolist() == weight_check.PROBE_SEQ
    assert batch["responses"][0].tolist() == weight_check.PROBE_SEQ[weight_check.PROBE_PROMPT_LEN :]


def test_the_probe_is_judged_at_the_coarser_of_the_two_dtypes():
    assert weight_check.probe_dtype("float32", "float32") == "float32"
    assert weight_check.probe_dtype("float32", "bfloat16") == "bfloat16"  # fp32 master weights, bf16 rollouts
    assert weight_check.probe_dtype("bfloat16", "float32") == "bfloat16"
