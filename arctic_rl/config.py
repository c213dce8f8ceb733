"""ArcticRLClientConfig: the one config object, validated at construction.

On a machine without GPUs the engines run on CPU and every `*_gpus` count is the number of worker
processes of that engine (DeepSpeed data-parallel ranks, vLLM replicas, log-prob workers).
"""

from __future__ import annotations

import json
import os
import uuid
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from arctic_rl.errors import ConfigError
from arctic_rl.strict import Strict, explain

STATE_DIR_ENV = "ARCTIC_RL_STATE_DIR"
TOKEN_ENV = "ARCTIC_RL_TOKEN"  # how the bearer token travels between processes (never argv, never a file we write)


# The default vllm_config.max_seq_len is the model's window up to this: a 1M-token window would make vLLM
# reserve KV cache for one sequence of that length.
MAX_DEFAULT_SEQ_LEN = 32768
# A hub name whose config is not on disk: the window is unknown, and this was the default before.
UNKNOWN_WINDOW_SEQ_LEN = 4096


def state_dir() -> Path:
    """Where running deployments record how to reach them (for reconnect_config)."""
    return Path(os.environ.get(STATE_DIR_ENV, Path.home() / ".cache" / "arctic-rl" / "deployments"))


LOOPBACK = ("127.0.0.1", "localhost", "::1")
# True while from_json builds a config: serialized configs never hold the token (see auth_token).
_FROM_JSON: ContextVar[bool] = ContextVar("arctic_rl_config_from_json", default=False)


class OptimizerConfig(Strict):
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)


class SchedulerConfig(Strict):
    type: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    total_steps: int = Field(0, ge=0, description="steps of the decay (linear/cosine); 0 = no decay")
    min_lr_ratio: float = Field(0.0, ge=0, le=1)


class ZorroTrainConfig(Strict):
    enable: bool = False
    prefix_tree: bool = Field(
        False,
        description="share every prefix the rows of a group have in common (a multi-turn group's first turns), "
        "not only the prompt: arctic_rl/zorro/tree.py; needs enable",
    )

    @model_validator(mode="after")
    def _tree_needs_zorro(self) -> ZorroTrainConfig:
        if self.prefix_tree and not self.enable:
            raise ValueError("zorro_train.prefix_tree=true needs zorro_train.enable=true")
        return self


class RouterReplayConfig(Strict):
    """Rollout router replay (R3) for mixture-of-experts models: the sampler records the experts it routed each
    token to, and the trainer routes each token to those (arctic_rl/router_replay.py)."""

    enable: bool = False
    prompt_tokens: Literal["replay", "route"] = Field(
        "replay",
        description="replay: the prompt's tokens take the sampler's routing too (verl's R3); route: the trainer's "
        "router routes them and only the response tokens are replayed",
    )


class LoraConfig(Strict):
    """LoRA adapters (PEFT) on the trainer's model: only the adapters train; the base weights stay frozen."""

    rank: int = Field(..., gt=0, description="the adapters' rank r")
    # None means 2*rank (scale alpha/rank = 2 at every rank), not PEFT's fixed default of 8, with which the
    # update's scale would shrink as the rank grows.
    alpha: float | None = Field(None, gt=0, description="scale numerator (scale = alpha/rank); default 2*rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="names (or name suffixes) of the linear modules that get adapters; 'all-linear': every "
        "linear layer but the LM head",
    )

    @field_validator("target_modules")
    @classmethod
    def _some_modules(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list) and (not v or any(not name for name in v)):
            raise ValueError(f"target_modules={v!r}: name at least one module, no empty names (or 'all-linear')")
        return v

    @model_validator(mode="after")
    def _default_alpha(self):
        if self.alpha is None:
            # Set through __dict__: assigning self.alpha would re-run this validator (validate_assignment).
            self.__dict__["alpha"] = float(2 * self.rank)
        return self

    @property
    def scale(self) -> float:
        return float(self.alpha or 2 * self.rank) / self.rank


