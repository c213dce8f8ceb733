"""The merge primitive and cascade decode attention equal one attention pass over all keys."""
from __future__ import annotations

import pytest
import torch

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
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, torch.cat([ka, kb], 2), torch.cat([va, vb], 2),
                                                            attn_mask=mask, enable_gqa=True)
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
