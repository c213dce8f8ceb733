"""ZoRRo's CPU cascade kernel (arctic_rl/zorro/group_attention.cpp) equals softmax attention in
float64, reading keys in place from a paged cache in vLLM-CPU's layout or from contiguous tensors."""

from __future__ import annotations

import shutil

import pytest
import torch

from arctic_rl.zorro import group_attention as ga
from arctic_rl.zorro.merge import attention_with_lse, merge_attention_states
from arctic_rl.zorro.vllm_cpu import split_kv_cache


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The kernel built once for the module into an empty cache folder (forgetting any library loaded
    earlier): a build is seconds of g++, which every test would otherwise pay again."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.fail("no C++ compiler: ZoRRo's CPU kernel cannot be built (install g++)")
    folder = tmp_path_factory.mktemp("kernel-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARCTIC_RL_KERNEL_CACHE", str(folder))
        ga.load.cache_clear()
        assert ga.load() is not None
    ga.load.cache_clear()
    return folder


@pytest.fixture
def kernel(built, monkeypatch):
    """The module's kernel, loaded from its cache folder."""
    monkeypatch.setenv("ARCTIC_RL_KERNEL_CACHE", str(built))
    ga.load.cache_clear()
    assert ga.load() is not None
    yield built
    ga.load.cache_clear()


def test_builds_once_and_leaves_only_the_library(kernel):
    assert [p.suffix for p in kernel.iterdir()] == [".so"]  # no temporary file left behind
    ga.load.cache_clear()
    assert ga.load() is not None and len(list(kernel.iterdir())) == 1  # reused, not rebuilt


def test_disabled_kernel_is_none(monkeypatch):
    monkeypatch.setenv("ARCTIC_RL_CPU_KERNEL", "0")
    ga.load.cache_clear()
    try:
        assert ga.load() is None
    finally:
        ga.load.cache_clear()


def vllm_cache(nblocks, K, bs, D, g):
    """A vLLM-CPU kv_cache [blocks, K, bs, 2D] of random values, its (key, value) views, and a
    reader of key/value (block, head, slot) as [D] vectors (keys are stored K^T per block)."""
    kv = torch.randn(nblocks, K, bs, 2 * D, generator=g)
    kc, vc = split_kv_cache(kv)

    def key(blk, h, slot):
        return kc[blk, h].reshape(D, bs)[:, slot]

    def value(blk, h, slot):
        return vc[blk, h, slot]

    return kc, vc, key, value