class TrainingConfig(Strict):
    zero_stage: Literal[0, 1, 2, 3] = 1
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    optimizer: OptimizerConfig = OptimizerConfig()
    lr_scheduler: SchedulerConfig = SchedulerConfig()
    grad_clip: float = Field(1.0, ge=0, description="max global grad norm; 0 disables clipping")
    gradient_checkpointing: bool = False
    offload_activations: bool = Field(
        False,
        description="with gradient_checkpointing: hold each layer's checkpointed input in pinned host memory "
        "instead of on the device (transformers' offload; costs a copy each way per layer)",
    )
    micro_batch_size: int = Field(8, ge=1, description="rows per forward pass (prompt groups are never split)")
    chunk_tokens: int = Field(1024, ge=1, description="tokens per LM-head/log-softmax chunk")
    zorro_train: ZorroTrainConfig = ZorroTrainConfig()
    lora: LoraConfig | None = Field(None, description="None: full-parameter training; else LoRA adapters only")
    router_replay: RouterReplayConfig = RouterReplayConfig()
    router_aux_loss_coef: float = Field(
        0.0,
        ge=0,
        description="MoE models: the auxiliary load-balancing loss (transformers' load_balancing_loss_func) is "
        "logged every step as router/aux_loss; > 0 also adds it to the loss with this weight (HF's name)",
    )

    @model_validator(mode="after")
    def _lora_below_zero3(self):
        # Not built: the merged weights of a LoRA layer would need its base weight and both adapters gathered
        # together; the adapters are small, so ZeRO-2 already partitions what LoRA trains.
        if self.lora is not None and self.zero_stage == 3:
            raise ValueError(
                "training_config.lora with training_config.zero_stage=3 is not supported: "
                "use zero_stage 0, 1 or 2 (the frozen base weights are not in the optimizer either way)"
            )
        return self

    @model_validator(mode="after")
    def _offload_needs_checkpointing(self):
        if self.offload_activations and not self.gradient_checkpointing:
            raise ValueError(
                "training_config.offload_activations=True offloads the inputs gradient checkpointing keeps: "
                "set training_config.gradient_checkpointing=True too"
            )
        return self


class VLLMConfig(Strict):
    max_seq_len: int | None = Field(
        None,
        ge=16,
        description="None: the model's window (max_position_embeddings "
        "after model_overrides), at most MAX_DEFAULT_SEQ_LEN",
    )
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    enforce_eager: bool = True
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="'auto': training_config.dtype (the sampler samples the policy being trained)"
    )
    max_num_seqs: int = Field(256, ge=1)
    enable_prefix_caching: bool = True
    weight_sync: Literal["reload", "nccl", "ipc"] = Field(
        "reload",
        description="'reload': buckets of the gathered weights -> vLLM reload_weights (any device); "
        "'nccl': trainer rank 0 broadcasts into the vLLM workers (CUDA, split placement); "
        "'ipc': CUDA IPC handles read in place (CUDA, colocated)",
    )
    sync_bucket_mb: int = Field(
        256,
        ge=1,
        description="weight sync streams the trainer's parameters in buckets of at most this many MiB (in the "
        "sampler's dtype), gathered, sent and loaded one bucket at a time, so no process holds the whole model; "
        "a single vLLM module larger than this is a bucket of its own",
    )
    cpu_kvcache_space_gb: float = Field(1.0, gt=0, description="CPU only: KV cache size (VLLM_CPU_KVCACHE_SPACE)")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to vllm.LLM as is")


class ZorroInferenceConfig(Strict):
    enable: bool = False
    min_group_size: int = Field(2, ge=2)
    min_prefix_len: int = Field(256, ge=1)


class ArcticInferenceConfig(Strict):
    use_fca: bool = False  # upstream's name for the same switch as zorro_inference.enable
    zorro_inference: ZorroInferenceConfig = ZorroInferenceConfig()

    @model_validator(mode="after")
    def _alias(self):
        if self.use_fca and not self.zorro_inference.enable:
            self.zorro_inference = self.zorro_inference.model_copy(update={"enable": True})
        return self


