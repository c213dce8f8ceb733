"""CUDA weight sync through vLLM's own weight-transfer API (`vllm.distributed.weight_transfer`), no host copy:
  "nccl": trainer rank 0 broadcasts into every vLLM worker (split placement: engines on different GPUs);
  "ipc":  CUDA IPC handles of the trainer's tensors, read in place by vLLM workers on the same GPU (colocated).

Both stream in buckets: vLLM's packed mode, with a buffer of vllm_config.sync_bucket_mb (raised to the largest
single parameter, which the IPC producer cannot split), so the trainer never holds a second copy of the model
on the device; vLLM's `start_weight_update`/`finish_weight_update` session loads layer by layer across chunks.
Used when `vllm_config.weight_sync` is "nccl" or "ipc" on GPUs. The CPU path (and the CUDA default) streams
buckets to vLLM's `reload_weights` instead (TrainingWorker.stream_weights, SamplingWorker.load_bucket).
Not run on this project's CPU machines (no GPU): written against vLLM 0.32's API and kept to the
calls its own trainer engine makes (trainer_init -> send_weights).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import ray
import torch

from arctic_rl.engines.lora import policy_weights


class SamplerGroupClient:
    """vLLM's `VLLMWeightSyncClient` protocol over our sampling actors (each fans out to its TP workers)."""

    def __init__(self, samplers: list):
        self.samplers = samplers

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        # Each replica's workers sit after the trainer's rank 0 and the previous replicas' workers.
        refs, offset = [], 1
        for s in self.samplers:
            tp = ray.get(s.tensor_parallel_size.remote())
            refs.append(s.wt_init.remote({**init_info, "rank_offset": offset}))
            offset += tp
        ray.get(refs)

    def start_weight_update(self) -> None:
        ray.get([s.wt_call.remote("start_weight_update") for s in self.samplers])

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        # vLLM's protocol allows a list of updates (one per bucket); each goes to every replica in order.
        for info in update_info if isinstance(update_info, list) else [update_info]:
            ray.get([s.wt_call.remote("update_weights", {"update_info": info}) for s in self.samplers])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        ray.get([s.wt_call.remote("finish_weight_update") for s in self.samplers])


def zero_source(module: torch.nn.Module, zero_stage: int):
    """A vLLM `WeightSource` over a DeepSpeed module (the policy's weights: merged under the base names with
    LoRA, see engines.lora); ZeRO-3 parameters are gathered one at a time
    (a collective: every trainer rank iterates in lockstep, which vLLM's engine does on non-senders)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class _Source(WeightSource):
        def metadata(self) -> list[ParamMeta]:
            out = []
            for name, (p, _) in policy_weights(module).items():
                shape = tuple(p.ds_shape) if hasattr(p, "ds_shape") else tuple(p.shape)
                out.append(ParamMeta(name, p.dtype, shape))
            return out

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            import deepspeed

            for name, (p, value) in policy_weights(module).items():
                if zero_stage == 3:
                    with deepspeed.zero.GatheredParameters([p]):
                        yield name, value().clone()
                else:
                    yield name, value()

    return _Source()


def packed_buffer_bytes(source, bucket_mb: int) -> int:
    """The packed transfer's buffer: `bucket_mb` MiB, or the largest single parameter if that is larger."""
    largest = max(math.prod(m.shape) * torch.empty((), dtype=m.dtype).element_size() for m in source.metadata())
    return max(bucket_mb << 20, largest)


def open_trainer_engine(
    backend: str,
    module,
    zero_stage: int,
    rank: int,
    samplers: list,
    master_address: str,
    master_port: int,
    num_sampler_workers: int,
    bucket_mb: int,
):
    """Trainer side; every trainer rank calls it (rank 0 is the sender). Packed: buckets of `bucket_mb`."""
    client, source = SamplerGroupClient(samplers), zero_source(module, zero_stage)
    buffer = packed_buffer_bytes(source, bucket_mb)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

        ipc = IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=buffer)
        return IPCTrainerWeightTransferEngine.trainer_init(ipc, client=client, source=source)
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

    info = NCCLTrainerInitInfo(
        master_address=master_address,
        master_port=master_port,
        world_size=1 + num_sampler_workers,
        rank=rank,
        packed=True,
        packed_buffer_size_bytes=buffer,
        packed_num_buffers=2,  # one bucket sending while the next is packed
    )
    return NCCLTrainerWeightTransferEngine.trainer_init(info, client=client, source=source)
