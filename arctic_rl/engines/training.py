"""The training engine: one Ray actor per data-parallel rank, DeepSpeed ZeRO underneath.

The controller splits each batch into micro-batches that never split a prompt group, deals them
round-robin to ranks and pads every rank's list to the same length with `None` (a 1-token dummy
pass): ZeRO-3 gathers parameters collectively, so every rank must run the same number of passes.

Gradient accumulation is ours, not DeepSpeed's: forward_backward may be called any number of
times before optimizer_step. Every backward runs with the accumulation boundary off; the step
first runs one zero-loss dummy backward with the boundary on, which makes ZeRO-1/2/3 reduce what
was accumulated (checked equal to one backward over the summed loss for all three stages).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from arctic_rl import router_replay
from arctic_rl.batch import Batch
from arctic_rl.config import ArcticRLClientConfig, sampler_dtype
from arctic_rl.engines.build_lock import await_build_lock
from arctic_rl.engines.cpu_share import apply_cpu_share, cpu_now
from arctic_rl.engines.forward import response_log_probs
from arctic_rl.engines.lora import apply_lora, policy_weights, trainable_parameters
from arctic_rl.engines.memory import MemoryMark, freed_memory_returned
from arctic_rl.engines.model import accelerator, import_model_code, load_hf_model
from arctic_rl.engines.offload import EngineSleeper, sleep_info, state_digest
from arctic_rl.engines.safe_load import load_tensors_only
from arctic_rl.engines.startup import reports_start_failure
from arctic_rl.engines.weight_buckets import Entry, bucket_bytes, checkpoint_layout, pack, plan_buckets, unpack
from arctic_rl.errors import ArcticRLError, EngineDeadError, EngineError
from arctic_rl.losses import load_loss_modules, resolve_loss_fn, resolve_post_processor

MicroBatch = Batch | None


def _awake(method):
    """Refuses the op while the worker is asleep: its state is in host memory (the controller checks first;
    this catches a caller that reaches the worker another way)."""

    @functools.wraps(method)
    def op(self, *args, **kwargs):
        if self.sleeper is not None:
            raise EngineError(f"{_engine_name(self.trainable, self.rank)} is asleep: wake it before {method.__name__}")
        return method(self, *args, **kwargs)

    return op


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _lr_lambda(sched, total_default: int = 0):
    def f(step: int) -> float:
        if sched.warmup_steps and step < sched.warmup_steps:
            return (step + 1) / sched.warmup_steps
        total = sched.total_steps or total_default
        if sched.type == "constant" or not total:
            return 1.0
        t = min(1.0, (step - sched.warmup_steps) / max(1, total - sched.warmup_steps))
        decay = 1.0 - t if sched.type == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
        return sched.min_lr_ratio + (1.0 - sched.min_lr_ratio) * decay

    return f


def weights_only_loads(engine) -> None:
    """Make `engine` (a DeepSpeedEngine) load checkpoint files with torch.load(weights_only=True).

    DeepSpeed's TorchCheckpointEngine unpickles with weights_only=False, and unpickling an arbitrary
    object runs code: a crafted file under the checkpoint root would run in the trainer. Every file
    DeepSpeed's load_checkpoint reads goes through `engine.checkpoint_engine.load` (model states via
    its SDLoader, optimizer and ZeRO states directly), so that one method is replaced by
    arctic_rl.engines.safe_load.load_tensors_only (which `arctic-rl export` reads with too).
    """
    if engine.checkpoint_engine is None:  # a ZeRO-3 engine without an optimizer (the reference) loads no checkpoint
        return
    engine.checkpoint_engine.load = lambda path, map_location=None: load_tensors_only(path, map_location)


class LogProbModel(torch.nn.Module):
    """The HF model behind a forward that returns per-token log-probs. DeepSpeed wraps *this*, so every
    pass goes through DeepSpeedEngine.forward, which ZeRO-3 needs to hook the backward."""

    def __init__(
        self,
        model: torch.nn.Module,
        zorro: bool,
        chunk_tokens: int,
        sync_chunk_count: bool = False,
        prefix_tree: bool = False,
        replay_prompts: str | None = None,
    ):
        super().__init__()
        self.model, self.zorro, self.chunk_tokens = model, zorro, chunk_tokens
        self.sync_chunk_count = sync_chunk_count  # see arctic_rl.logprob_head.head_post_process
        self.zorro_kw = {"prefix_tree": True} if zorro and prefix_tree else {}
        self.replay_prompts = replay_prompts  # router replay on: "replay" or "route" (its prompt tokens); None: off

    def forward(self, mb: Batch, pp_config: dict, post_processor="log_probs") -> dict[str, torch.Tensor]:
        routed = router_replay.for_forward(mb, self.replay_prompts) if self.replay_prompts else None
        return response_log_probs(
            self.model,
            {k: v for k, v in mb.items() if k != "routed_experts"},
            zorro=self.zorro,
            pp_config=pp_config,
            chunk_tokens=self.chunk_tokens,
            post_processor=post_processor,
            sync_chunk_count=self.sync_chunk_count,
            routed_experts=routed,
            **self.zorro_kw,
        )


def _engine_name(trainable: bool, rank: int) -> str:
    return f"{'training' if trainable else 'reference'} engine rank {rank}"


class TrainingWorker:
    """One DeepSpeed rank. `trainable=False` makes a forward-only worker (the reference model)."""

    @reports_start_failure(lambda self, config_json, rank, world_size, trainable=True: _engine_name(trainable, rank))
    def __init__(self, config_json: str, rank: int, world_size: int, trainable: bool = True):
        # First: torch's threads start on its first parallel region, with the cores and count given here.
        self.cpu = apply_cpu_share() if accelerator() == "cpu" else None
        self.cfg = ArcticRLClientConfig.from_json(config_json)
        self.rank, self.world_size, self.trainable = rank, world_size, trainable
        self.engine: Any = None  # the DeepSpeed engine, made in setup()
        self.load_peak: int | None = None  # the weights' load's peak bytes (above RSS when it started)
        self.module: Any = None
        self.sleeper: EngineSleeper | None = None  # set while asleep
        self.lora = False  # LoRA adapters on this worker's model (training_config.lora; never the reference)
        self.memory: MemoryMark | None = None  # the RSS baseline, marked in setup before the weights load
        load_loss_modules(self.cfg.server.loss_modules)  # the names requests may use, as in the controller

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0 only: this node's IP and a port free on it. Ranks may sit on other nodes, so the
        address every rank joins must be rank 0's, not the controller's or 127.0.0.1."""
        import ray

        return ray.util.get_node_ip_address(), _free_port()

    @reports_start_failure(lambda self, *_: _engine_name(self.trainable, self.rank))
    def setup(self, master_addr: str, master_port: int) -> None:
        """Join the group at rank 0's address and build the DeepSpeed engine (all ranks at once)."""
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0" if accelerator() == "cpu" else os.environ.get("LOCAL_RANK", "0"),
        )
        self._setup()

    def _setup(self) -> None:
        import deepspeed

        tc = self.cfg.training_config
        torch.manual_seed(self.cfg.seed)
        if accelerator() == "cpu":
            await_build_lock("deepspeed_shm_comm")  # init_distributed loads it; a dead build's lock would hang it
        deepspeed.init_distributed(dist_backend="nccl" if accelerator() == "cuda" else "gloo")
        bf16 = tc.dtype == "bfloat16"
        partitioned = tc.zero_stage == 3 and self.world_size > 1
        self.memory = MemoryMark()  # libraries imported, process group up: what follows is the engine's state
        ds_config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": tc.zero_stage if self.trainable else min(tc.zero_stage, 3)},
            "bf16": {"enabled": bf16},
            "gradient_clipping": tc.grad_clip,
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        # Weights load in fp32; DeepSpeed's bf16 mode casts the module and keeps fp32 master weights. Under ZeRO-3
        # over several ranks each rank builds and loads only its partitions (engines/zero3_load.py), in DeepSpeed's
        # compute dtype, its fp32 master partitions made from them.
        if partitioned:
            import arctic_rl.engines.zero3_load  # noqa: F401
        import_model_code(self.cfg.model_name)
        load_mark = MemoryMark()  # the weights' load alone, its code imported (VmHWM restarts at VmRSS: no peak lost)
        hf = load_hf_model(
            self.cfg.model_name,
            self.cfg.model_overrides,
            torch.bfloat16 if partitioned and bf16 else torch.float32,
            gradient_checkpointing=tc.gradient_checkpointing and self.trainable,
            offload_activations=tc.offload_activations,
            zero3_config=ds_config if partitioned else None,
        )
        self.load_peak = load_mark.report()["peak_extra"]  # the load's peak, before DeepSpeed
        # Router replay (R3): the trainer's MoE routers take the sampler's expert choices (arctic_rl/router_replay.py).
        # MoE routers are hooked for the auxiliary load-balancing loss too (logged; in the loss with its coef).
        replay = tc.router_replay.enable and self.trainable
        if self.trainable:
            router_replay.install(hf, replay=replay)
        # The reference is the base model: it never gets adapters (it is deployed from the same weights).
        lora = tc.lora if self.trainable else None
        self.lora = lora is not None
        if lora is not None:
            apply_lora(hf, lora)  # in place: `hf` now holds the adapters, and only they require grad
        # ZeRO-3 over several ranks gathers the LM head's weight collectively on every head call: the ranks
        # must make the same number of chunked head calls.
        sync_chunk_count = tc.zero_stage == 3 and self.world_size > 1
        zorro = tc.zorro_train
        model = LogProbModel(
            hf,
            zorro.enable,
            tc.chunk_tokens,
            sync_chunk_count,
            zorro.prefix_tree,
            replay_prompts=tc.router_replay.prompt_tokens if replay else None,
        )
        if not self.trainable:
            model.requires_grad_(False)
            model.eval()
            if tc.zero_stage < 3:
                # A frozen model needs no optimizer: plain module, bf16 cast by hand.
                self.module = model.to(torch.bfloat16 if bf16 else torch.float32).to(accelerator())
                return
            ds_config["zero_optimization"]["stage"] = 3
            self.engine, *_ = deepspeed.initialize(model=model, config=ds_config)
            weights_only_loads(self.engine)
            self.module = self.engine.module
            return
        oc = tc.optimizer
        # torch's AdamW, fused into one multi-tensor kernel on CUDA. DeepSpeed's FusedAdam / CPU Adam
        # would JIT-compile an op on every fresh node (nvcc or g++, about a minute) and fail where the
        # node's nvcc does not match torch's CUDA.
        opt = torch.optim.AdamW(
            trainable_parameters(model),
            lr=oc.lr,
            betas=oc.betas,
            eps=oc.eps,
            weight_decay=oc.weight_decay,
            fused=accelerator() == "cuda",
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(tc.lr_scheduler))
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=opt, lr_scheduler=sched, config=ds_config
        )
        weights_only_loads(self.engine)
        self.module = self.engine.module
        self._pending_backward = False

    # -- ops -------------------------------------------------------------------------------------------
    def ping(self) -> dict:
        import ray

        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "trainable": self.trainable,
            "asleep": self.sleeper is not None,
            "sleep": sleep_info(accelerator()),
            # load_peak_extra: the weights' load alone (before DeepSpeed), above the mark
            "memory": {**self.memory.report(), "load_peak_extra": self.load_peak} if self.memory is not None else None,
            "host": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cpu": cpu_now() if self.cpu is not None else None,
        }

    def vocab_size(self) -> int:
        """Rows of the input embedding: token ids a batch may hold are below this."""
        return int(self.module.model.get_input_embeddings().num_embeddings)

    def _to_device(self, mb: Batch) -> Batch:
        dev = self.engine.device if self.engine is not None else accelerator()
        return {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in mb.items()}

    def _forward(self, mb: Batch, pp_config: dict, post_processor: str = "log_probs") -> dict[str, torch.Tensor]:
        pp = resolve_post_processor(post_processor, self.cfg.server.allow_imports)
        return (self.engine if self.engine is not None else self.module)(mb, pp_config, pp)

    def _dummy_forward(self) -> torch.Tensor:
        """A zero-valued pass through the same code path as a real micro-batch (1 prompt + 1 response
        token), so ZeRO-3's collective parameter gathers line up across ranks."""
        dev = self.engine.device if self.engine is not None else accelerator()
        ids = torch.zeros(1, 2, dtype=torch.long, device=dev)
        mb = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "responses": ids[:, 1:], "uid": [0]}
        return self._forward(mb, {})["log_probs"].sum() * 0.0

    def _add_aux_loss(self, loss: torch.Tensor, mb: Batch, loss_config: dict, metrics: dict) -> torch.Tensor:
        """An MoE model's auxiliary load-balancing loss of this micro-batch (router_replay.aux_loss): logged as
        router/aux_loss; with training_config.router_aux_loss_coef > 0 added to the loss, weighted by the
        micro-batch's share of the batch's response tokens (the losses are normalised over the whole batch)."""
        aux = router_replay.aux_loss(self.module.model)
        if aux is None:
            return loss
        metrics["router/aux_loss"] = float(aux.detach())
        coef = self.cfg.training_config.router_aux_loss_coef
        if coef <= 0:
            return loss
        share = float(mb["response_mask"].sum()) / max(float(loss_config.get("global_num_tokens", 1.0)), 1.0)
        return loss + coef * share * aux

    def _replay_metrics(self) -> dict[str, float]:
        """Router replay on: of the (token, MoE layer) pairs the last forward replayed, the share where the trainer's
        own router would have chosen the same experts (the routing disagreement R3 removes), and their count."""
        state = getattr(self.module.model, "_arctic_router_replay", None)
        if state is None or not state.replay:
            return {}
        agreement = state.agree / state.replayed if state.replayed else float("nan")
        return {"router_replay/agreement": agreement, "router_replay/replayed": float(state.replayed)}

    @_awake
    @torch.no_grad()
    def log_probs(
        self, micro_batches: list[MicroBatch], pp_config: dict, post_processor: str = "log_probs"
    ) -> list[dict[str, torch.Tensor] | None]:
        self.module.eval()
        out: list[dict[str, torch.Tensor] | None] = []
        for mb in micro_batches:
            if mb is None:
                self._dummy_forward()
                out.append(None)
            else:
                out.append(
                    {
                        k: v.float().cpu()
                        for k, v in self._forward(self._to_device(mb), pp_config, post_processor).items()
                    }
                )
        return out

    @_awake
    def forward_backward(
        self, micro_batches: list[MicroBatch], loss_fn: str, loss_config: dict, post_processor: str = "log_probs"
    ) -> list[dict]:
        """One metrics dict per real micro-batch (the controller reduces them over all ranks)."""
        assert self.trainable, "forward_backward on a frozen worker"
        fn = resolve_loss_fn(loss_fn, self.cfg.server.allow_imports)
        self.module.train()
        pp_config = {
            "temperature": loss_config.get("temperature", 1.0),
            "compute_entropy": bool(loss_config.get("compute_entropy", True)),
        }
        per_mb: list[dict] = []
        self.engine.set_gradient_accumulation_boundary(False)
        routers = getattr(self.module.model, "_arctic_router_replay", None)
        for mb in micro_batches:
            if mb is None:
                loss = self._dummy_forward()
            else:
                mb = self._to_device(mb)
                if routers is not None:
                    routers.collect = True
                loss, metrics = fn(self._forward(mb, pp_config, post_processor), mb, loss_config)
                metrics = {**{k: float(v) for k, v in metrics.items()}, "loss": float(loss.detach())}
                loss = self._add_aux_loss(loss, mb, loss_config, metrics)
                per_mb.append({**metrics, **self._replay_metrics()})
            # DeepSpeed averages gradients over ranks; our losses are normalized over the global
            # batch already, so undo the average to get the sum.
            self.engine.backward(loss * self.world_size)
            if routers is not None:
                routers.collect, routers.collected = False, []
        self._pending_backward = True
        return per_mb

    @_awake
    def optimizer_step(self, optim_params: dict | None = None) -> dict[str, float]:
        # Set on the param groups before the step: DeepSpeed's step runs the optimizer, then the scheduler
        # (which recomputes lr from its base for the next step; a caller that sets lr sets it every step).
        params = {k: tuple(v) if k == "betas" else v for k, v in (optim_params or {}).items() if v is not None}
        for group in self.optimizer.param_groups:
            group.update(params)
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.backward(self._dummy_forward())
        self.engine.step()
        self._pending_backward = False
        if self.cfg.colocate and accelerator() == "cuda":
            # The activations' blocks stay reserved in torch's caching allocator after the backward; the
            # sampler that shares this GPU wakes for the weight sync next and needs them.
            torch.cuda.empty_cache()
        norm = self.engine.get_global_grad_norm()
        norm = float(norm) if norm is not None else float("nan")
        # With a caller's lr, the lr this step used; else the scheduler's (as before optim_params existed).
        lr = params.get("lr", self.scheduler.get_last_lr()[0])
        return {"grad_norm": norm, "lr": float(lr)}

    @_awake
    def zero_grad(self) -> None:
        self.engine.zero_grad()
        self._pending_backward = False

    # -- sleep / wake (arctic_rl/engines/offload.py) -------------------------------------------------------
    def sleep(self) -> dict[str, Any]:
        """Moves this rank's parameters, gradients and optimizer state to host memory and releases the
        device cache, or (CPU) leaves them in place: EngineSleeper.sleep's dict. Ops are refused till wake."""
        if self.sleeper is not None:
            return {"moved_bytes": 0, "freed_bytes": 0, "seconds": 0.0, **sleep_info(accelerator())}
        sleeper = EngineSleeper(self.engine, self.module, self.cfg.training_config.zero_stage, accelerator())
        out = sleeper.sleep()
        self.sleeper = sleeper
        return out

    def wake(self) -> dict[str, Any]:
        """Brings the state back, bit-identical: {"moved_bytes", "no_op", "seconds"}."""
        if self.sleeper is None:
            return {"moved_bytes": 0, "seconds": 0.0, **sleep_info(accelerator())}
        out = self.sleeper.wake()
        self.sleeper = None
        return out

    @_awake
    def state_digest(self) -> dict[str, str]:
        """sha256 of every parameter (this rank's partition), gradient and optimizer-state tensor (checks)."""
        return state_digest(self.module, getattr(self.engine, "optimizer", None))

    # -- weights ----------------------------------------------------------------------------------------
    @_awake
    def full_state_and_norms(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, float] | None]:
        sd = self.full_state_dict()
        if sd is None:
            return None, None
        return sd, {k: float(v.double().pow(2).sum()) for k, v in sd.items()}

    @_awake
    def full_state_dict(self, dtype: str | None = None) -> dict[str, torch.Tensor] | None:
        """Full (gathered) parameters on rank 0, in `dtype` (default: the training dtype); None elsewhere.
        All ranks must call it (ZeRO-3 gathers collectively)."""
        import deepspeed

        out: dict[str, torch.Tensor] = {}
        to = getattr(torch, dtype) if dtype else None
        for name, (p, value) in policy_weights(self.module.model).items():
            if self.cfg.training_config.zero_stage == 3 and self.engine is not None:
                with deepspeed.zero.GatheredParameters([p]):
                    t = value().to(to or p.dtype).cpu().clone() if self.rank == 0 else None
            else:
                t = value().to(to or p.dtype).cpu().clone() if self.rank == 0 else None
            if t is not None:
                out[name] = t
        return out if self.rank == 0 else None

    # -- streaming weight sync: buckets of whole vLLM modules, gathered, sent and loaded one at a time ---------
    def _zero3(self) -> bool:
        return self.cfg.training_config.zero_stage == 3 and self.engine is not None

    def _gathered_buckets(self, itemsize: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The policy's weights (merged, under the base model's names, with LoRA: engines.lora.policy_weights) in
        buckets of at most vllm_config.sync_bucket_mb and 1/32 of the model (weight_buckets.bucket_bytes; counted at
        `itemsize` bytes per element), each gathered while it is being read. Under ZeRO-3 every rank must iterate to the end: the gathers are collectives."""
        import deepspeed

        weights = policy_weights(self.module.model)
        zero3 = self._zero3()
        numel = (lambda p: p.ds_numel) if zero3 else (lambda p: p.numel())  # ZeRO-3: the full size, not the partition
        sizes = [(n, numel(p) * itemsize) for n, (p, _) in weights.items()]
        limit = bucket_bytes(self.cfg.vllm_config.sync_bucket_mb, sum(n for _, n in sizes))
        for names in plan_buckets(sizes, limit):
            group = [weights[n][0] for n in names]
            with deepspeed.zero.GatheredParameters(group) if zero3 else contextlib.nullcontext():
                yield [(n, weights[n][1]()) for n in names]

    @_awake
    def stream_weights(self, samplers: list, load: bool = True, check: bool = True) -> dict | None:
        """Every rank calls it; rank 0 sends each bucket, in the sampler's dtype, to every sampler's
        `load_bucket` (load it, and/or compare the parameters it covers). Returns, on rank 0, each replica's
        comparison summed over buckets ({"checked", "unchecked", "stale"}) and timings; None elsewhere."""
        dtype = getattr(torch, sampler_dtype(self.cfg))

        def send(ref, entries: list[Entry]) -> list:
            return [s.load_bucket.remote(ref, str(dtype).split(".")[-1], entries, load, check) for s in samplers]

        # vLLM loads the checkpoint's names and layout: a model that transformers keeps in another layout (an MoE
        # layer's experts stacked into one tensor) is sent as its checkpoint has it (checkpoint_layout).
        return self._stream(dtype, send, "sampling", as_checkpoint=True)

    @_awake
    def stream_to_reference(self, reference: list) -> dict | None:
        """Every rank calls it; rank 0 sends each bucket, in the training dtype, to the reference workers'
        `load_weight_bucket` (reference := current policy). A ZeRO-3 reference gathers each bucket on all its
        ranks and takes the values from its rank 0, so only that one receives the data."""
        dtype = next(iter(policy_weights(self.module.model).values()))[0].dtype
        shards = self.cfg.training_config.zero_stage == 3

        def send(ref, entries: list[Entry]) -> list:
            name = str(dtype).split(".")[-1]
            return [
                r.load_weight_bucket.remote(ref if i == 0 or not shards else None, name, entries)
                for i, r in enumerate(reference)
            ]

        return self._stream(dtype, send, "reference")

    def _stream(
        self, dtype: torch.dtype, send: Callable[[Any, list[Entry]], list], engine: str, as_checkpoint: bool = False
    ) -> dict | None:
        with freed_memory_returned():
            return self._stream_buckets(dtype, send, engine, as_checkpoint)

    def _stream_buckets(
        self, dtype: torch.dtype, send: Callable[[Any, list[Entry]], list], engine: str, as_checkpoint: bool
    ) -> dict | None:
        import ray

        if self.rank != 0 and not self._zero3():
            return None  # ZeRO-1/2 ranks hold the full parameters: rank 0 alone sends
        itemsize = torch.empty((), dtype=dtype).element_size()
        inflight: deque[list] = deque()
        replies: list[list[dict]] = []
        error: ArcticRLError | None = None
        gather_s = wait_s = 0.0
        buckets = 0
        t = time.perf_counter()
        for bucket in self._gathered_buckets(itemsize):
            if self.rank != 0:
                continue  # took part in the gather
            if as_checkpoint:
                bucket = checkpoint_layout(self.module.model, bucket)
            flat, entries = pack(bucket, dtype)
            del bucket
            gather_s += time.perf_counter() - t
            if error is None:  # after a failure, keep iterating: the other ranks are in the same gathers
                ref = ray.put(flat.numpy())
                del flat
                inflight.append(send(ref, entries))
                del ref  # the receivers' tasks hold it until they finish
                buckets += 1
                # At most two buckets in flight: the next one is gathered while the receivers load this one.
                if len(inflight) >= 2:
                    t = time.perf_counter()
                    error = _collect(inflight.popleft(), replies, engine) or error
                    wait_s += time.perf_counter() - t
            t = time.perf_counter()
        if self.rank != 0:
            return None
        t = time.perf_counter()
        while inflight:
            error = _collect(inflight.popleft(), replies, engine) or error
        wait_s += time.perf_counter() - t
        if error is not None:
            raise error
        return {"replicas": _sum_replies(replies), "buckets": buckets, "gather_s": gather_s, "wait_s": wait_s}

    @_awake
    @torch.no_grad()
    def load_weight_bucket(self, buffer, dtype: str, entries: list[Entry]) -> None:
        """Frozen workers only: replace the bucket's parameters (reference := current policy). Under ZeRO-3
        every rank is called with the same entries; rank 0 gets the data and the gather hands it to the
        other ranks' partitions on exit."""
        import deepspeed

        params = dict(self.module.model.named_parameters())
        unknown = [name for name, _, _ in entries if name not in params]
        if unknown:
            raise ValueError(f"reference update: unexpected parameter names {unknown[:4]}")
        group = [params[name] for name, _, _ in entries]
        zero3 = self._zero3()
        with deepspeed.zero.GatheredParameters(group, modifier_rank=0) if zero3 else contextlib.nullcontext():
            if buffer is not None:
                for name, t in unpack(buffer, dtype, entries):
                    params[name].data.copy_(t)

    def transfer_connect(self, samplers: list, master_port: int, num_sampler_workers: int) -> None:
        """CUDA only: join vLLM's weight-transfer engine, NCCL or IPC (rank 0 is the sender and binds
        `master_port`, a port from its own `rendezvous`)."""
        import ray

        from arctic_rl.engines.weight_sync import open_trainer_engine

        self._wt = open_trainer_engine(
            self.cfg.vllm_config.weight_sync,
            self.module.model,
            self.cfg.training_config.zero_stage,
            self.rank,
            samplers,
            ray.util.get_node_ip_address(),
            master_port,
            num_sampler_workers,
            self.cfg.vllm_config.sync_bucket_mb,
        )

    def transfer_send(self) -> None:
        self._wt.send_weights()

    @_awake
    def save_checkpoint(self, path: str) -> str:
        t0 = time.time()
        # With LoRA the frozen base weights stay out: the checkpoint holds the adapters and their optimizer state
        # (the base model is the run's model_name, which export and load read).
        self.engine.save_checkpoint(
            path,
            tag="arctic-rl",
            client_state={"pending_backward": self._pending_backward},
            exclude_frozen_parameters=self.lora,
        )
        return f"rank {self.rank} saved in {time.time() - t0:.1f}s"

    @_awake
    def load_checkpoint(self, path: str) -> None:
        load_path, _ = self.engine.load_checkpoint(
            path,
            tag="arctic-rl",
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
            load_module_strict=not self.lora,  # a LoRA checkpoint holds the adapters only
        )
        if load_path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {path!r} (tag 'arctic-rl')")
        # DeepSpeed restores weights and optimizer but keeps the gradients accumulated since the last step: the
        # next step would apply a backward taken on the weights that were replaced. The engine's zero_grad only
        # drops param.grad; ZeRO's own also drops what it accumulates (grad_accum; ZeRO-3's partitions).
        self.engine.optimizer.zero_grad(set_to_none=True)
        self._pending_backward = False