JOB_DIR_ENV = "ARCTIC_RL_JOB_DIR"  # set by jobs/ for every process of a job


class ServerConfig(Strict):
    """What requests may do on the server (see README, "Security model"). Fixed when the deployment
    starts: a client that attaches to a running deployment cannot change it."""

    loss_modules: list[str] = Field(
        default_factory=list,
        description=(
            "modules the server imports at start (controller and training workers); the losses and post-"
            "processors they register with @register_loss_fn / @register_post_processor can be named in requests"
        ),
    )
    openai: bool = Field(
        False,
        description="HTTP deployments: also answer OpenAI's /v1/chat/completions from the sampler and record each "
        "conversation's exact tokens for training (arctic_rl/server/openai_api.py; `arctic-rl serve --openai`)",
    )
    # The OpenAI front's state, which callers grow, and its threads (arctic_rl/server/openai_api.py).
    # Records are the callers' to grow (20 refused requests once left 27 MB): bounded by what they hold, not count.
    openai_max_record_tokens: int = Field(
        1 << 24,
        ge=1,
        description="tokens held by all recorded OpenAI conversations (about 25 bytes each); past it the least "
        "recently used records are dropped",
    )
    # A request queued behind its conversation's running one would hold a thread for as long as that one runs.
    openai_conversation_wait_s: float = Field(
        5.0,
        ge=0,
        allow_inf_nan=False,
        description="how long an OpenAI request waits for the running request of its conversation; then a 503",
    )
    # Each completion blocks a thread for its whole generate: on a pool of their own, not the server's shared one.
    openai_max_concurrent: int = Field(
        32,
        ge=1,
        description="OpenAI chat completions run at once, each on a thread of its own pool for its whole generate "
        "(more wait for one), so they never hold the threads the other routes need",
    )
    allow_imports: bool = Field(
        False,
        description=(
            "requests may name a loss or post-processor by dotted path ('pkg.mod:fn'), which imports any module "
            "the server can import: anyone who may call the server can run code on it. `arctic-rl serve "
            "--allow-imports` sets it"
        ),
    )
    checkpoint_root: str | None = Field(
        None,
        description=(
            "save_checkpoint / load_checkpoint take paths under this folder only (relative paths are taken under "
            "it). None: $ARCTIC_RL_JOB_DIR, else ./runs of the process that starts the deployment"
        ),
    )
    max_n: int = Field(256, ge=1, description="largest sampling_params['n'] a generate request may ask for")
    max_tokens: int | None = Field(
        None, ge=1, description=("largest sampling_params['max_tokens']; None: vllm_config.max_seq_len")
    )
    max_batch_rows: int = Field(
        16384,
        ge=1,
        description=("most rows in one request: batch rows, generate's prompts x n, sampler_log_probs' sequences"),
    )
    max_body_bytes: int = Field(1 << 30, ge=1024, description="largest HTTP request body")
    # 64 concurrent requests of max_body_bytes each would hold 64 GiB: bodies held at once are bounded too.
    max_inflight_body_bytes: int | None = Field(
        None,
        ge=1024,
        description="bytes of request bodies held at once by all requests in flight (counted from their "
        "content-length, else as they arrive); one more is a 503. None: 2 x max_body_bytes",
    )
    # One generate's work: every sample is a sequence the sampler decodes (and a copy of its prompt it answers).
    max_request_tokens: int = Field(
        1 << 26,
        ge=1,
        description="output budget of one generate request: prompts x n x max_tokens (vLLM's 16 when unset)",
    )
    # vLLM checks every stop string against every new token of every sequence: 100k of them cost 40 ms a token.
    max_stops: int = Field(
        64, ge=1, description="most entries of a generate request's sampling_params 'stop' (and of 'stop_token_ids')"
    )
    max_stop_chars: int = Field(256, ge=1, description="longest string in sampling_params 'stop', in characters")
    max_prompt_chars: int | None = Field(
        None,
        ge=1,
        description=(
            "longest string prompt of a generate request, in characters, checked before it is tokenized; "
            "None: 16 x vllm_config.max_seq_len (the controller then counts its tokens against max_seq_len)"
        ),
    )
    max_batch_tokens: int = Field(
        1 << 24,
        ge=1,
        description=(
            "most cells (rows x columns, padding included) of a batch the Tinker front builds from one "
            "forward_backward request, checked before anything is allocated"
        ),
    )
    # The Tinker front's (arctic-rl serve --tinker) state, which clients grow: bounded by count, bytes and age.
    tinker_session_ttl_s: float = Field(
        300.0, gt=0, description="a Tinker session without a heartbeat this long ends (the SDK sends one every 10 s)"
    )
    tinker_max_sessions: int = Field(1024, ge=1, description="most open Tinker sessions; more are refused (429)")
    tinker_max_pending: int = Field(
        1024, ge=1, description="most Tinker requests queued or running; more are refused (429), none is evicted"
    )
    tinker_max_result_bytes: int = Field(
        1 << 30, ge=1, description="finished Tinker results kept for retrieval, in bytes; the oldest go first"
    )
    tinker_result_ttl_s: float = Field(
        900.0, gt=0, description="a finished Tinker result is kept this long for retrieve_future"
    )
    max_json_bytes: int = Field(
        64 << 20,
        ge=1024,
        description="largest JSON part of a /v1 request (its tensors aside): parsing it holds the server's event "
        "loop, about 1 s per 30 MB",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description=(
            "host names an HTTP request's Host (and a browser's Origin) may name besides the bound address (and, on "
            "loopback, localhost); any other is refused (DNS rebinding). Bound to 0.0.0.0 / :: with none listed, "
            "every Host is taken (the bearer token guards such a server)"
        ),
    )
    max_concurrent_requests: int = Field(
        64, ge=1, description="HTTP requests in flight at once (/healthz aside); one more is answered 503"
    )
    # uvicorn closes a kept-alive connection after an answer, but never one that has not sent a (whole) request head.
    http_head_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="an HTTP connection that has not sent a whole request head this long after it opened (or "
        "after its last answer) is closed",
    )
    # Every open connection holds a socket and its buffers, with or without a request.
    max_connections: int = Field(
        1024, ge=1, description="open HTTP connections at once; one more is answered 503 and closed"
    )
    # httptools (uvicorn's default parser) has no limit of its own on a request head.
    max_head_bytes: int = Field(
        64 << 10, ge=1024, description="largest HTTP request head (request line and headers); more is a 413, closed"
    )
    result_cache_entries: int = Field(
        1024, ge=1, description="answers of requests with an id kept so a retry gets the answer, not a second run"
    )
    result_cache_bytes: int = Field(256 << 20, ge=0, description="bytes of such answers kept (oldest go first)")
    result_cache_age_s: float = Field(600.0, gt=0, description="seconds such an answer is kept for a retry")

    @model_validator(mode="after")
    def _body_budget_holds_a_body(self):
        if self.max_inflight_body_bytes is not None and self.max_inflight_body_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_inflight_body_bytes={self.max_inflight_body_bytes} is below max_body_bytes="
                f"{self.max_body_bytes}: a body the server takes could never be read; raise it or lower max_body_bytes"
            )
        return self

    @property
    def inflight_body_bytes(self) -> int:
        """max_inflight_body_bytes, its default filled in."""
        return self.max_inflight_body_bytes or 2 * self.max_body_bytes

    def resolved(self) -> ServerConfig:
        """checkpoint_root as an absolute path, its default filled in (run where the deployment starts)."""
        root = self.checkpoint_root or os.environ.get(JOB_DIR_ENV) or str(Path.cwd() / "runs")
        return self.model_copy(update={"checkpoint_root": str(Path(root).expanduser().resolve())})


