"""Sleep and wake for the training and reference engines: their device state to host memory and back.

What goes where:
  ZeRO-1/2 trainer   DeepSpeed's `engine.offload_states` / `reload_states` (fp32 master partitions, bf16
                     params, gradients, the optimizer's state), pinned host buffers on CUDA; its gradient
                     reduce buckets, which that leaves on the device, through `HostStash`.
  ZeRO-3 trainer     DeepSpeed's for the bf16 partitions, gradients and reduce buckets; its ZeRO-3 path moves
                     the fp32 master partitions and Adam state only for DeepSpeed's FusedAdam (it asserts),
                     and the trainer runs torch's AdamW, so those two go through `HostStash` below.
  ZeRO-0 trainer, the plain-module reference (ZeRO-0/1/2), the ZeRO-3 reference (no optimizer):
                     DeepSpeed's offload_states asserts a ZeRO optimizer, so `HostStash` moves all of it.

`HostStash` works on storages, not tensors: each distinct device storage the engine's module and optimizer
reach is copied to a pinned host buffer and resized to 0 bytes (freed); wake resizes it back and copies
the bytes in. Every tensor viewing a storage (parameters as views of a flat buffer, ZeRO partitions) keeps
pointing at it, so nothing has to be re-linked and the bytes come back bit-identical.

Sleep is a no-op where it would free nothing (`no_op_reason`): on CPU the device is the host, so a copy
"to the host" only adds a second copy of the state (the process grew by it while asleep), and weights
loaded from safetensors sit in memory-mapped storages that cannot be resized anyway. There the same plan
is made (what would move, `state_bytes`) and nothing is copied or touched; the worker stays marked asleep,
so the controller refuses its ops until wake exactly as on CUDA, and health() says sleep is a no-op and why.
"""

from __future__ import annotations

import gc
import hashlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

CPU_NO_OP = (
    "sleep is a no-op on cpu: the device is the host, so moving the state to host memory would free nothing "
    "and only add a copy of it; the state stays where it is (on CUDA sleep frees the device)"
)


FREES = "sleep frees the device: parameters, gradients and optimizer state go to pinned host memory until wake"


def no_op_reason(device_type: str) -> str | None:
    """Why sleep would free nothing on `device_type` ("cpu", "cuda"), or None where it frees device memory."""
    return CPU_NO_OP if device_type == "cpu" else None


def sleep_info(device_type: str) -> dict[str, Any]:
    """What sleep does on this worker's device, for health(): {"no_op": bool, "why": str}."""
    why = no_op_reason(device_type)
    return {"no_op": why is not None, "why": why or FREES}


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
        """Host copies of every (device) storage, then each is freed. Returns the bytes moved."""
        moved = 0
        for t in self.storages:
            view = _storage_view(t)
            host = torch.empty(view.numel(), dtype=torch.uint8, pin_memory=True)
            host.copy_(view)
            self.host.append(host)
            moved += host.numel()
            t.untyped_storage().resize_(0)
        return moved

    def restore(self) -> int:
        """The bytes back into every storage (reallocated on CUDA); returns the bytes moved."""
        moved = 0
        for t, host in zip(self.storages, self.host):
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
    and wakes it, choosing per the module docstring what DeepSpeed moves and what HostStash moves. On a
    device where that frees nothing (`no_op_reason`) the same plan is made and nothing moves."""

    def __init__(self, engine: Any, module: torch.nn.Module, zero_stage: int, device_type: str):
        self.engine, self.module, self.zero_stage = engine, module, zero_stage
        self.no_op = no_op_reason(device_type)
        self.stash: HostStash | None = None
        self.ds_bytes = 0  # what DeepSpeed's offload_states moves (0: it moves nothing here)

    def _has_zero_optimizer(self) -> bool:
        from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload

        return (
            self.engine is not None
            and self.zero_stage > 0
            and not isinstance(self.engine.optimizer, DeepSpeedZeRoOffload)
        )

    def _plan(self) -> None:
        """What sleep moves: `ds_bytes` through DeepSpeed, the rest in `stash`. Reads the engine only."""
        if self._has_zero_optimizer():
            opt = self.engine.optimizer
            self.ds_bytes = HostStash(self._deepspeed_tensors()).nbytes
            if self.zero_stage == 3:
                # torch AdamW under ZeRO-3: DeepSpeed moves only FusedAdam's fp32 master and state (see above)
                self.stash = HostStash([*opt.fp32_partitioned_groups_flat, *optimizer_tensors(opt.optimizer)])
            else:
                # ZeRO-1/2's reduce buckets (reduce_bucket_size elements each, 2 GB in fp32), which its offload
                # leaves on the device
                self.stash = HostStash(b for bucket in opt.ipg_buckets.values() for b in bucket.buffer)
        else:
            optimizer = self.engine.optimizer if self.engine is not None else None
            self.stash = HostStash([*module_tensors(self.module), *optimizer_tensors(optimizer)])

    def state_bytes(self) -> int:
        return self.ds_bytes + (self.stash.nbytes if self.stash is not None else 0)

    def sleep(self) -> dict[str, Any]:
        """{"moved_bytes", "freed_bytes" (device memory given back), "state_bytes" (what sleep moves on a
        device where it frees: what stays in place where it is a no-op), "no_op", "why" (with no_op), "seconds"}."""
        t0, before = time.perf_counter(), device_allocated()
        if self.no_op is not None:
            self._plan()
            out: dict[str, Any] = {"moved_bytes": 0, "freed_bytes": 0, "state_bytes": self.state_bytes()}
            return {**out, "no_op": True, "why": self.no_op, "seconds": time.perf_counter() - t0}
        if self.engine is not None and self.zero_stage == 3 and not self._has_zero_optimizer():
            self.engine.empty_partition_cache()  # gathered (persistent) parameters back to partitions
        self._plan()
        planned, moved = self.state_bytes(), 0  # counted before the move: a stashed storage has 0 bytes
        if self._has_zero_optimizer():
            self.engine.offload_states(include=self._deepspeed_states(), pin_memory=True)
            moved += self.ds_bytes
        if self.stash is not None:
            moved += self.stash.stash()
        release_cache()
        return {
            "moved_bytes": moved,
            "freed_bytes": max(0, before - device_allocated()),
            "state_bytes": planned,
            "no_op": False,
            "seconds": time.perf_counter() - t0,
        }

    def wake(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        if self.no_op is not None:
            return {"moved_bytes": 0, "no_op": True, "why": self.no_op, "seconds": time.perf_counter() - t0}
        moved = 0
        if self.stash is not None:
            moved += self.stash.restore()
            self.stash = None
        if self._has_zero_optimizer():
            self.engine.reload_states()
            moved += self.ds_bytes
        torch.cuda.synchronize()
        return {"moved_bytes": moved, "no_op": False, "seconds": time.perf_counter() - t0}

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
