"""Bucketed weight sync over CUDA IPC between two processes on one GPU (the colocated "ipc" path's mechanism):
a sender holding a small Llama-shaped model's bf16 tensors on cuda:0 packs them bucket by bucket
(arctic_rl.engines.weight_buckets.plan_buckets: whole vLLM modules, at most --bucket-kib each) into a CUDA
buffer shared by IPC handle; a receiver process with differently initialised tensors opens each handle, unpacks
the bucket in place (weight_buckets.unpack), copies it into its own tensors and acknowledges before the next
bucket. At the end every received tensor must equal the sender's bit for bit.

    python tests/gpu/ipc_sync.py [--bucket-kib 1024]     # needs CUDA torch only; exit status 0 = identical

tests/gpu/test_weight_sync_ipc.py runs it (scripts/gpu_check.sh); it skips without CUDA.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from arctic_rl.engines.weight_buckets import plan_buckets, unpack  # noqa: E402

DTYPE = torch.bfloat16


def model_tensors(seed: int, hidden: int = 256, layers: int = 4, vocab: int = 512) -> dict[str, torch.Tensor]:
    """A Llama's parameter names and shapes (fused q/k/v and gate/up pieces included), random, on cuda:0."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"self_attn.{name}.weight"] = (hidden, hidden)
        for name in ("gate_proj", "up_proj"):
            shapes[p + f"mlp.{name}.weight"] = (2 * hidden, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, 2 * hidden)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return {n: torch.randn(s, generator=g, device="cuda").to(DTYPE) for n, s in shapes.items()}


def receive(buckets: mp.Queue, acks: mp.Queue) -> None:
    """The receiver process: loads each bucket from its IPC-shared buffer, then returns its tensors."""
    own = model_tensors(seed=1)
    while (msg := buckets.get()) is not None:
        flat, dtype, entries = msg  # flat: the sender's CUDA buffer, opened through its IPC handle
        with torch.no_grad():
            for name, t in unpack(flat, dtype, entries):
                own[name].copy_(t)
        torch.cuda.synchronize()
        del flat
        acks.put(len(entries))
    acks.put({n: t.cpu() for n, t in own.items()})


def send(tensors: dict[str, torch.Tensor], bucket_bytes: int, buckets: mp.Queue, acks: mp.Queue) -> int:
    plan = plan_buckets([(n, t.numel() * t.element_size()) for n, t in tensors.items()], bucket_bytes)
    for names in plan:
        entries, offset = [], 0
        for n in names:
            entries.append((n, tuple(tensors[n].shape), offset))
            offset += tensors[n].numel() * tensors[n].element_size()
        flat = torch.empty(offset, dtype=torch.uint8, device="cuda")
        for n, shape, start in entries:
            size = tensors[n].numel() * tensors[n].element_size()
            flat[start : start + size].view(DTYPE).view(shape).copy_(tensors[n])
        torch.cuda.synchronize()
        buckets.put((flat, "bfloat16", entries))
        assert acks.get(timeout=60) == len(entries)  # the buffer must outlive the receiver's reads
        del flat
    buckets.put(None)
    return len(plan)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bucket-kib", type=int, default=1024)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("ipc_sync: skipped, no CUDA device")
        return 0
    ctx = mp.get_context("spawn")
    buckets, acks = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=receive, args=(buckets, acks))
    receiver.start()
    tensors = model_tensors(seed=0)
    n_buckets = send(tensors, a.bucket_kib << 10, buckets, acks)
    got = acks.get(timeout=120)
    receiver.join(timeout=60)
    differ = [n for n, t in tensors.items() if not torch.equal(got[n], t.cpu())]
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    print(
        f"ipc_sync: {len(tensors)} tensors ({size / 2**20:.1f} MiB bf16) in {n_buckets} buckets of <= "
        f"{a.bucket_kib} KiB over CUDA IPC; {len(tensors) - len(differ)} identical, {len(differ)} differ "
        f"{differ[:3]}"
    )
    return 0 if not differ and n_buckets > 1 and receiver.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