class CpuConfig(Strict):
    """CPU deployments only (a Ray cluster without GPUs): the cores each engine computes on. Ray starts an actor
    that asks for no CPUs with OMP_NUM_THREADS=1, so without this a trainer on an 8-core node computes on one
    core while the other seven idle. Placement (arctic_rl.server.placement.cpu_shares) turns this into each
    engine's thread count and, when split, its cores."""

    threads: int | None = Field(
        None,
        ge=1,
        description="compute threads per engine; None: every core of the engine's set, or OMP_NUM_THREADS of "
        "the process that starts the deployment, if it has one",
    )
    split: bool = Field(
        False,
        description="disjoint cores: the sampler on the first sampler_cores of its node's cores, the trainer and "
        "reference on the rest (async: sampler and trainer compute at once); False: every engine may use every "
        "core (sync: the engines take turns)",
    )
    sampler_cores: int | None = Field(
        None, ge=1, description="with split: the sampler's cores on each node; None: half of them (at least 1)"
    )
    nodes: int | None = Field(
        None,
        ge=1,
        description="the Ray nodes the engines are dealt over: placement waits until that many nodes with CPUs "
        "are alive, and refuses to start on fewer; None: ARCTIC_RL_NODES where the deployment starts (a job "
        "launcher sets it), else the nodes alive at start",
    )

    def resolved(self) -> CpuConfig:
        """threads from OMP_NUM_THREADS and nodes from ARCTIC_RL_NODES where the deployment starts, when unset
        here (run there)."""
        update: dict[str, int] = {}
        for field, env_name in (("threads", "OMP_NUM_THREADS"), ("nodes", "ARCTIC_RL_NODES")):
            env = os.environ.get(env_name, "")
            if getattr(self, field) is None and env.isdigit() and int(env) >= 1:
                update[field] = int(env)
        return self.model_copy(update=update) if update else self


