"""Sleep and wake for the training and reference engines: their device state to host memory and back.

What goes where:
  ZeRO-1/2 trainer   DeepSpeed's `engine.offload_states` / `reload_states` (fp32 master partitions, bf16
                     params, gradients, the optimizer's state), pinned host buffers on CUDA; its gradient
                     reduce buckets, which that leaves on the device, through `HostStash` (CUDA only).
  ZeRO-3 trainer     DeepSpeed's for the bf16 partitions, gradients and reduce buckets; its ZeRO-3 path moves
                     the fp32 master partitions and Adam state only for DeepSpeed's FusedAdam (it asserts),
                     and the trainer runs torch's AdamW, so those two go through `HostStash` below.
  ZeRO-0 trainer, the plain-module reference (ZeRO-0/1/2), the ZeRO-3 reference (no optimizer):
                     DeepSpeed's offload_states asserts a ZeRO optimizer, so `HostStash` moves all of it.

`HostStash` works on storages, not tensors: each distinct device storage the engine's module and optimizer
reach is copied to a host buffer and, on CUDA, resized to 0 bytes (freed); wake resizes it back and copies
the bytes in. Every tensor viewing a storage (parameters as views of a flat buffer, ZeRO partitions) keeps
pointing at it, so nothing has to be re-linked and the bytes come back bit-identical.

On CPU the device is the host: there is no memory to give away, and weights loaded from safetensors sit
in memory-mapped storages that cannot be resized anyway. Sleep still runs every step above (DeepSpeed's
offload copies into fresh host buffers; HostStash copies each storage out and, instead of freeing it,
overwrites it with 0xFF bytes, NaN in every float type, so a byte not restored by wake shows), and wake
copies everything back. The process holds as much memory asleep as awake; `freed_bytes` says 0.
"""

from __future__ import annotations

import gc
import hashlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

POISON = 0xFF  # CPU only: what a stashed storage holds until wake (NaN in fp32/bf16/fp16)


