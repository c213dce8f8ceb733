"""The run config of `arctic-rl run`: one YAML file, validated as a tree of pydantic models.

    cfg = load_run_config("recipes/text2sql/configs/bird_qwen3_32b.yaml", ["train.steps=10"])
    client_cfg = cfg.client_config()        # the ArcticRLClientConfig of the backend

Sections: model, backend (ArcticRLClientConfig fields except model_name), recipe, sampling, train,
loss, advantage, reference, async, filter_groups, env, overlong, checkpoint, resume, tracking, sleep_engines, seed.
Every model forbids unknown keys, so a typo is an error naming its dotted path (`train.stpes: Extra inputs are not permitted`); so do
`loss.config` (the built-in losses' models, arctic_rl.losses.config) and `recipe.options` (the recipe's
`parse_options`), checked when the file parses.

Overrides are `dotted.key=value`; the value is parsed as a YAML scalar (`train.steps=10` is an int,
`sampling.stop=[]` a list, `resume=never` a string).

Mapping to the backend, never silently: `model.dtype` becomes training_config.dtype unless the backend
section sets it (`auto`: bfloat16 where the machine computes it natively, else float32: config.native_dtype);
`train.micro_batch_size` (prompt groups per forward pass) becomes training_config.micro_batch_size = groups x
sampling.n rows; a conflicting explicit value is an error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from arctic_rl.config import ArcticRLClientConfig, native_dtype
from arctic_rl.errors import ConfigError
from arctic_rl.losses.config import parse_loss_config
from arctic_rl.strict import Strict, explain


class YarnConfig(Strict):
    factor: float = Field(..., gt=1)
    original_max_position_embeddings: int = Field(..., gt=0)


class ModelConfig(Strict):
    # "demo": the bundled SmolLM2-135M-Instruct (arctic_rl.demo_model), converted and cached on first use.
    name_or_path: str = Field(..., min_length=1)

    @property
    def path(self) -> str:
        if self.name_or_path == "demo":
            from arctic_rl.demo_model import demo_model_path

            return str(demo_model_path())
        return self.name_or_path

    # "auto": bfloat16 where this machine computes it natively, float32 elsewhere (native_dtype); resolved
    # where `arctic-rl run` runs, which for a job is its first node.
    dtype: Literal["auto", "bfloat16", "float32"] | None = None
    yarn: YarnConfig | None = None
    # Applied to the HF config in trainer, log-prob engine and sampler (ArcticRLClientConfig.model_overrides).
    overrides: dict[str, Any] = Field(default_factory=dict)


class RecipeConfig(Strict):
    name: str = Field(..., min_length=1, description="the package recipes.<name>")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="load_examples('train', **options); checked by the recipe's parse_options (its options model)",
    )


class SamplingConfig(Strict):
    n: int = Field(8, ge=1, description="responses per prompt (the GRPO group size)")
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: list[str] = Field(default_factory=list)


class TrainConfig(Strict):
    steps: int = Field(..., ge=1)
    prompts_per_step: int = Field(..., ge=1)
    ppo_epochs: int = Field(1, ge=1)
    mini_batch_size: int | None = Field(None, ge=1, description="prompts per optimizer step; None = prompts_per_step")
    micro_batch_size: int | None = Field(None, ge=1, description="prompt groups per forward pass; None = backend's")

    @model_validator(mode="after")
    def _divides(self):
        if self.mini_batch_size is not None and self.prompts_per_step % self.mini_batch_size:
            raise ValueError(
                f"mini_batch_size={self.mini_batch_size} must divide prompts_per_step={self.prompts_per_step}"
            )
        return self

    @property
    def prompts_per_mini_batch(self) -> int:
        return self.mini_batch_size or self.prompts_per_step


class LossConfig(Strict):
    name: str = "grpo"
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="the loss_config of forward_backward; checked by the loss's model for the built-in ones "
        "(arctic_rl.losses.config)",
    )


class AdvantageConfig(Strict):
    estimator: Literal["grpo", "drgrpo", "rloo"] = "grpo"
    eps: float = Field(1e-6, gt=0)


class ReferenceConfig(Strict):
    enable: bool | None = Field(None, description="None: only when the loss uses a KL term (use_kl_loss)")


class AsyncConfig(Strict):
    enable: bool = False
    max_staleness: int = Field(1, ge=1, description="policy versions between the sampler and the trainer")
    partial_rollouts: bool = Field(
        False,
        description="generate continuously in chunks: a weight sync lands between chunks and unfinished samples "
        "continue under the new weights, keeping their tokens (arctic_rl.rollout.partial); needs enable",
    )
    chunk_tokens: int = Field(16, ge=1, description="with partial_rollouts: tokens per sample per generate call")
    stale: Literal["regenerate", "drop"] = Field(
        "regenerate",
        description="with partial_rollouts: a sample older than max_staleness versions is generated again, or "
        "its group dropped",
    )

    @model_validator(mode="after")
    def _partial_needs_async(self):
        if self.partial_rollouts and not self.enable:
            raise ValueError("partial_rollouts=true needs async.enable=true (sync rollouts finish within a step)")
        return self


class EnvConfig(Strict):
    """Multi-turn episodes (arctic_rl.rollout.multiturn): the environment `name` (registered by the recipe,
    arctic_rl.envs) answers each model turn until it says done with the reward, instead of the recipe's
    single-shot reward. None: single-turn."""

    name: str | None = Field(None, min_length=1, description="a registered environment; None = single-turn")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the environment")
    max_turns: int = Field(3, ge=1, description="model turns per conversation (sampling.max_tokens each)")
    max_response_tokens: int | None = Field(
        None,
        ge=1,
        description="turns and observations of one conversation together; None: what the sampler's window "
        "(vllm_config.max_seq_len) leaves after the prompt",
    )
    observation_role: str = Field("user", min_length=1, description="the chat role observations are shown as")
    allow_unsandboxed_code: bool = Field(
        False,
        description="let an environment run the model's code without a sandbox, as this user, in the loop's "
        "process or its children (skyrl_gym ids searchcode, lcb, text2sql, and ids registered elsewhere); "
        "docs/security.md",
    )

    @model_validator(mode="after")
    def _unsandboxed_code_needs_the_flag(self):
        if self.name == "skyrl_gym" and "id" in self.options:  # refused here, before any engine starts
            from arctic_rl.envs.skyrl_gym import check_id

            check_id(self.options["id"], self.allow_unsandboxed_code, known=False)
        return self


class FilterGroupsConfig(Strict):
    """DAPO's dynamic sampling (verl: algorithm.filter_groups): groups whose rewards are all equal are dropped and
    more prompts drawn until the step has train.prompts_per_step groups with signal (arctic_rl.rollout.dynamic)."""

    enable: bool = False
    max_num_gen_batches: int = Field(
        4, ge=1, description="batches of prompts_per_step drawn at most per step, the first included"
    )


class OverlongConfig(Strict):
    """Responses cut at sampling.max_tokens (arctic_rl.rollout.dynamic)."""

    filter: bool = Field(False, description="no loss on a truncated response (SkyRL's apply_overlong_filtering)")
    buffer_len: int = Field(
        0, ge=0, description="DAPO's soft overlong punishment over the last N tokens (verl: overlong_buffer.len)"
    )
    penalty_factor: float = Field(1.0, ge=0, description="the punishment at max_tokens (verl: penalty_factor)")


class CheckpointConfig(Strict):
    dir: str | None = Field(None, description="None: runs/<recipe>/<run_name or 'run'>")
    every: int = Field(0, ge=0, description="save every N steps (and at the last step); 0 = never")


class TrackingConfig(Strict):
    experiment: str | None = Field(None, description="None: the recipe name")
    run_name: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)


class EvalConfig(Strict):
    """Greedy decoding on a held-out split before the first step and after the last (and every `every`
    steps): `eval/accuracy` = share of examples whose reward is >= 1 (execution match, exact match)."""

    split: str | None = Field(None, description="None = no eval; e.g. 'dev'")
    every: int = Field(0, ge=0, description="also every N steps (0: only before and after)")
    max_tokens: int | None = Field(None, ge=1, description="None = sampling.max_tokens")
    limit: int | None = Field(None, ge=1, description="first N examples of the split")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="recipe options for the eval split, merged over recipe.options (a key set to null is dropped)",
    )


class SFTWarmupConfig(Strict):
    """A supervised stage before GRPO: the recipe's reference completions (`recipe.sft_completion`, e.g. the
    gold SQL) trained with the `sft` loss through the same client ops and optimizer, then synced to the
    sampler. Skipped on resume (the checkpoint already holds its effect)."""

    epochs: int = Field(0, ge=0, description="passes over the warm-up examples; 0 = no warm-up")
    batch_size: int = Field(4, ge=1, description="examples per optimizer step")
    split: str = Field("train", min_length=1)
    limit: int | None = Field(None, ge=1, description="first N examples of the split")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="recipe options for the warm-up split, merged over recipe.options (a key set to null is dropped)",
    )


class RunConfig(Strict):
    model: ModelConfig
    backend: dict[str, Any] = Field(default_factory=dict, description="ArcticRLClientConfig fields but model_name")
    recipe: RecipeConfig
    sampling: SamplingConfig = SamplingConfig()
    train: TrainConfig
    loss: LossConfig = LossConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    reference: ReferenceConfig = ReferenceConfig()
    async_: AsyncConfig = Field(AsyncConfig(), alias="async")
    filter_groups: FilterGroupsConfig = FilterGroupsConfig()
    env: EnvConfig = EnvConfig()
    overlong: OverlongConfig = OverlongConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    resume: str = Field("auto", min_length=1, description="auto (latest complete checkpoint) | never | a path")
    tracking: TrackingConfig = TrackingConfig()
    eval: EvalConfig = EvalConfig()
    sft_warmup: SFTWarmupConfig = SFTWarmupConfig()
    sleep_engines: bool = Field(
        True,
        description="colocated sync runs: the sampler sleeps while the trainer works "
        "and the trainer and reference while the sampler generates (arctic_rl.loop)",
    )
    seed: int = 0

    @model_validator(mode="after")
    def _check_overlong(self):
        if self.overlong.buffer_len >= self.sampling.max_tokens:
            raise ValueError(
                f"overlong.buffer_len={self.overlong.buffer_len} must be below "
                f"sampling.max_tokens={self.sampling.max_tokens} (the punishment starts that many tokens before it)"
            )
        return self

    @model_validator(mode="after")
    def _check_env(self):
        if self.env.name is not None and self.async_.enable:
            raise ValueError(
                f"env.name={self.env.name!r} with async.enable=true: multi-turn episodes run in step (sync) for "
                f"now; set async.enable=false"
            )
        if self.env.name is not None and self.overlong.buffer_len:
            raise ValueError(
                f"env.name={self.env.name!r} with overlong.buffer_len={self.overlong.buffer_len}: the overlong "
                f"punishment measures one response against sampling.max_tokens, a conversation has several; "
                f"set overlong.buffer_len=0 (overlong.filter still drops conversations cut short)"
            )
        return self

    @model_validator(mode="after")
    def _check_backend(self):
        if "model_name" in self.backend:
            raise ValueError("backend.model_name: set model.name_or_path instead")
        self._client_config(resolve_yarn=False)  # the backend section is validated here, with its dotted names
        return self

    @model_validator(mode="after")
    def _check_loss_and_recipe(self):
        # The built-in losses' configs and the recipe's options are models too, checked now: a typo there
        # must not wait for the first training step (or the first eval, after hours of training).
        parse_loss_config(self.loss.name, self.loss.config, name="loss.config")
        parse_options = _recipe_options_parser(self.recipe.name)
        if parse_options is None:
            return self
        stages = [("recipe.options", self.recipe.options)]
        if self.eval.split:
            stages.append(("eval.options (over recipe.options)", self.stage_options(self.eval.options)))
        if self.sft_warmup.epochs:
            stages.append(("sft_warmup.options (over recipe.options)", self.stage_options(self.sft_warmup.options)))
        for where, options in stages:
            try:
                parse_options(options)
            except ValueError as e:
                msg = str(e)
                raise ValueError(msg if msg.startswith(where) else f"{where}: {msg}") from None
        return self

    def stage_options(self, overrides: dict) -> dict:
        """A stage's recipe options (eval, sft_warmup): its own over recipe.options; a key set to None is dropped."""
        return {k: v for k, v in {**self.recipe.options, **overrides}.items() if v is not None}

    @property
    def use_reference(self) -> bool:
        if self.reference.enable is not None:
            return self.reference.enable
        return bool(self.loss.config.get("use_kl_loss", False))

    @property
    def checkpoint_dir(self) -> Path:
        if self.checkpoint.dir:
            return Path(self.checkpoint.dir).expanduser()
        return Path("runs") / self.recipe.name / (self.tracking.run_name or "run")

    def client_config(self) -> ArcticRLClientConfig:
        """The backend's config: the backend section plus what the other sections imply."""
        try:
            cfg = self._client_config(resolve_yarn=True)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if cfg.server.checkpoint_root is None:
            # The server this run starts may write checkpoints under the folder that holds checkpoint.dir
            # (for jobs, checkpoint.dir=<job>/checkpoints: the job's folder), so sibling runs sharing a
            # deployment, and a resume from one of them, stay inside it.
            root = self.checkpoint_dir.expanduser().resolve().parent
            cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update={"checkpoint_root": str(root)})})
        return cfg

    def _client_config(self, resolve_yarn: bool) -> ArcticRLClientConfig:
        data = _deep_copy(self.backend)
        data["model_name"] = self.model.path if resolve_yarn else self.model.name_or_path
        overrides = dict(self.model.overrides)
        if self.model.yarn is not None and resolve_yarn:
            # One switch, the same rope dict for trainer, reference and sampler (arctic_rl.yarn). It needs
            # the model's own rope_theta, so it is resolved when the run starts, not when the YAML parses.
            from transformers import AutoConfig

            from arctic_rl.yarn import rope_theta_of, yarn_overrides

            try:
                theta = rope_theta_of(AutoConfig.from_pretrained(self.model.path))
            except (OSError, ValueError) as e:
                raise ValueError(
                    f"model.yarn: cannot read rope_theta of model.name_or_path="
                    f"{self.model.name_or_path!r}: {str(e).splitlines()[0]}"
                ) from None
            y = self.model.yarn
            overrides.update(yarn_overrides(y.factor, y.original_max_position_embeddings, rope_theta=theta).hf_config)
        elif self.model.yarn is not None:
            # Unresolved, the rope dict is missing, but the window YaRN gives is known: the sequence length
            # check of the backend section needs it.
            y = self.model.yarn
            overrides["max_position_embeddings"] = int(round(y.factor * y.original_max_position_embeddings))
        if overrides:
            if data.get("model_overrides") not in (None, {}, overrides):
                raise ValueError("model.overrides/model.yarn and backend.model_overrides disagree; set one of them")
            data["model_overrides"] = overrides
        training = data.setdefault("training_config", {})
        if not isinstance(training, dict):
            raise ValueError(f"backend.training_config must be a mapping, got {training!r}")
        dtype = native_dtype() if self.model.dtype == "auto" else self.model.dtype
        _imply(training, "dtype", dtype, "model.dtype", "backend.training_config.dtype")
        if self.train.micro_batch_size is not None:
            rows = self.train.micro_batch_size * self.sampling.n
            _imply(
                training,
                "micro_batch_size",
                rows,
                "train.micro_batch_size x sampling.n",
                "backend.training_config.micro_batch_size",
            )
        data.setdefault("seed", self.seed)
        if self.async_.enable:  # sampler and trainer compute at once: on CPU, each on its own cores
            cpu = data.setdefault("cpu", {})
            if isinstance(cpu, dict):
                cpu.setdefault("split", True)
        # No KL term (and no reference.enable): no reference model is deployed at all.
        _imply(
            data,
            "use_reference",
            self.use_reference,
            "reference.enable / loss.config.use_kl_loss",
            "backend.use_reference",
        )
        try:
            return ArcticRLClientConfig(**data)
        except ConfigError as e:
            msg = str(e).replace("invalid ArcticRLClientConfig: ", "backend.").replace("; ", "; backend.")
            raise ValueError(msg.replace("backend.model_name", "model.name_or_path")) from None