class ArcticRLClientConfig(Strict):
    model_name: str = Field(..., min_length=1, description="HF model folder (or hub name, only if you ask for one)")
    comm_protocol: Literal["ray", "http"] = "ray"
    training_gpus: int = Field(1, ge=1)
    sampling_gpus: int = Field(1, ge=1)
    reference_gpus: int = Field(0, ge=0, description="0 = the reference model shares the trainer's devices")
    use_reference: bool = Field(
        True,
        description="deploy the reference model (a frozen copy of the initial policy, for KL terms); False: "
        "none is deployed, and log_probs(reference=True) and update_reference are refused",
    )
    colocate: bool = True
    training_config: TrainingConfig = TrainingConfig()
    vllm_config: VLLMConfig = VLLMConfig()
    arctic_inference_config: ArcticInferenceConfig = ArcticInferenceConfig()
    # Applied to the HF config in trainer, log-prob engine and sampler alike (e.g. YaRN rope scaling),
    # so the three never disagree on the model's math.
    model_overrides: dict[str, Any] = Field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = Field(7000, ge=1, le=65535)
    # Never serialized (to_json / model_dump leave it out) nor shown by repr: configs travel in command
    # lines, Ray actor arguments, deployment records, checkpoints and MLflow params. The token travels
    # by the ARCTIC_RL_TOKEN environment variable (or `arctic-rl serve --token-file`).
    auth_token: str | None = Field(
        default_factory=lambda: os.environ.get(TOKEN_ENV) or None,
        exclude=True,
        repr=False,
        description="bearer token (default: $ARCTIC_RL_TOKEN); required when host is not loopback",
    )
    ray_address: str | None = Field(None, description="None: RAY_ADDRESS env, else a local Ray")
    seed: int = 0
    job_id: str | None = Field(None, description="set to re-attach to running engines")
    server_python: str | None = Field(
        None,
        description="the interpreter that runs `python -m arctic_rl.server` "
        "(an environment with DeepSpeed and vLLM); None = this one. A framework in "
        "its own environment (SkyRL: Python 3.12, Ray 2.51) uses http with this",
    )
    request_timeout_s: float = Field(3600.0, gt=0)
    server: ServerConfig = ServerConfig()
    cpu: CpuConfig = CpuConfig()

    @field_validator("model_name")
    @classmethod
    def _model_exists(cls, v: str) -> str:
        looks_local = v.startswith((".", "/", "~")) or os.sep in v and not v.count("/") == 1
        if looks_local and not Path(v).expanduser().exists():
            raise ValueError(f"model folder {v!r} does not exist")
        return v

    @model_validator(mode="after")
    def _check(self):
        if self.server_python is not None:
            if self.comm_protocol != "http":
                raise ValueError(
                    f"server_python={self.server_python!r} needs comm_protocol='http' (a Ray driver "
                    f"must run the cluster's own Python and Ray versions)"
                )
            if not os.access(Path(self.server_python).expanduser(), os.X_OK):
                raise ValueError(f"server_python={self.server_python!r} is not an executable file")
        # A config read back from JSON never holds the token (it is not serialized); the server checks
        # the token it was given when it starts (arctic_rl.server.http.main).
        if self.host not in LOOPBACK and not self.auth_token and self.comm_protocol == "http" and not _FROM_JSON.get():
            raise ValueError(f"host={self.host!r} is not loopback: set auth_token to require a bearer token")
        if self.vllm_config.weight_sync == "ipc" and not self.colocate:
            raise ValueError(
                "vllm_config.weight_sync='ipc' shares GPU memory in place: it needs colocate=True "
                "(use 'nccl' for split placement)"
            )
        if self.reference_gpus and not self.use_reference:
            raise ValueError(
                f"reference_gpus={self.reference_gpus} but use_reference=False: no reference model is deployed"
            )
        tp = self.vllm_config.tensor_parallel_size
        if self.sampling_gpus % tp:
            raise ValueError(
                f"sampling_gpus={self.sampling_gpus} is not a multiple of vllm_config.tensor_parallel_size={tp}"
            )
        self._fit_max_seq_len()
        return self

    def _fit_max_seq_len(self) -> None:
        """Defaults vllm_config.max_seq_len to the model's window and refuses a longer one here, since vLLM
        refuses it only inside a sampler worker whose error does not reach the user."""
        window = model_window(self.model_name, self.model_overrides)
        vc = self.vllm_config
        if vc.max_seq_len is None:
            # Set on the nested model: assigning self.vllm_config would re-run this validator.
            vc.max_seq_len = UNKNOWN_WINDOW_SEQ_LEN if window is None else min(window, MAX_DEFAULT_SEQ_LEN)
        elif window is not None and vc.max_seq_len > window:
            raise ValueError(
                f"vllm_config.max_seq_len={vc.max_seq_len} is longer than the model's window "
                f"(max_position_embeddings={window} in {self.model_name}/config.json"
                f"{' after model_overrides' if self.model_overrides else ''}): lower it or widen "
                f"the window with model_overrides (e.g. YaRN rope scaling)"
            )

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError("invalid ArcticRLClientConfig: " + explain(e, type(self))) from None

    @property
    def num_sampling_replicas(self) -> int:
        return self.sampling_gpus // self.vllm_config.tensor_parallel_size

    @property
    def gpu_count(self) -> int:
        """The GPUs the deployment occupies, as arctic_rl/server/placement.py lays them out: colocated engines
        share one pool of max(training, sampling) GPUs, split ones a pool each; a reference with GPUs of its
        own adds its pool. The `gpus` tag `arctic-rl compare` matches setups by."""
        pooled = (
            max(self.training_gpus, self.sampling_gpus) if self.colocate else self.training_gpus + self.sampling_gpus
        )
        return pooled + self.reference_gpus

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, s: str) -> ArcticRLClientConfig:
        """A config from to_json's output (which holds no auth_token)."""
        token = _FROM_JSON.set(True)
        try:
            return cls(**json.loads(s))
        finally:
            _FROM_JSON.reset(token)

    @classmethod
    def reconnect_config(cls, job_id: str | None = None) -> ArcticRLClientConfig:
        """Rebuild the config of a running deployment from what it recorded (the latest one, or
        `job_id`), for a driver that restarted without the old config object."""
        d = state_dir()
        path = d / f"{job_id}.json" if job_id else d / "latest.json"
        if not path.exists():
            raise ConfigError(
                f"no running arctic-rl deployment recorded at {path}"
                + ("" if job_id else " (start one with create_arctic_rl_client first)")
            )
        return cls.from_json(path.read_text())

    def with_new_job_id(self) -> ArcticRLClientConfig:
        return self.model_copy(update={"job_id": uuid.uuid4().hex[:12]})


