"""ZoRRo's CPU group-attention kernel (the cascade prefix pass) equals softmax attention in float64."""
from __future__ import annotations

import shutil

import pytest
import torch

from arctic_rl.zorro import group_attention as ga
from arctic_rl.zorro.merge import attention_with_lse


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """Build into an empty cache folder (and forget any library loaded earlier in this process)."""
    monkeypatch.setenv("ARCTIC_RL_KERNEL_CACHE", str(tmp_path))
    ga.load.cache_clear()
    yield tmp_path
    ga.load.cache_clear()


def test_kernel_builds_once_and_leaves_only_the_library(fresh_build):
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.fail("no C++ compiler: the CPU cascade kernel cannot be built (install g++)")
    assert ga.load() is not None
    assert [p.suffix for p in fresh_build.iterdir()] == [".so"]  # no temporary left behind
    ga.load.cache_clear()
    assert ga.load() is not None and len(list(fresh_build.iterdir())) == 1  # reused, not rebuilt


# (B, H, R, S, D): full and partial 16-row chunks, partial and tiny key tiles, head dims that hit the
# 8-column remainder loop, several batches.
SHAPES = [(1, 16, 16, 2048, 128), (1, 4, 64, 300, 128), (2, 3, 13, 37, 64), (3, 2, 16, 5, 36), (1, 2, 32, 1, 80)]


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_kernel_equals_attention(shape, fresh_build):
    B, H, R, S, D = shape
    g = torch.Generator().manual_seed(sum(shape))
    q = torch.randn(B, H, R, D, generator=g)
    # keys as a strided view ([B, S, H, D] storage, as the paged cache gathers them)
    k = torch.randn(B, S, H, D, generator=g).transpose(1, 2)
    v = torch.randn(B, S, H, D, generator=g).transpose(1, 2)
    assert ga.load() is not None
    out, lse = ga.group_attention(q, k, v, D ** -0.5)
    ref_o, ref_l = attention_with_lse(q.double(), k.double(), v.double(), scale=D ** -0.5)
    torch.testing.assert_close(out.double(), ref_o, atol=2e-6, rtol=0)
    torch.testing.assert_close(lse.double(), ref_l, atol=2e-6, rtol=1e-6)


def test_kernel_is_stable_for_large_scores(fresh_build):
    """Scores of several hundred: the online softmax must rescale, never overflow exp."""
    g = torch.Generator().manual_seed(7)
    q = 20 * torch.randn(1, 2, 16, 64, generator=g)
    k, v = torch.randn(1, 2, 500, 64, generator=g), torch.randn(1, 2, 500, 64, generator=g)
    out, lse = ga.group_attention(q, k, v, 1.0)
    ref_o, ref_l = attention_with_lse(q.double(), k.double(), v.double(), scale=1.0)
    assert torch.isfinite(out).all() and lse.abs().max() > 200
    torch.testing.assert_close(out.double(), ref_o, atol=2e-5, rtol=0)
    torch.testing.assert_close(lse.double(), ref_l, atol=0, rtol=1e-6)


def test_small_groups_and_disabled_kernel_use_torch(fresh_build, monkeypatch):
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 2, 2, 32, generator=g), torch.randn(1, 2, 40, 32, generator=g), torch.randn(1, 2, 40, 32, generator=g)
    calls = []
    monkeypatch.setattr(ga, "load", lambda: calls.append(1))
    out, lse = ga.group_attention(q, k, v, 0.2)  # 2 rows in 16 lanes: torch's kernel, load() not even asked
    assert calls == []
    ref_o, ref_l = attention_with_lse(q, k, v, scale=0.2)
    torch.testing.assert_close(out, ref_o, atol=2e-6, rtol=0)
    monkeypatch.undo()
    monkeypatch.setenv("ARCTIC_RL_CPU_KERNEL", "0")
    ga.load.cache_clear()
    assert ga.load() is None


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"k and v of shape \[1, 2, S, 8\]"):
        ga.group_attention(torch.zeros(1, 2, 16, 8), torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4), 1.0)