def _recipe_options_parser(name: str) -> Callable[[dict], Any] | None:
    """The recipe's `parse_options` (its options model, raising ConfigError), or None: a recipe without one,
    or one not importable here (the loop names it when it imports the recipe)."""
    module = f"recipes.{name}"
    try:
        recipe = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and module.startswith(e.name):
            return None
        raise
    return getattr(recipe, "parse_options", None)


def _imply(section: dict, key: str, value: Any, source: str, target: str) -> None:
    if value is None:
        return
    if key in section and section[key] != value:
        raise ValueError(f"{target}={section[key]!r} disagrees with {source}={value!r}; set one of them")
    section[key] = value


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """`a.b.c=value` sets data["a"]["b"]["c"] (creating mappings); the value is a YAML scalar."""
    out = _deep_copy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({e})") from None
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(f"override {item!r}: {where} is {nxt!r}, not a mapping")
            node = nxt
        node[parts[-1]] = value
    return out


def parse_run_config(data: dict, overrides: list[str] | None = None, source: str = "config") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the run config must be a mapping, got {type(data).__name__}")
    data = apply_overrides(data, overrides or [])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"invalid run config {source}: " + explain(e, RunConfig).replace("async_", "async")) from None


def load_run_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """A run config file, with `base: OTHER.yaml` (a path relative to the file) read first and this file's keys
    merged over it: mappings key by key, anything else (lists included) replaced. A variant of a config (the async
    demo of the sync one) then says only what differs."""
    return parse_run_config(_read_with_bases(Path(path), ()), overrides, source=str(path))


def _read_with_bases(path: Path, seen: tuple[Path, ...]) -> dict:
    if not path.is_file():
        where = f" (base of {str(seen[-1])!r})" if seen else ""
        raise ConfigError(f"run config {str(path)!r}{where} does not exist")
    if path.resolve() in seen:
        chain = " -> ".join(str(p) for p in (*seen, path.resolve()))
        raise ConfigError(f"run config {str(path)!r}: `base` loops back to itself ({chain})")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"run config {str(path)!r} is not valid YAML: {e}") from None
    if not isinstance(data, dict) or "base" not in data:
        return data
    base = data.pop("base")
    if not isinstance(base, str) or not base:
        raise ConfigError(f"run config {str(path)!r}: base must be a config file's path, got {base!r}")
    return _merge(_read_with_bases(path.parent / base, (*seen, path.resolve())), data)


def _merge(under: dict, over: dict) -> dict:
    out = dict(under)
    for key, value in over.items():
        below = out.get(key)
        out[key] = _merge(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return out
