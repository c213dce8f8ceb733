"""benchmarks/pipeline.py compares like with like: the three modes' run configs differ in their async section
only, every one with the sampler and trainer on disjoint cores and no warm-up of its own; the paired interval is
scipy's paired t-test interval; the limit is the overlap bound. No run: the runs belong in benchmarks/
(docs/benchmarks/pipeline-*.md)."""

from __future__ import annotations

import argparse
import sys

import pytest
from repo_paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import pipeline  # noqa: E402


def args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"steps": 6, "prompts": 2, "chunk_tokens": 16, **kw})


def test_the_modes_differ_in_their_async_section_only(tmp_path):
    cfgs = {m: pipeline.mode_config(m, 1, tmp_path, args()) for m in pipeline.MODES}
    assert not cfgs["sync"].async_.enable
    assert cfgs["one-step-ahead"].async_.enable and not cfgs["one-step-ahead"].async_.partial_rollouts
    assert cfgs["partial"].async_.enable and cfgs["partial"].async_.partial_rollouts
    dumps = {}
    for m, c in cfgs.items():
        d = c.model_dump(by_alias=True)
        assert d["backend"]["cpu"]["split"] is True, m  # the trainer never computes on the sampler's core
        assert d["sft_warmup"]["epochs"] == 0 and d["eval"]["split"] is None and d["seed"] == 1
        assert d["train"]["steps"] == 6 and d["train"]["prompts_per_step"] == 2
        for key in ("async", "checkpoint", "tracking"):
            d.pop(key)
        dumps[m] = d
    assert dumps["sync"] == dumps["one-step-ahead"] == dumps["partial"]
    # one client serves every mode: their deployments are the same
    clients = {m: c.client_config().model_dump() for m, c in cfgs.items()}
    assert clients["sync"] == clients["one-step-ahead"] == clients["partial"]


def test_the_paired_interval_is_the_paired_t_tests():
    from scipy import stats

    mode, sync = [0.52, 0.61, 0.47, 0.58], [0.50, 0.55, 0.49, 0.51]
    mean, lo, hi = pipeline.paired_interval([m - s for m, s in zip(mode, sync, strict=True)])
    want = stats.ttest_rel(mode, sync).confidence_interval(0.95)
    assert mean == pytest.approx(sum(mode) / 4 - sum(sync) / 4)
    assert (lo, hi) == pytest.approx((want.low, want.high))


def test_the_overlap_limit():
    assert pipeline.overlap_limit(gen=3.0, train=1.0, sync=0.0) == pytest.approx(4 / 3)
    assert pipeline.overlap_limit(gen=2.0, train=2.0, sync=0.0) == pytest.approx(2.0)
    assert pipeline.overlap_limit(gen=2.0, train=2.0, sync=1.0) == pytest.approx(5 / 3)