def _local_hf_config(model_name: str) -> dict | None:
    """The model's config.json if it is on disk (a folder, or a hub name already in the HF cache); never
    downloads."""
    path = Path(model_name).expanduser() / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_name, "config.json")
        except Exception:  # not a valid repo id, or no huggingface_hub in this environment
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    return json.loads(path.read_text())


def _hf_config_value(model_name: str, overrides: dict[str, Any], key: str) -> Any:
    """`key` of the model's HF config after `overrides` (or of its text config, for a multimodal model); None
    when the config is not on disk or names no such key."""
    hf = _local_hf_config(model_name)
    if hf is None:
        return None
    hf = {**hf, **overrides}
    text_config = hf.get("text_config")
    text = text_config if isinstance(text_config, dict) else {}
    return hf.get(key, text.get(key))


def model_window(model_name: str, overrides: dict[str, Any]) -> int | None:
    """max_position_embeddings of the model's HF config after `overrides`, or None when unknown."""
    window = _hf_config_value(model_name, overrides, "max_position_embeddings")
    return int(window) if isinstance(window, (int, float)) and window > 0 else None


def model_vocab_size(model_name: str, overrides: dict[str, Any]) -> int | None:
    """vocab_size of the model's HF config after `overrides`: the token ids a request may carry are below it.
    None when unknown."""
    vocab = _hf_config_value(model_name, overrides, "vocab_size")
    return int(vocab) if isinstance(vocab, int) and vocab > 0 else None


