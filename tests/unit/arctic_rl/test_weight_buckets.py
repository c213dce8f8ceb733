"""Bucket planning for streaming weight sync: a bucket never splits a vLLM module (fused q/k/v and gate/up
pieces, weight and bias), stays under its size unless one module alone is larger, and a packed bucket
unpacks to exactly the tensors put in, in the sampler's dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arctic_rl.engines.weight_buckets import bucket_bytes, pack, plan_buckets, unpack, vllm_module
from arctic_rl.errors import ConfigError


def _layer(i: int) -> list[tuple[str, int]]:
    p = f"model.layers.{i}."
    return [
        (p + "input_layernorm.weight", 1),
        (p + "self_attn.q_proj.weight", 4),
        (p + "self_attn.q_proj.bias", 1),
        (p + "self_attn.k_proj.weight", 2),
        (p + "self_attn.v_proj.weight", 2),
        (p + "self_attn.o_proj.weight", 4),
        (p + "mlp.gate_proj.weight", 8),
        (p + "mlp.up_proj.weight", 8),
        (p + "mlp.down_proj.weight", 8),
    ]


SIZES = [("model.embed_tokens.weight", 20)] + _layer(0) + _layer(1) + [("lm_head.weight", 20)]


def test_fused_pieces_map_to_one_vllm_module():
    assert vllm_module("model.layers.3.self_attn.k_proj.weight") == "model.layers.3.self_attn.qkv_proj"
    assert vllm_module("model.layers.3.self_attn.q_proj.bias") == "model.layers.3.self_attn.qkv_proj"
    assert vllm_module("model.layers.3.mlp.up_proj.weight") == "model.layers.3.mlp.gate_up_proj"
    assert vllm_module("model.layers.3.mlp.down_proj.weight") == "model.layers.3.mlp.down_proj"


@pytest.mark.parametrize("bucket_bytes", [1, 5, 10, 16, 17, 40, 1000])
def test_buckets_keep_modules_whole_and_under_the_size(bucket_bytes):
    buckets = plan_buckets(SIZES, bucket_bytes)
    size = dict(SIZES)
    assert [n for b in buckets for n in b] == [n for n, _ in SIZES]  # every parameter once, in order
    home = {n: i for i, b in enumerate(buckets) for n in b}
    for name, _ in SIZES:
        same_module = [m for m, _ in SIZES if vllm_module(m) == vllm_module(name)]
        assert {home[m] for m in same_module} == {home[name]}, name
    for b in buckets:
        modules = {vllm_module(n) for n in b}
        assert sum(size[n] for n in b) <= bucket_bytes or len(modules) == 1, b


def test_small_buckets_split_the_model_and_one_large_bucket_holds_it_all():
    assert len(plan_buckets(SIZES, 1000)) == 1
    assert len(plan_buckets(SIZES, 16)) > 5
    with pytest.raises(ConfigError, match="at least 1 byte, got 0"):
        plan_buckets(SIZES, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_bucket_unpacks_to_the_same_tensors_in_the_sampler_dtype(dtype):
    g = torch.Generator().manual_seed(0)
    tensors = [("a.weight", torch.randn(3, 5, generator=g)), ("b.bias", torch.randn(7, generator=g))]
    tensors.append(("c.weight", torch.randn(2, 2, generator=g)[:, 1]))  # not contiguous
    flat, entries = pack(tensors, dtype)
    assert flat.dtype == torch.uint8 and flat.numel() == sum(t.numel() for _, t in tensors) * dtype.itemsize
    array = flat.numpy()
    array.flags.writeable = False  # as Ray's object store hands it over
    name = str(dtype).split(".")[-1]
    for (n, got), (m, want) in zip(unpack(array, name, entries), tensors):
        assert n == m and got.dtype == dtype
        assert torch.equal(got, want.to(dtype))
    assert isinstance(array, np.ndarray)


def test_a_bucket_is_at_most_a_sixteenth_of_the_model_and_not_under_8_mib():
    assert bucket_bytes(256, 323 << 20) == (323 << 20) // 32  # a small model: many buckets, not two
    assert bucket_bytes(256, 64 << 30) == 256 << 20  # a large one: the configured size
    assert bucket_bytes(256, 2 << 20) == 8 << 20  # a tiny one: one bucket