def _storage_view(t: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole storage of `t`."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class HostStash:
    """Moves the storages of `tensors` to host memory (see the module's docstring) and back."""

    def __init__(self, tensors: Iterable[torch.Tensor]):
        self.storages: list[torch.Tensor] = []  # one tensor per distinct storage, for its device and storage
        seen: set[int] = set()
        for t in tensors:
            s = t.untyped_storage()
            if s.nbytes() == 0 or s.data_ptr() in seen:
                continue
            seen.add(s.data_ptr())
            self.storages.append(t)
        self.host: list[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.storages)

    def stash(self) -> int:
        """Host copies of every storage, then each is freed (CUDA) or poisoned (CPU). Returns the bytes moved."""
        moved = 0
        for t in self.storages:
            view = _storage_view(t)
            host = torch.empty(view.numel(), dtype=torch.uint8, pin_memory=view.is_cuda)
            host.copy_(view)
            self.host.append(host)
            moved += host.numel()
            if view.is_cuda:
                t.untyped_storage().resize_(0)
            else:
                view.fill_(POISON)
        return moved

    def restore(self) -> int:
        """The bytes back into every storage (reallocated on CUDA); returns the bytes moved."""
        moved = 0
        for t, host in zip(self.storages, self.host):
            if t.device.type != "cpu":
                t.untyped_storage().resize_(host.numel())
            _storage_view(t).copy_(host)
            moved += host.numel()
        self.host = []
        return moved


def _tensors_in(obj: Any, depth: int = 2) -> Iterator[torch.Tensor]:
    """Tensors held by `obj` directly or in lists, tuples and dicts up to `depth` levels down."""
    if isinstance(obj, torch.Tensor):
        yield obj
        if obj.grad is not None:
            yield obj.grad
    elif depth > 0 and isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors_in(x, depth - 1)
    elif depth > 0 and isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors_in(x, depth - 1)


def module_tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    """Parameters (and their ZeRO-3 partitions), gradients and buffers."""
    for p in module.parameters():
        yield from _tensors_in(p)
        ds = getattr(p, "ds_tensor", None)
        if ds is not None:
            yield ds
    yield from module.buffers()


def optimizer_tensors(optimizer: Any) -> Iterator[torch.Tensor]:
    """The torch optimizer's parameters, gradients and state; for a DeepSpeed wrapper (BF16_Optimizer and
    the like) also the flat buffers it keeps as attributes, the torch optimizer being its `.optimizer`."""
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        for value in vars(optimizer).values():
            yield from _tensors_in(value)
        optimizer = inner
    if isinstance(optimizer, torch.optim.Optimizer):
        for group in optimizer.param_groups:
            yield from _tensors_in(group["params"])
        for state in optimizer.state.values():
            yield from _tensors_in(state)


def state_digest(module: torch.nn.Module, optimizer: Any) -> dict[str, str]:
    """sha256 of every parameter (or its ZeRO-3 partition), gradient, buffer and optimizer-state tensor,
    by a stable name: equal digests mean bit-identical state."""
    out: dict[str, str] = {}

    def add(name: str, t: torch.Tensor | None) -> None:
        if t is not None and t.numel():
            out[name] = hashlib.sha256(
                t.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes()
            ).hexdigest()

    for name, p in module.named_parameters():
        add(f"param/{name}", getattr(p, "ds_tensor", None) if hasattr(p, "ds_tensor") else p)
        add(f"grad/{name}", p.grad)
    for name, b in module.named_buffers():
        add(f"buffer/{name}", b)
    base = getattr(optimizer, "optimizer", optimizer)
    if isinstance(base, torch.optim.Optimizer):
        for g, group in enumerate(base.param_groups):
            for i, p in enumerate(group["params"]):
                add(f"optimizer/group{g}/param{i}", p)
                for key, v in base.state.get(p, {}).items():
                    if isinstance(v, torch.Tensor):
                        add(f"optimizer/group{g}/param{i}/{key}", v)
    return out


def device_allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def release_cache() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class EngineSleeper:
    """Puts one worker's engine (a DeepSpeedEngine, or a plain module for a ZeRO-0/1/2 reference) to sleep
    and wakes it, choosing per the module docstring what DeepSpeed moves and what HostStash moves."""

    def __init__(self, engine: Any, module: torch.nn.Module, zero_stage: int):
        self.engine, self.module, self.zero_stage = engine, module, zero_stage
        self.stash: HostStash | None = None
        self.ds_bytes = 0

    def _has_zero_optimizer(self) -> bool:
        from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload

        return (
            self.engine is not None
            and self.zero_stage > 0
            and not isinstance(self.engine.optimizer, DeepSpeedZeRoOffload)
        )

    def sleep(self) -> dict[str, float]:
        t0, before = time.perf_counter(), device_allocated()
        moved = 0
        if self._has_zero_optimizer():
            opt = self.engine.optimizer
            ds_states = self._deepspeed_states()
            self.ds_bytes = HostStash(self._deepspeed_tensors()).nbytes
            if self.zero_stage == 3:
                # torch AdamW under ZeRO-3: DeepSpeed moves only FusedAdam's fp32 master and state (see above)
                self.stash = HostStash([*opt.fp32_partitioned_groups_flat, *optimizer_tensors(opt.optimizer)])
            elif torch.cuda.is_available():
                # ZeRO-1/2's reduce buckets (reduce_bucket_size elements each, 2 GB in fp32), which its offload
                # leaves on the device. Not on CPU: there they would be copied for nothing.
                self.stash = HostStash(b for bucket in opt.ipg_buckets.values() for b in bucket.buffer)
            self.engine.offload_states(include=ds_states, pin_memory=torch.cuda.is_available())
            moved += self.ds_bytes
        else:
            if self.engine is not None and self.zero_stage == 3:
                self.engine.empty_partition_cache()  # gathered (persistent) parameters back to partitions
            optimizer = self.engine.optimizer if self.engine is not None else None
            self.stash = HostStash([*module_tensors(self.module), *optimizer_tensors(optimizer)])
        if self.stash is not None:
            moved += self.stash.stash()
        release_cache()
        return {
            "moved_bytes": moved,
            "freed_bytes": max(0, before - device_allocated()),
            "seconds": time.perf_counter() - t0,
        }

    def wake(self) -> dict[str, float]:
        t0 = time.perf_counter()
        moved = 0
        if self.stash is not None:
            moved += self.stash.restore()
            self.stash = None
        if self._has_zero_optimizer():
            self.engine.reload_states()
            moved += self.ds_bytes
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return {"moved_bytes": moved, "seconds": time.perf_counter() - t0}

    def _deepspeed_states(self) -> list:
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as S

        if self.zero_stage == 3:
            return [S.lp_params, S.lp_grads, S.contiguous_grad_buffer]
        return list(S)

    def _deepspeed_tensors(self) -> list[torch.Tensor]:
        """What DeepSpeed's offload_states is about to move, to count its bytes."""
        opt = self.engine.optimizer
        if self.zero_stage == 3:
            return [opt.lp_param_buffer, opt.grad_partitions_flat_buffer]
        return [
            *opt.single_partition_of_fp32_groups,
            *opt.bit16_groups_flat,
            *optimizer_tensors(opt.optimizer),
        ]