def _collect(refs: list, replies: list[list[dict]], engine: str) -> ArcticRLError | None:
    """Waits for one bucket's receivers and keeps their answers; a failure comes back as the error to raise
    once the gathers are over."""
    import ray

    try:
        replies.append(ray.get(refs))
        return None
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, ArcticRLError):
            return type(e.cause)(str(e.cause))
        return EngineError(f"{engine} engine failed while loading a weight bucket: {str(e.cause or e).splitlines()[0]}")
    except ray.exceptions.RayActorError as e:
        return EngineDeadError(f"{engine} engine worker died during weight sync: {str(e).splitlines()[0]}")


def _sum_replies(replies: list[list[dict]]) -> list[dict]:
    """Per receiver, its bucket comparisons added up; counting stops at the first stale tensor, so
    "checked" still says how many matched before it."""
    if not replies or replies[0][0] is None:
        return []
    total = [{"checked": 0, "unchecked": 0, "stale": None, "load_s": 0.0} for _ in replies[0]]
    for per_bucket in replies:
        for acc, r in zip(total, per_bucket):
            acc["load_s"] += r["load_s"]
            if acc["stale"] is None:
                acc["checked"] += r["checked"]
                acc["unchecked"] += r["unchecked"]
                acc["stale"] = r["stale"]
    return total
