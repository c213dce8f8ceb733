"""Buckets for streaming weight sync: which trainer parameters travel together, and one bucket as a flat buffer.

vLLM's `reload_weights` loads a partial set of weights layer by layer: a vLLM module is processed once all its
weights arrived in that call, and one that got only some of them is processed with the rest missing. So a
bucket holds whole vLLM modules: the pieces vLLM fuses into one parameter (q/k/v_proj -> qkv_proj, gate/up_proj
-> gate_up_proj) and a module's weight and bias always share a bucket.

A bucket crosses processes as one flat uint8 array plus (name, shape, offset) entries: numpy arrays go through
Ray's object store without a pickled copy, and the receiver reads its tensors in place (`unpack`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import torch

from arctic_rl.errors import ConfigError

# vLLM fuses these HF projections into one parameter, concatenated along dim 0 in this order.
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_PIECE_OF = {piece: fused for fused, pieces in FUSED.items() for piece in pieces}

Entry = tuple[str, tuple[int, ...], int]  # name, shape, byte offset in the flat buffer

# A bucket is at most this fraction of the model. A process's extra memory during a sync is a few buckets, not
# one: on the first sync every process touches object-store pages for the first time (the store hands out fresh
# regions while the last buckets' frees are pending, which stay resident and are reused by later syncs; how many is
# Ray's free period's worth: local_ray.RAY_SYSTEM_CONFIG), besides the bucket being packed or loaded. At 1/16 the sampler's first sync of a
# small model still reached half of it (tests/e2e/test_weight_sync_memory.py); at 1/32 it stays under.
MODEL_FRACTION = 32
MIN_BUCKET_BYTES = 8 << 20  # below this the per-bucket round trips cost more than the memory saved


def bucket_bytes(sync_bucket_mb: int, model_bytes: int) -> int:
    """The bucket size a sync uses: vllm_config.sync_bucket_mb MiB, at most 1/MODEL_FRACTION of the model
    (so a few buckets stay under half of it), and not under MIN_BUCKET_BYTES."""
    return min(sync_bucket_mb << 20, max(model_bytes // MODEL_FRACTION, MIN_BUCKET_BYTES))


def vllm_module(name: str) -> str:
    """The vLLM module an HF parameter name loads into: its owning module, with fused pieces renamed."""
    parts = name.split(".")[:-1]
    return ".".join(_PIECE_OF.get(p, p) for p in parts)


def plan_buckets(sizes: Iterable[tuple[str, int]], bucket_bytes: int) -> list[list[str]]:
    """Parameter names (in the given order, grouped by vLLM module) split into buckets of at most `bucket_bytes`;
    a module larger than that is a bucket of its own. `sizes`: (name, bytes) per parameter."""
    if bucket_bytes < 1:
        raise ConfigError(f"bucket size must be at least 1 byte, got {bucket_bytes}")
    groups: dict[str, list[tuple[str, int]]] = {}
    for name, nbytes in sizes:
        groups.setdefault(vllm_module(name), []).append((name, nbytes))
    buckets: list[list[str]] = []
    current: list[str] = []
    used = 0
    for members in groups.values():
        size = sum(n for _, n in members)
        if current and used + size > bucket_bytes:
            buckets.append(current)
            current, used = [], 0
        current += [name for name, _ in members]
        used += size
    if current:
        buckets.append(current)
    return buckets


def checkpoint_layout(
    model: torch.nn.Module, tensors: list[tuple[str, torch.Tensor]]
) -> list[tuple[str, torch.Tensor]]:
    """`tensors` under the names and in the layout of the model's checkpoint, as vLLM loads them: transformers keeps
    some models in another layout than their checkpoints (an MoE layer's experts stacked into one
    `experts.gate_up_proj`), and its own revert_weight_conversion (what save_pretrained writes with) turns them
    back (per-expert `experts.<e>.gate_proj.weight`, ...). Models without such a conversion pass unchanged. A bucket
    holds whole vLLM modules, so every tensor a conversion needs is in it."""
    from transformers.core_model_loading import revert_weight_conversion

    return list(revert_weight_conversion(cast(Any, model), dict(tensors)).items())


def pack(tensors: list[tuple[str, torch.Tensor]], dtype: torch.dtype) -> tuple[torch.Tensor, list[Entry]]:
    """One flat uint8 CPU tensor holding `tensors` cast to `dtype`, and where each one lies in it."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    entries: list[Entry] = []
    offset = 0
    for name, t in tensors:
        entries.append((name, tuple(t.shape), offset))
        offset += t.numel() * itemsize
    flat = torch.empty(offset, dtype=torch.uint8)
    for (_, shape, start), (_, t) in zip(entries, tensors):
        n = t.numel() * itemsize
        flat[start : start + n].view(dtype).view(shape).copy_(t.detach())  # casts and copies off the device
    return flat, entries


def unpack(buffer: np.ndarray | torch.Tensor, dtype: str, entries: list[Entry]) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a packed bucket, as views of `buffer` (no copy). A buffer from Ray's object store is
    read-only; its tensors are only read (vLLM's loaders copy them into the model's parameters)."""
    if isinstance(buffer, np.ndarray):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            buffer = torch.from_numpy(buffer)
    dt = getattr(torch, dtype)
    itemsize = torch.empty((), dtype=dt).element_size()
    out = []
    for name, shape, start in entries:
        n = int(np.prod(shape, dtype=np.int64)) * itemsize
        out.append((name, buffer[start : start + n].view(dt).view(shape)))
    return out
