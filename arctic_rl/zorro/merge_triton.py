"""The cascade step's last merge as one Triton kernel (CUDA only; imported lazily where Triton exists).

On a GPU a decode step's attention for a batch of requests is tens of microseconds of memory traffic,
and each small torch op around it costs a launch of a few microseconds. The torch form of the merge
(index, unpack, `merge_attention_states`, scatter back) is about 20 launches, which measured on an
H200 cost more than the prefix KV reads that cascade saves (docs/zorro.md). This kernel reads each
grouped request's prefix result straight from the packed prefix pass, merges it with the suffix
result by their log-sum-exps and writes it over the suffix result in place: one launch.

Layouts (FlashAttention's varlen outputs, contiguous):
  out_s  [Q, H, D]   suffix pass output, one row per request; overwritten for grouped requests
  lse_s  [H, Q]      float32
  out_p  [M*r, H/r, D] prefix pass output: row m*r + j, head a is query head a*r + j of member m
  lse_p  [H/r, M*r]  float32
  order  [M]         request index of member m
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_kernel(out_s, lse_s, out_p, lse_p, order, H, Hp, Q, MR, R: tl.constexpr, D: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    m = tl.program_id(0)
    h = tl.program_id(1)
    req = tl.load(order + m)
    a = h // R
    prow = m * R + h % R
    lp = tl.load(lse_p + a * MR + prow)
    ls = tl.load(lse_s + h * Q + req)
    top = tl.maximum(lp, ls)
    top = tl.where(top == float("-inf"), 0.0, top)   # both parts empty: weights 0, output 0
    wp = tl.exp(lp - top)
    ws = tl.exp(ls - top)
    den = wp + ws
    inv = tl.where(den > 0, 1.0 / den, 0.0)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    op = tl.load(out_p + (prow * Hp + a) * D + offs, mask=mask).to(tl.float32)
    dst = out_s + (req * H + h) * D + offs
    sv = tl.load(dst, mask=mask).to(tl.float32)
    tl.store(dst, ((op * wp + sv * ws) * inv).to(dst.dtype.element_ty), mask=mask)


def merge_prefix_into_suffix(out_s: torch.Tensor, lse_s: torch.Tensor, out_p: torch.Tensor, lse_p: torch.Tensor,
                             order: torch.Tensor, heads_per_kv: int) -> torch.Tensor:
    """Merges each grouped request's prefix result into out_s (in place) and returns out_s."""
    Q, H, D = out_s.shape
    M, r = order.numel(), heads_per_kv
    if (out_p.shape != (M * r, H // r, D) or lse_p.shape != (H // r, M * r) or lse_s.shape != (H, Q)
            or not all(t.is_contiguous() for t in (out_s, lse_s, out_p, lse_p, order))):
        raise ValueError(f"merge_prefix_into_suffix: unexpected layout out_s {list(out_s.shape)}, lse_s "
                         f"{list(lse_s.shape)}, out_p {list(out_p.shape)}, lse_p {list(lse_p.shape)}, M {M}, r {r}")
    if M:
        _merge_kernel[(M, H)](out_s, lse_s.float(), out_p, lse_p.float(), order, H, H // r, Q, M * r, R=r, D=D,
                              BLOCK_D=triton.next_power_of_2(D))
    return out_s
