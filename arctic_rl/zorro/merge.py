"""The one attention idea under both ZoRRos: split the key set in two, attend to each part, merge.

For one query, softmax attention over keys K = K_a ∪ K_b is

    out = (exp(lse_a) * out_a + exp(lse_b) * out_b) / (exp(lse_a) + exp(lse_b)),
    lse = log(exp(lse_a) + exp(lse_b)),

where (out_x, lse_x) are the output and log-sum-exp of the scaled scores of attention over K_x
alone. The merge is exact in exact arithmetic; in fp32 it agrees with one pass to ~1e-7.

Layout: `out_*` is [..., D] and `lse_*` is out.shape[:-1] (any leading dims, e.g. [B, H, L]
with out [B, H, L, D]; or [N, H] with out [N, H, D] as in vLLM / flashinfer).
"""

from __future__ import annotations

import torch


def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention over the union of two disjoint key sets. Differentiable.

    An empty part has lse = -inf (and any finite out): the other part is returned as is. Both
    parts empty gives out = 0, lse = -inf (never NaN).

    >>> o, l = merge_attention_states(oa, la, ob, lb)   # oa, ob: [B, H, L, D]; la, lb: [B, H, L]
    """
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or lse_a.shape != out_a.shape[:-1]:
        raise ValueError(
            f"merge_attention_states: shapes must be out [..., D] and lse [...] alike; got "
            f"out_a {list(out_a.shape)}, lse_a {list(lse_a.shape)}, out_b {list(out_b.shape)}, "
            f"lse_b {list(lse_b.shape)}"
        )
    acc = torch.promote_types(torch.promote_types(lse_a.dtype, lse_b.dtype), torch.float32)
    lse_a, lse_b = lse_a.to(acc), lse_b.to(acc)
    # w_a = e^a / (e^a + e^b) = sigmoid(a - b); few ops, since decode runs it per layer and step.
    # a - b is NaN only where both parts are empty: weight 0.5 there, then the output is zeroed.
    both_empty = torch.isneginf(lse_a) & torch.isneginf(lse_b)
    w_a = torch.sigmoid(torch.nan_to_num(lse_a - lse_b, nan=0.0)).unsqueeze(-1)
    out = torch.lerp(out_b, out_a, w_a.to(out_a.dtype)).masked_fill(both_empty.unsqueeze(-1), 0.0)
    return out, torch.logaddexp(lse_a, lse_b)


def merge_attention_rows(
    out: torch.Tensor, lse: torch.Tensor, index: torch.Tensor, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """merge_attention_states over any number of parts: part t (out [T, ..., D], lse [T, ...]) is
    attention of query row index[t] over its own disjoint key set (a split of a long key range, as
    in split-KV decoding). Returns (out [num_rows, ..., D] in float32 or wider, lse [num_rows, ...]);
    a row with no part, or only empty ones, gets out 0 and lse -inf."""
    if lse.shape != out.shape[:-1] or index.shape != lse.shape[:1]:
        raise ValueError(
            f"merge_attention_rows: need out [T, ..., D], lse [T, ...], index [T]; got out "
            f"{list(out.shape)}, lse {list(lse.shape)}, index {list(index.shape)}"
        )
    acc = torch.promote_types(lse.dtype, torch.float32)
    lse = lse.to(acc)
    shape = (num_rows, *lse.shape[1:])
    idx = index.view(-1, *([1] * (lse.dim() - 1))).expand_as(lse)
    top = lse.new_full(shape, float("-inf")).scatter_reduce(0, idx, lse, "amax")
    top = torch.where(torch.isneginf(top), 0.0, top)  # empty rows: weights below are 0
    w = torch.exp(lse - top.index_select(0, index))
    den = lse.new_zeros(shape).index_add_(0, index, w)
    num = out.new_zeros(*shape, out.shape[-1], dtype=acc).index_add_(0, index, w.unsqueeze(-1) * out.to(acc))
    merged = torch.where(den.unsqueeze(-1) > 0, num / den.clamp(min=torch.finfo(acc).tiny).unsqueeze(-1), 0.0)
    return merged, top + torch.log(den)


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference softmax attention returning (out [B, H, L, D], lse [B, H, L]); GQA by head repeat.

    `causal` aligns the diagonal bottom-right (query i of L sees keys 0..S-L+i), which is what a
    query block that continues a key block needs. Plain math; for tests and as a fallback.
    """
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if H != Hkv:
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    scale = D**-0.5 if scale is None else scale
    acc = torch.promote_types(q.dtype, torch.float32)
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale
    if causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)).unsqueeze(-1))
    return torch.matmul(p, v.to(acc)).to(q.dtype), lse