def reference(q, key, value, table, bs, starts, ends, scale):
    outs, lses = [], []
    for b in range(q.shape[0]):
        ts = range(int(starts[b]), int(ends[b]))
        ks = torch.stack([torch.stack([key(int(table[b, t // bs]), h, t % bs) for t in ts]) for h in range(q.shape[1])])
        vs = torch.stack(
            [torch.stack([value(int(table[b, t // bs]), h, t % bs) for t in ts]) for h in range(q.shape[1])]
        )
        o, l = attention_with_lse(q[b : b + 1].double(), ks[None].double(), vs[None].double(), scale=scale)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


# (R rows, D): 1-4 rows take the keys-in-lanes path, more rows the rows-in-lanes one (13: a partial
# 16-row chunk; 40: three chunks of one item; 70: an item of four chunks and one of one, partial);
# D 64/128, and 80 (a multiple of 16, not of 32).
@pytest.mark.parametrize("R, D", [(1, 128), (4, 64), (13, 64), (16, 128), (40, 80), (70, 64)])
def test_paged_vllm_layout_equals_attention(R, D, kernel):
    g = torch.Generator().manual_seed(R * 1000 + D)
    K, bs, nblocks = 3, 32, 12
    kc, vc, key, value = vllm_cache(nblocks, K, bs, D, g)
    table = torch.randperm(nblocks, generator=g)[:10].view(2, 5).to(torch.int32)
    starts, ends = torch.tensor([0, 64]), torch.tensor([150, 75])  # partial tiles; a start past the prefix
    q = torch.randn(2, K, R, D, generator=g)
    out, lse = ga.paged_group_attention(q, kc, vc, table, starts, ends, D**-0.5, key_t_in_block=True)
    ref_o, ref_l = reference(q, key, value, table, bs, starts, ends, D**-0.5)
    torch.testing.assert_close(out.double(), ref_o, atol=2e-6, rtol=0)
    torch.testing.assert_close(lse.double(), ref_l, atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize("R", [2, 16])
def test_contiguous_keys_and_empty_ranges(R, kernel):
    """block_table None: row b's own [H, S, D] keys (a strided view); a row with no keys gives out 0
    and lse -inf, the empty part merge_attention_states expects."""
    g = torch.Generator().manual_seed(R)
    B, H, S, D = 3, 2, 37, 64
    q = torch.randn(B, H, R, D, generator=g)
    k = torch.randn(B, S, H, D, generator=g).transpose(1, 2)
    v = torch.randn(B, S, H, D, generator=g).transpose(1, 2)
    starts, ends = torch.tensor([0, 5, 9]), torch.tensor([S, 30, 9])
    out, lse = ga.paged_group_attention(q, k, v, None, starts, ends, 0.3, key_t_in_block=False)
    for b in range(2):
        s, e = int(starts[b]), int(ends[b])
        ref_o, ref_l = attention_with_lse(
            q[b : b + 1].double(), k[b : b + 1, :, s:e].double(), v[b : b + 1, :, s:e].double(), scale=0.3
        )
        torch.testing.assert_close(out[b : b + 1].double(), ref_o, atol=2e-6, rtol=0)
        torch.testing.assert_close(lse[b : b + 1].double(), ref_l, atol=2e-6, rtol=1e-6)
    assert (out[2] == 0).all() and torch.isneginf(lse[2]).all()


@pytest.mark.parametrize("R, paged", [(1, True), (3, False), (16, True), (16, False)])
def test_initial_state_is_merged(R, paged, kernel):
    """init=(out, lse) of other keys: the kernel continues that online softmax, which must equal
    merge_attention_states(init, attention over these keys). Rows with an empty init (lse -inf, out
    garbage) and rows with no keys (the init comes back) included."""
    g = torch.Generator().manual_seed(R + 100 * paged)
    B, K, bs, D = 3, 2, 32, 64
    q = torch.randn(B, K, R, D, generator=g)
    o0, l0 = torch.randn(B, K, R, D, generator=g), 3 * torch.randn(B, K, R, generator=g)
    l0[0, 1] = l0[2, 0] = float("-inf")
    o0[0, 1] = o0[2, 0] = float("nan")  # never read where lse is -inf
    starts, ends = torch.tensor([0, 32, 64]), torch.tensor([70, 100, 64])
    if paged:
        kc, vc, key, value = vllm_cache(12, K, bs, D, g)
        table = torch.randperm(12, generator=g)[:12].view(B, 4).to(torch.int32)
        out, lse = ga.paged_group_attention(q, kc, vc, table, starts, ends, D**-0.5, key_t_in_block=True, init=(o0, l0))
        ref_o, ref_l = reference(q[:2], key, value, table, bs, starts, ends, D**-0.5)
    else:
        k, v = torch.randn(B, K, 128, D, generator=g), torch.randn(B, K, 128, D, generator=g)
        out, lse = ga.paged_group_attention(q, k, v, None, starts, ends, D**-0.5, key_t_in_block=False, init=(o0, l0))
        ref = [
            attention_with_lse(
                q[b : b + 1].double(), k[b : b + 1, :, s:e].double(), v[b : b + 1, :, s:e].double(), scale=D**-0.5
            )
            for b, s, e in [(0, 0, 70), (1, 32, 100)]
        ]
        ref_o, ref_l = torch.cat([r[0] for r in ref]), torch.cat([r[1] for r in ref])
    o0d = torch.where(torch.isneginf(l0)[..., None], 0.0, o0).double()
    m_o, m_l = merge_attention_states(o0d[:2], l0[:2].double(), ref_o, ref_l)
    torch.testing.assert_close(out[:2].double(), m_o, atol=2e-6, rtol=0)
    torch.testing.assert_close(lse[:2].double(), m_l, atol=2e-6, rtol=1e-6)
    torch.testing.assert_close(out[2], o0d[2].float())  # no keys: the initial state (0 where empty)
    torch.testing.assert_close(lse[2], l0[2])
    with pytest.raises(ValueError, match="init needs fp32 out"):
        ga.paged_group_attention(
            q,
            k if not paged else kc,
            v if not paged else vc,
            None if not paged else table,
            starts,
            ends,
            1.0,
            key_t_in_block=paged,
            init=(o0[:, :1], l0),
        )


@pytest.mark.parametrize("R", [1, 16])
def test_large_scores_stay_finite(R, kernel):
    """Scores in the hundreds: the online softmax must rescale, never overflow exp."""
    g = torch.Generator().manual_seed(7)
    K, bs, D = 2, 16, 64
    kc, vc, key, value = vllm_cache(40, K, bs, D, g)
    table = torch.arange(40, dtype=torch.int32).view(1, 40)
    q = 20 * torch.randn(1, K, R, D, generator=g)
    out, lse = ga.paged_group_attention(
        q, kc, vc, table, torch.tensor([0]), torch.tensor([600]), 1.0, key_t_in_block=True
    )
    ref_o, ref_l = reference(q, key, value, table, bs, [0], [600], 1.0)
    assert torch.isfinite(out).all() and lse.abs().max() > 100
    # fp32 scores of this size carry ~1e-5 of rounding: torch's own fp32 flash kernel is 2.7e-5 off
    # float64 on this input, so the bound is a small multiple of that
    torch.testing.assert_close(out.double(), ref_o, atol=1e-4, rtol=0)
    torch.testing.assert_close(lse.double(), ref_l, atol=0, rtol=1e-6)


def test_bad_inputs_are_named(kernel):
    g = torch.Generator().manual_seed(0)
    kc, vc, _, _ = vllm_cache(4, 2, 32, 64, g)
    q = torch.randn(1, 2, 16, 64, generator=g)
    table = torch.arange(4, dtype=torch.int32).view(1, 4)
    with pytest.raises(ValueError, match="not block-aligned"):
        ga.paged_group_attention(q, kc, vc, table, torch.tensor([3]), torch.tensor([60]), 1.0, key_t_in_block=True)
    with pytest.raises(ValueError, match="block size 8 is not a multiple of 16"):
        kc8, vc8, _, _ = vllm_cache(4, 2, 8, 64, g)
        ga.paged_group_attention(q, kc8, vc8, table, torch.tensor([0]), torch.tensor([20]), 1.0, key_t_in_block=True)
    with pytest.raises(ValueError, match=r"caches \[blocks, 2, bs, 32\]"):
        ga.paged_group_attention(
            torch.randn(1, 2, 16, 32), kc, vc, table, torch.tensor([0]), torch.tensor([9]), 1.0, key_t_in_block=True
        )
