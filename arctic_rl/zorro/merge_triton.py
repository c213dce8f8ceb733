"""The cascade step's last merge as one Triton kernel (CUDA only; imported lazily where Triton exists).

On a GPU a decode step's attention for a batch of requests is tens of microseconds of memory traffic,
and each small torch op around it costs a launch of a few microseconds. The torch form of the merge
(index, unpack, `merge_attention_states`, scatter back) is many launches, which on a GPU cost more than
the prefix KV reads that cascade saves (docs/benchmarks/cascade_attention_cuda-*.md). This kernel reads each
grouped request's prefix result straight from the packed prefix pass, merges it with the suffix
result (and the prefix's splits, if it was split) by their log-sum-exps and writes it over the
suffix result in place: one launch.

Layouts (FlashAttention's varlen outputs, contiguous):
  out_s  [Q, H, D]   suffix pass output, one row per request; overwritten for grouped requests
  lse_s  [H, Q]      float32
  out_p  [T, H/r, D] prefix pass output; row base[m] + j + i*stride[m], head a is split i of query
                     head a*r + j of member m (r query heads packed per KV head)
  lse_p  [H/r, T]    float32
  order  [M]         request index of member m
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_kernel(
    out_s,
    lse_s,
    out_p,
    lse_p,
    order,
    base,
    stride,
    nsplit,
    H,
    Hp,
    Q,
    T,
    R: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    m = tl.program_id(0)
    h = tl.program_id(1)
    req = tl.load(order + m)
    a = h // R
    row0 = tl.load(base + m) + h % R  # member m's row in the prefix pass's first split
    step = tl.load(stride + m)  # rows between its splits
    n = tl.load(nsplit + m)
    ls = tl.load(lse_s + h * Q + req)
    top = ls
    for i in range(0, n):
        top = tl.maximum(top, tl.load(lse_p + a * T + row0 + i * step))
    top = tl.where(top == float("-inf"), 0.0, top)  # every part empty: weights 0, output 0
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    dst = out_s + (req * H + h) * D + offs
    w = tl.exp(ls - top)
    den = w
    acc = tl.load(dst, mask=mask).to(tl.float32) * w
    for i in range(0, n):
        row = row0 + i * step
        w = tl.exp(tl.load(lse_p + a * T + row) - top)
        acc += tl.load(out_p + (row * Hp + a) * D + offs, mask=mask).to(tl.float32) * w
        den += w
    tl.store(dst, tl.where(den > 0, acc / den, 0.0).to(dst.dtype.element_ty), mask=mask)


def merge_prefix_into_suffix(
    out_s: torch.Tensor,
    lse_s: torch.Tensor,
    out_p: torch.Tensor,
    lse_p: torch.Tensor,
    order: torch.Tensor,
    base: torch.Tensor,
    stride: torch.Tensor,
    nsplit: torch.Tensor,
    heads_per_kv: int,
) -> torch.Tensor:
    """Merges each grouped request's prefix splits into out_s (in place) and returns out_s. Member m
    (request order[m]) has nsplit[m] prefix rows, base[m] + j + i * stride[m] for split i and packed
    head j (see arctic_rl.zorro.vllm_cuda.plan_cascade)."""
    Q, H, D = out_s.shape
    M, r = order.numel(), heads_per_kv
    T = out_p.shape[0]
    if (
        out_p.shape[1:] != (H // r, D)
        or lse_p.shape != (H // r, T)
        or lse_s.shape != (H, Q)
        or not all(t.shape == (M,) for t in (base, stride, nsplit))
        or not all(t.is_contiguous() for t in (out_s, lse_s, out_p, lse_p, order, base, stride, nsplit))
    ):
        raise ValueError(
            f"merge_prefix_into_suffix: unexpected layout out_s {list(out_s.shape)}, lse_s "
            f"{list(lse_s.shape)}, out_p {list(out_p.shape)}, lse_p {list(lse_p.shape)}, M {M}, r {r}"
        )
    if M:
        _merge_kernel[(M, H)](
            out_s,
            lse_s.float(),
            out_p,
            lse_p.float(),
            order,
            base,
            stride,
            nsplit,
            H,
            H // r,
            Q,
            T,
            R=r,
            D=D,
            BLOCK_D=triton.next_power_of_2(D),
        )
    return out_s