def native_dtype() -> Literal["bfloat16", "float32"]:
    """The training dtype `model.dtype: auto` picks: bfloat16 on CUDA and on a CPU that oneDNN runs bfloat16
    kernels on (AVX-512 BF16, AMX), float32 on any other CPU. Without those instructions (an AVX2-only AMD EPYC
    seen) torch emulates each bfloat16 GEMM through float32 conversions, and the bundled demo's evals and steps
    ran several times slower than in float32."""
    import torch

    if torch.cuda.is_available() or torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "bfloat16"
    return "float32"


def sampler_dtype(cfg: ArcticRLClientConfig) -> str:
    """vllm_config.dtype, where "auto" is the training dtype: a sampler in another dtype than the trainer
    samples from another policy than the one trained (vLLM's own "auto" is the checkpoint's dtype)."""
    return cfg.training_config.dtype if cfg.vllm_config.dtype == "auto" else cfg.vllm_config.dtype


def record_deployment(cfg: ArcticRLClientConfig) -> None:
    """Writes <state_dir>/<job_id>.json and latest.json atomically (reconnect_config reads them).
    Owner-only (folder 0700, files 0600), and without the token (to_json leaves it out): a
    reconnecting HTTP client takes it from ARCTIC_RL_TOKEN."""
    d = state_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in (f"{cfg.job_id}.json", "latest.json"):
        tmp = d / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # a stale temp file keeps its old mode through O_CREAT
        with os.fdopen(fd, "w") as f:
            f.write(cfg.to_json())
        tmp.replace(d / name)


def forget_deployment(job_id: str) -> None:
    d = state_dir()
    (d / f"{job_id}.json").unlink(missing_ok=True)
    latest = d / "latest.json"
    if latest.exists() and json.loads(latest.read_text()).get("job_id") == job_id:
        latest.unlink(missing_ok=True)
