"""TRL's own GRPOTrainer vs `arctic-rl run`: the same GRPO run on the text2sql CPU workload, end to end.

One workload, read from recipes/text2sql/configs/cpu_demo.yaml (the demo model SmolLM2-135M-Instruct, the
bundled mini BIRD set's 20 simple train questions with the demo's prompt options, 4 prompts per step, n 8,
at most 48 new tokens at temperature 0.7 stopping at the closing fence, lr 1e-5 constant, 2 optimizer steps
per step in micro-batches of 8 rows, PPO clip 0.2 / 0.28, token-mean, no KL, the recipe's execution-match
reward), without the demo's SFT warm-up and dev evals (both sides start from the demo model; TRL has no
such stages). `Workload` is that one place: the arctic-rl run config and TRL's GRPOConfig are both made
from it, read back, and the run refuses to start unless both read back to the same settings
(tests/unit/test_vs_trl.py checks it too).
  arctic-rl   arctic_rl.loop.run on the run config, what `arctic-rl run` calls: engines in Ray (DeepSpeed
              trainer with ZoRRo Train, vLLM-CPU sampler), rewards in a process pool
  trl         trl 1.16.0's GRPOTrainer on one process (from .venv/trl-bench, off the main path), model loaded
              in fp32 and trained with bf16 autocast (TRL's bf16=True: fp32 weights, which its AdamW updates),
              gradient checkpointing off (TRL's default turns it on to save memory, which would add a
              forward), the recipe's reward as a TRL reward function calling the same scorer
              (arctic_rl.rewards.score_all: the same process pool)
Both see the same prompts at each step (TRL's dataset is laid out in the loop's order, shuffle_dataset
off) and score with the same function; the samples differ (each side's own seeds and sampler). Each side
runs in a fresh process of its own (`--side-worker`), one after the other, the order alternating between
repetitions (--repeats); the arctic-rl side's Ray cluster is checked gone before the next side starts.

TRL's generation (--trl-generation vllm, the default): its documented fastest mode, `use_vllm=True,
vllm_mode="colocate"`, vLLM-CPU 0.32 in TRL's process, in the sampler dtype arctic-rl's sampler uses
(arctic_rl.config.sampler_dtype; TRL leaves vLLM at the checkpoint's dtype: `TrlVLLM` passes it). TRL's
weight sync calls vLLM's `load_weights` on the running model, which fails on vLLM-CPU ("'Parameter' object
has no attribute 'weight_loader'": vLLM-CPU repacks the linear weights after loading); arctic-rl's sampler
meets the same limitation and reloads through vLLM's `reload_weights` instead (arctic_rl/engines/sampling.py
reload_weights_in_worker, which also re-packs a tied LM head's kernel), so TRL's sync is given the same function
(`trl_vllm_sync`, through vLLM's collective_rpc). TRL's vLLM importance-sampling correction (on by default)
is off: the arctic-rl run has none (cpu_demo.yaml sets no rollout_is). TRL's vLLM gets arctic-rl's sampler KV cache size
(VLLM_CPU_KVCACHE_SPACE). The settings check reads the master
weights' dtype of both sides (arctic-rl: DeepSpeed's fp32 master copy; TRL: the module's parameters) and
the sampler's dtype. The two earlier modes stay for comparison with the 2026-12-02 reports, and the check
names what they change: `generate` (transformers' `generate`, fp32) and `continuous-batching`
(transformers' `generate_batch`, in which TRL casts the model itself to bf16 before its first generation
and then trains bf16 weights with no fp32 master copy). vLLM's stop string "```" becomes TRL's stop tokens
in those two modes: every token whose text holds it.

Differences that remain, each side's own design: arctic-rl's PPO loss has verl's dual clip (3.0) on
negative advantages, TRL's has none; TRL shuffles the rows of a step before splitting them into micro-
batches, arctic-rl keeps prompt groups whole (ZoRRo needs the group); the std in the advantage gets
eps 1e-6 (arctic-rl) vs 1e-4 (TRL); arctic-rl's forward runs a bf16 copy of its fp32 master weights
(DeepSpeed's bf16 mode), TRL's the fp32 weights under bf16 autocast.

Phases (seconds per step, verl's names; TRL's from timers around its own methods): gen (TRL: `_generate`),
reward (`_calculate_rewards`), old_log_prob (TRL: the rest of `_generate_and_score_completions`: the old
log-probs and advantages), update_actor (the rest of the step: forward, backward and optimizer steps), step
(end to end, optimizer steps included). Tokens/s = the step's prompt + completion tokens / step seconds.
End to end = the whole run's wall clock, start-up included (arctic-rl: Ray, engines, vLLM; TRL: the model).
Both runs go to MLflow experiment "vs_trl" (tags framework trl / arctic-rl, backend native / arctic-rl,
the same setup tags) for `arctic-rl compare --experiment vs_trl`, and the two reward curves (per step,
rolling mean) to one PNG beside the report.

    python benchmarks/vs_trl.py                 # the full workload (10 steps), both sides, report + plot
    python benchmarks/vs_trl.py --repeats 2     # twice, the second repetition in the other order
    python benchmarks/vs_trl.py --quick         # 2 steps of 2 prompts, n 4, 16 tokens: for development
    python benchmarks/vs_trl.py --steps 6       # fewer steps
    python benchmarks/vs_trl.py --check-only    # the settings check only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a clean checkout
    sys.path.insert(0, str(ROOT))

from report import Report, add_report_args  # noqa: E402

from arctic_rl import tracking  # noqa: E402

# scripts/setup_env.sh installs trl --no-deps there, off the main path: verl 0.9.1 imports a class TRL 1.x removed
# whenever trl is importable, so only this benchmark puts it on sys.path.
TRL_DIR = Path(sys.executable).parent.parent / "trl-bench"
CONFIG = ROOT / "recipes" / "text2sql" / "configs" / "cpu_demo.yaml"
EXPERIMENT = "vs_trl"
FRAMEWORK_TRL = "trl"
# TRL's generation modes (--trl-generation); vllm needs the sync shim below (trl_vllm_sync)
TRL_GENERATIONS = {
    "vllm": "vLLM-CPU colocated (use_vllm, vllm_mode colocate), arctic-rl's sampler dtype, arctic-rl's reload as sync",
    "generate": "transformers generate (TRL's default), fp32",
    "continuous-batching": "transformers continuous batching (use_transformers_continuous_batching), bf16",
}
TRL_LOAD_DTYPE = "float32"  # run_trl loads TRL's model in fp32: its AdamW updates fp32 weights (bf16 autocast)
PHASES = ("gen", "reward", "old_log_prob", "update_actor", "step")  # the phases both sides time
# Every run: no SFT warm-up, no dev eval (TRL has neither), the benchmark's experiment, no GPU in the tags.
BASE_OVERRIDES = ["sft_warmup.epochs=0", "eval.split=null", f"tracking.experiment={EXPERIMENT}", "checkpoint.every=0"]
QUICK_OVERRIDES = [
    "train.steps=2",
    "train.prompts_per_step=2",
    "train.mini_batch_size=1",
    "sampling.n=4",
    "sampling.max_tokens=16",
]


def use_trl() -> None:
    """Makes TRL importable (TRL_DIR first on sys.path); exits naming the folder when trl is not there."""
    import importlib.util

    if TRL_DIR.is_dir() and str(TRL_DIR) not in sys.path:
        sys.path.insert(0, str(TRL_DIR))
    if importlib.util.find_spec("trl") is None:
        raise SystemExit(f"trl is not installed in {TRL_DIR}: run scripts/setup_env.sh (it installs trl 1.16.0 there)")


@dataclass(frozen=True)
class Workload:
    """What both sides must agree on; each side's config is made from it and read back into it."""

    model: str  # model.name_or_path ("demo")
    dtype: str
    prompts_per_step: int
    n: int
    max_prompt_length: int  # tokens: longer prompts are left out of the data (both sides get the same examples)
    max_completion_length: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    steps: int
    optimizer_steps_per_step: int
    rows_per_micro_batch: int
    ppo_epochs: int
    lr: float
    lr_schedule: str
    weight_decay: float
    betas: tuple[float, float]
    adam_eps: float
    grad_clip: float
    clip_low: float
    clip_high: float
    kl_coef: float
    entropy_coef: float
    loss_agg: str  # token-mean over the mini-batch
    advantage: str  # grpo: (r - group mean) / group std
    seed: int
    recipe_options: dict
    # what generates and what is trained: the sampler, its dtype, the dtype of the weights the optimizer updates
    generation: str = "vllm"
    sampler_dtype: str = "bfloat16"
    master_weights: str = "float32"
    rollout_correction: str = "none"  # importance sampling against the sampler's log-probs


def run_config(quick: bool = False, steps: int | None = None, run_name: str = "vs_trl-arctic-rl"):
    """The arctic-rl run config of the benchmark: cpu_demo.yaml with BASE_OVERRIDES (+ QUICK_OVERRIDES)."""
    from arctic_rl.runconfig import load_run_config

    overrides = BASE_OVERRIDES + (QUICK_OVERRIDES if quick else []) + [f"tracking.run_name={run_name}"]
    cfg = load_run_config(CONFIG, overrides + ([f"train.steps={steps}"] if steps else []))
    # On a CPU the loop's setup tag would count engines as GPUs; TRL's run has none either.
    cfg.tracking.tags[tracking.TAG_GPUS] = "0"
    return cfg


def arctic_workload(cfg) -> Workload:
    """The Workload an arctic-rl run config runs."""
    from arctic_rl.config import sampler_dtype

    client = cfg.client_config()
    tc, loss = client.training_config, cfg.loss.config
    if cfg.loss.name != "grpo" or loss.get("policy_loss", "ppo") != "ppo":
        raise ValueError(
            f"loss {cfg.loss.name}/{loss.get('policy_loss')}: the benchmark compares GRPO with the PPO loss"
        )
    window = client.vllm_config.max_seq_len
    return Workload(
        model=cfg.model.name_or_path,
        dtype=tc.dtype,
        prompts_per_step=cfg.train.prompts_per_step,
        n=cfg.sampling.n,
        max_prompt_length=window - cfg.sampling.max_tokens,
        max_completion_length=cfg.sampling.max_tokens,
        temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p,
        stop=tuple(cfg.sampling.stop),
        steps=cfg.train.steps,
        optimizer_steps_per_step=cfg.train.prompts_per_step // cfg.train.prompts_per_mini_batch,
        rows_per_micro_batch=tc.micro_batch_size,
        ppo_epochs=cfg.train.ppo_epochs,
        lr=tc.optimizer.lr,
        lr_schedule=tc.lr_scheduler.type,
        weight_decay=tc.optimizer.weight_decay,
        betas=tuple(tc.optimizer.betas),
        adam_eps=tc.optimizer.eps,
        grad_clip=tc.grad_clip,
        clip_low=loss.get("clip_ratio_low") or loss.get("clip_ratio", 0.2),
        clip_high=loss.get("clip_ratio_high") or loss.get("clip_ratio", 0.2),
        kl_coef=loss.get("kl_loss_coef", 0.001) if loss.get("use_kl_loss") else 0.0,
        entropy_coef=loss.get("entropy_coeff", 0.0),
        loss_agg=loss.get("loss_agg_mode", "token-mean"),
        advantage=cfg.advantage.estimator,
        seed=cfg.seed,
        recipe_options=dict(cfg.recipe.options),
        generation="vllm",
        sampler_dtype=sampler_dtype(client),
        master_weights="float32",  # DeepSpeed keeps fp32 master weights in bf16 mode; fp32 mode is fp32 throughout
        rollout_correction=str(loss.get("rollout_is") or "none"),
    )


# TRL's loss aggregation and reward scaling, by the name arctic-rl gives them
TRL_LOSS_TYPE = {"token-mean": "dapo"}  # dapo: token-level sum / active tokens of the whole accumulated batch
TRL_SCALE_REWARDS = {"grpo": "group", "drgrpo": "none"}


def trl_config(w: Workload, output_dir: Path, generation: str = "vllm"):
    """TRL's GRPOConfig for the workload (single CPU process, no logging integrations, no checkpoints)."""
    from trl import GRPOConfig

    return GRPOConfig(**trl_config_kwargs(w, output_dir, generation))


def trl_config_kwargs(w: Workload, output_dir: Path, generation: str = "vllm") -> dict[str, Any]:
    micro_per_step = w.prompts_per_step * w.n // w.rows_per_micro_batch
    batching = generation == "continuous-batching"
    if w.loss_agg not in TRL_LOSS_TYPE or w.advantage not in TRL_SCALE_REWARDS or w.lr_schedule != "constant":
        raise ValueError(f"no TRL equivalent for loss_agg={w.loss_agg!r} advantage={w.advantage!r} {w.lr_schedule=}")
    return dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=w.dtype == "bfloat16",
        gradient_checkpointing=False,
        per_device_train_batch_size=w.rows_per_micro_batch,
        gradient_accumulation_steps=micro_per_step // w.optimizer_steps_per_step,
        steps_per_generation=micro_per_step,
        num_generations=w.n,
        num_iterations=w.ppo_epochs,
        max_steps=w.steps * w.optimizer_steps_per_step * w.ppo_epochs,
        max_completion_length=w.max_completion_length,
        temperature=w.temperature,
        top_p=w.top_p,
        top_k=0,
        learning_rate=w.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=w.weight_decay,
        adam_beta1=w.betas[0],
        adam_beta2=w.betas[1],
        adam_epsilon=w.adam_eps,
        max_grad_norm=w.grad_clip,
        beta=w.kl_coef,
        entropy_coef=w.entropy_coef,
        epsilon=w.clip_low,
        epsilon_high=w.clip_high,
        loss_type=TRL_LOSS_TYPE[w.loss_agg],
        scale_rewards=TRL_SCALE_REWARDS[w.advantage],
        mask_truncated_completions=False,
        shuffle_dataset=False,  # the dataset is laid out in the loop's order
        seed=w.seed,
        report_to="none",  # this script logs TRL's run to MLflow itself, with the standard tags
        logging_steps=1,
        save_strategy="no",
        dataloader_num_workers=0,
        # generate_batch runs in the training dtype (TRL casts the model to bf16 for it); TRL's default share of
        # memory for its paged cache (half of it) is a GPU's: on this shared 24 GiB machine a tenth is plenty
        use_transformers_continuous_batching=batching,
        transformers_continuous_batching_config={"max_memory_percent": 0.1} if batching else None,
        # vLLM colocated in TRL's process; its sampler dtype is set by TrlVLLM (the GRPOConfig has no field for it)
        use_vllm=generation == "vllm",
        vllm_mode="colocate",
        vllm_max_model_length=w.max_prompt_length + w.max_completion_length,
        vllm_importance_sampling_correction=w.rollout_correction != "none",
        vllm_enable_sleep_mode=False,
    )


def trl_workload(
    args,
    model: str,
    dtype_model: str,
    max_prompt_length: int,
    stop,
    recipe_options: dict,
    sampler_dtype: str = "bfloat16",
) -> Workload:
    """The Workload a GRPOConfig runs (read back from it; what the config cannot hold is given: the model, its
    load dtype, the prompt window, the stops, the recipe, and the dtype TrlVLLM gives vLLM)."""
    batching = bool(args.use_transformers_continuous_batching)
    micro_per_step = args.steps_per_generation
    opt_per_step = micro_per_step // args.gradient_accumulation_steps
    inv = lambda table, value: next((k for k, v in table.items() if v == value), f"trl:{value}")  # noqa: E731
    return Workload(
        model=model,
        dtype="bfloat16" if args.bf16 else dtype_model,
        prompts_per_step=args.generation_batch_size // args.num_generations,
        n=args.num_generations,
        max_prompt_length=max_prompt_length,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        stop=tuple(stop),
        steps=args.max_steps // (opt_per_step * args.num_iterations),
        optimizer_steps_per_step=opt_per_step,
        rows_per_micro_batch=args.per_device_train_batch_size,
        ppo_epochs=args.num_iterations,
        lr=args.learning_rate,
        lr_schedule=str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)),
        weight_decay=args.weight_decay,
        betas=(args.adam_beta1, args.adam_beta2),
        adam_eps=args.adam_epsilon,
        grad_clip=args.max_grad_norm,
        clip_low=args.epsilon,
        clip_high=args.epsilon_high,
        kl_coef=args.beta,
        entropy_coef=args.entropy_coef,
        loss_agg=inv(TRL_LOSS_TYPE, args.loss_type),
        advantage=inv(TRL_SCALE_REWARDS, args.scale_rewards),
        seed=args.seed,
        recipe_options=dict(recipe_options),
        generation="vllm" if args.use_vllm else "continuous-batching" if batching else "generate",
        # transformers' generate runs the training module (fp32 weights under autocast); continuous batching casts
        # the module itself to bf16 (GRPOTrainer._generate_single_turn: model.to(bfloat16)) and trains it so
        sampler_dtype=sampler_dtype if args.use_vllm else "bfloat16" if batching else dtype_model,
        master_weights="bfloat16" if batching else TRL_LOAD_DTYPE,
        rollout_correction=(
            str(args.vllm_importance_sampling_mode)
            if args.use_vllm and args.vllm_importance_sampling_correction
            else "none"
        ),
    )


def differences(a: Workload, b: Workload) -> list[str]:
    """`field: a vs b` for every setting on which two workloads differ."""
    da, db = asdict(a), asdict(b)
    return [f"{k}: {da[k]!r} vs {db[k]!r}" for k in da if da[k] != db[k]]


# ---------------------------------------------------------------------------------------------
# the data both sides see


def train_examples(cfg, tokenizer) -> list[dict]:
    """The loop's train examples (recipe options, prompts that fit the window), as arctic_rl.loop.run takes them."""
    import importlib

    from arctic_rl.loop.data import fit_window

    recipe = importlib.import_module(f"recipes.{cfg.recipe.name}")
    examples, _ = fit_window(
        recipe.load_examples("train", **cfg.recipe.options), tokenizer, cfg.client_config().vllm_config.max_seq_len
    )
    return examples


def step_order(w: Workload, num_examples: int) -> list[list[int]]:
    """The example indices of each step, as the loop draws them (a function of seed and step)."""
    from arctic_rl.loop.data import step_indices

    return [step_indices(s, num_examples, w.prompts_per_step, w.seed) for s in range(1, w.steps + 1)]


def trl_rows(w: Workload, examples: list[dict], tokenizer) -> list[dict]:
    """TRL's dataset: one row per prompt of each step, in the loop's order (TRL's shuffle off). `prompt` is
    the loop's prompt text (chat template + the assistant pre-fill), `idx` the example it came from."""
    from arctic_rl.loop.data import _prompt_text

    return [
        {"prompt": _prompt_text(tokenizer, examples[i]), "idx": i}
        for step in step_order(w, len(examples))
        for i in step
    ]


def stop_token_ids(tokenizer, stops) -> list[int]:
    """Every token whose text holds one of the stop strings: TRL's transformers generation stops on tokens."""
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    texts = [tokenizer.convert_tokens_to_string([t]) if t is not None else "" for t in vocab]
    return [i for i, text in enumerate(texts) if any(s in text for s in stops)]


# ---------------------------------------------------------------------------------------------
# TRL


class Text2SQLReward:
    """The recipe's reward as a TRL reward function: the pre-fill + the completion, scored by the same
    scorer the loop uses. Records each call's scores, example ids and tokens (one call per step)."""

    __name__ = "text2sql_execution_match"  # TRL names the reward's metrics by it

    def __init__(self, reward_fn, examples: list[dict], prompt_tokens: dict[int, int]) -> None:
        self.reward_fn, self.examples, self.prompt_tokens = reward_fn, examples, prompt_tokens
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts, completions, completion_ids, idx, **_) -> list[float]:
        from arctic_rl.rewards import score_all

        exs = [self.examples[i] for i in idx]
        texts = [ex.get("assistant_prefix", "") + c for ex, c in zip(exs, completions)]
        scores = score_all(self.reward_fn, texts, exs)
        tokens = sum(self.prompt_tokens[i] for i in idx) + sum(len(c) for c in completion_ids)
        self.calls.append({"scores": scores, "idx": list(dict.fromkeys(idx)), "tokens": tokens})
        return scores


class PhaseClock:
    """Seconds per phase of the current step; a step closes at its last optimizer step."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.step_start = 0.0

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.current[name] += time.perf_counter() - t0

    def close_step(self) -> None:
        total = time.perf_counter() - self.step_start
        c = self.current
        scored = c["gen_and_score"]
        self.steps.append(
            {
                "gen": c["gen"],
                "reward": c["reward"],
                "old_log_prob": scored - c["gen"] - c["reward"],
                "update_actor": total - scored,
                "step": total,
            }
        )
        self.current = defaultdict(float)
        self.step_start = time.perf_counter()


def timed_trainer(clock: PhaseClock, optimizer_steps_per_step: int):
    """GRPOTrainer with timers around its own generate / reward / generate-and-score methods (behaviour
    unchanged), and a callback that closes a step at its last optimizer step."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, prompts):
            with clock.phase("gen"):
                return super()._generate(prompts)

        def _calculate_rewards(self, *args, **kwargs):
            with clock.phase("reward"):
                return super()._calculate_rewards(*args, **kwargs)

        def _generate_and_score_completions(self, inputs):
            with clock.phase("gen_and_score"):
                return super()._generate_and_score_completions(inputs)

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.step_start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % optimizer_steps_per_step == 0:
                clock.close_step()

    return TimedGRPOTrainer, StepClock()


@dataclass
class SideResult:
    name: str
    steps: list[dict[str, float]]  # per step: timing_s/<phase> (seconds), tokens, reward
    wall_s: float
    notes: list[str] = field(default_factory=list)
    run_id: str = ""

    @property
    def rewards(self) -> list[float]:
        return [s["reward"] for s in self.steps]


def trl_vllm_sync(self) -> None:
    """TRL's VLLMGeneration.sync_weights for colocate mode on vLLM-CPU: the trainer's parameters (as TRL names
    them for vLLM, its own _iter_named_params) reloaded through vLLM's reload_weights with arctic-rl's sampler
    function (reload_weights_in_worker: the same workaround arctic-rl's sync uses on vLLM-CPU), then TRL's prefix-cache
    reset. TRL's own colocate branch calls model.load_weights, which vLLM-CPU's repacked linear layers refuse."""
    from arctic_rl.engines.sampling import reload_weights_in_worker

    weights = [(name, param.detach()) for name, param in self._iter_named_params()]
    self.llm.collective_rpc(reload_weights_in_worker, args=(weights,))
    self.llm.reset_prefix_cache()


def install_trl_vllm_shims(sampler_dtype: str) -> None:
    """TRL's colocated vLLM with arctic-rl's sampler dtype (TRL builds its LLM without one, so vLLM would take the
    checkpoint's) and with trl_vllm_sync as its weight sync. Both are TRL's names patched in its module."""
    import functools

    from trl.generation import vllm_generation

    if not isinstance(vllm_generation.LLM, functools.partial):
        vllm_generation.LLM = functools.partial(vllm_generation.LLM, dtype=sampler_dtype)
    vllm_generation.VLLMGeneration.sync_weights = trl_vllm_sync


def run_trl(cfg, w: Workload, out: Path, generation: str) -> SideResult:
    import importlib

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    examples = train_examples(cfg, tokenizer)
    rows = trl_rows(w, examples, tokenizer)
    prompt_tokens = {r["idx"]: len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows}
    recipe = importlib.import_module(f"recipes.{cfg.recipe.name}")
    reward = Text2SQLReward(recipe.reward, examples, prompt_tokens)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=getattr(torch, TRL_LOAD_DTYPE))
    model.generation_config.eos_token_id = sorted({tokenizer.eos_token_id, *stop_token_ids(tokenizer, w.stop)})
    args = trl_config(w, out / "trl", generation)
    tw = trl_workload(args, w.model, w.dtype, w.max_prompt_length, w.stop, w.recipe_options, w.sampler_dtype)
    check_same(w, tw, allowed=GENERATION_FIELDS if generation != "vllm" else ())
    if generation == "vllm":
        install_trl_vllm_shims(w.sampler_dtype)
        # The KV cache arctic-rl's sampler gets on CPU (arctic_rl/engines/sampling.py): without it vLLM-CPU took its
        # default, and the first full-size TRL run was OOM-killed at 23 GB resident before its first step.
        kv_gb = cfg.client_config().vllm_config.cpu_kvcache_space_gb
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, int(kv_gb)))
    clock = PhaseClock()
    trainer_cls, callback = timed_trainer(clock, w.optimizer_steps_per_step)
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[callback],
    )
    trainer.train()
    wall = time.perf_counter() - t0
    # What ran, read from the objects themselves: the weights the optimizer updated and the sampler's dtype
    ran = {"master_weights": str(next(trainer.model.parameters()).dtype).removeprefix("torch.")}
    if generation == "vllm":
        ran["sampler_dtype"] = str(trainer.vllm_generation.llm.llm_engine.model_config.dtype).removeprefix("torch.")
    wrong = {k: f"{v} (expected {getattr(tw, k)})" for k, v in ran.items() if v != getattr(tw, k)}
    if wrong:
        raise RuntimeError(f"TRL did not run the settings it was given: {wrong}")
    drawn = [c["idx"] for c in reward.calls]
    if drawn != step_order(w, len(examples)):
        raise RuntimeError(f"TRL drew other prompts than the loop: {drawn} vs {step_order(w, len(examples))}")
    steps = [
        {
            **{tracking.TIMING_PREFIX + p: s[p] for p in PHASES},
            "tokens": c["tokens"],
            "reward": statistics.mean(c["scores"]),
        }
        for s, c in zip(clock.steps, reward.calls, strict=True)
    ]
    return SideResult("trl", steps, wall, [f"TRL generation: {TRL_GENERATIONS[generation]}", f"TRL ran: {ran}"])


def log_trl_mlflow(result: SideResult, w: Workload, args, generation: str) -> str:
    """TRL's run in the benchmark's experiment, with the tags and metric names the loop's run has."""
    tags = {
        tracking.TAG_FRAMEWORK: FRAMEWORK_TRL,
        tracking.TAG_BACKEND: tracking.BACKEND_NATIVE,
        tracking.TAG_RECIPE: "text2sql",
        tracking.TAG_MODEL: w.model,
        tracking.TAG_NODES: "1",
        tracking.TAG_GPUS: "0",
        tracking.TAG_PROMPTS_PER_STEP: str(w.prompts_per_step),
        tracking.TAG_N: str(w.n),
        tracking.TAG_MAX_PROMPT_LENGTH: str(w.max_prompt_length),
        tracking.TAG_MAX_RESPONSE_LENGTH: str(w.max_completion_length),
        "generation": TRL_GENERATIONS[generation],
    }
    params = {k: v for k, v in args.to_dict().items() if isinstance(v, (int, float, str, bool)) or v is None}
    with tracking.Tracker.start(EXPERIMENT, run_name="vs_trl-trl", tags=tags, params=params) as tracker:
        for step, s in enumerate(result.steps, 1):
            metrics = {k: v for k, v in s.items() if k.startswith(tracking.TIMING_PREFIX)}
            metrics[tracking.REWARD_MEAN] = s["reward"]
            metrics[tracking.PERF_TOTAL_NUM_TOKENS] = s["tokens"]
            metrics[tracking.PERF_THROUGHPUT] = s["tokens"] / s[tracking.TIMING_STEP]
            tracker.log_metrics(metrics, step)
        return tracker.run_id


# ---------------------------------------------------------------------------------------------
# arctic-rl


def run_arctic(cfg) -> SideResult:
    """The loop's run (what `arctic-rl run <config> <overrides>` calls), its own MLflow run included."""
    from arctic_rl.loop import run

    r = run(cfg)
    steps = [
        {
            **{k: v for k, v in m.items() if k.startswith(tracking.TIMING_PREFIX)},
            "tokens": m[tracking.PERF_TOTAL_NUM_TOKENS],
            "reward": m[tracking.REWARD_MEAN],
        }
        for m in r.history
    ]
    return SideResult("arctic-rl", steps, r.wall_s, run_id=r.run_id)


# ---------------------------------------------------------------------------------------------


GENERATION_FIELDS = ("generation", "sampler_dtype", "master_weights")


def check_same(a: Workload, b: Workload, allowed: tuple[str, ...] = ()) -> list[str]:
    """Refuses two workloads that differ, but for the `allowed` fields (TRL's earlier generation modes): those
    differences are returned, to be printed and reported."""
    diff = [d for d in differences(a, b) if d.split(":")[0] not in allowed]
    if diff:
        raise SystemExit("the two sides would not run the same workload:\n  " + "\n  ".join(diff))
    return differences(a, b)


def median_after_first(values: list[float]) -> float:
    """The median of the steps after the first (its compilation and cache warm-up), or the one step."""
    return statistics.median(values[1:] or values)


def summarize(results: dict[str, SideResult], report: Report | None, label: str = "") -> dict[str, float]:
    rows = []
    for name, r in results.items():
        row: dict[str, Any] = {"side": name}
        for p in PHASES:
            key = tracking.TIMING_PREFIX + p
            row[f"{p} s"] = median_after_first([s[key] for s in r.steps]) if key in r.steps[0] else float("nan")
        row["tokens/s"] = median_after_first([s["tokens"] / s[tracking.TIMING_STEP] for s in r.steps])
        row["steps s (sum)"] = sum(s[tracking.TIMING_STEP] for s in r.steps)
        row["wall s (end to end)"] = r.wall_s
        row["start-up s"] = r.wall_s - row["steps s (sum)"]
        row["reward first half"] = statistics.mean(r.rewards[: max(1, len(r.rewards) // 2)])
        row["reward second half"] = statistics.mean(r.rewards[len(r.rewards) // 2 :])
        rows.append(row)
    ratios: dict[str, float] = {}
    if {"trl", "arctic-rl"} <= set(results):
        trl, arc = rows[[r["side"] for r in rows].index("trl")], rows[[r["side"] for r in rows].index("arctic-rl")]
        for p in PHASES:
            ratios[p] = trl[f"{p} s"] / arc[f"{p} s"]
        ratios["end to end"] = trl["wall s (end to end)"] / arc["wall s (end to end)"]
        ratios["steps only"] = trl["steps s (sum)"] / arc["steps s (sum)"]
    cols = list(rows[0])
    print("  " + " | ".join(cols))
    for row in rows:
        print("  " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()))
    for name, r in results.items():
        print(f"  {name} reward per step: " + " ".join(f"{x:.3f}" for x in r.rewards))
    if report is not None:
        for row in rows:
            report.add(f"seconds per step (median over the steps after the first), tokens/s, wall clock{label}", **row)
        for name, r in results.items():
            report.add(
                f"reward per step (critic/rewards/mean){label}",
                side=name,
                **{str(i): f"{x:.3f}" for i, x in enumerate(r.rewards, 1)},
            )
        if ratios:
            report.add(
                f"TRL / arctic-rl (above 1: arctic-rl is faster){label}",
                **{k: f"{v:.2f}x" for k, v in ratios.items()},
            )
    return ratios


def run_side(args, cfg, w: Workload, side: str, result_path: Path) -> None:
    """One side, in this (fresh) process: its result goes to `result_path` as soon as it is done."""
    if side == "arctic-rl":
        result = run_arctic(cfg)
    else:
        result = run_trl(cfg, w, args.out, args.trl_generation)
        trl_args = trl_config(w, args.out / "trl", args.trl_generation)
        result.run_id = log_trl_mlflow(result, w, trl_args, args.trl_generation)
    print(f"{side}: {result.wall_s:.1f}s end to end, mlflow run {result.run_id}", flush=True)
    result_path.write_text(json.dumps(asdict(result)))


SESSION_GRACE_S = 30.0


def spawn_side(side: str, rep: int, result_path: Path) -> SideResult:
    """Runs one side in a fresh Python process (no import, thread pool, Ray session or allocator state of the
    other side), in a session of its own. After it exits no process of that session may remain (the arctic-rl
    side's embedded Ray cluster starts in it), since the next side would share the cores with them: those still
    there after SESSION_GRACE_S are killed. Processes of other sessions (another Ray cluster of this user) are not
    touched."""
    import signal
    import subprocess

    print(f"\n== {side} (repetition {rep + 1}, fresh process) ==", flush=True)
    cmd = [sys.executable, __file__, *sys.argv[1:], "--side-worker", side, "--result", str(result_path)]
    child = subprocess.Popen(cmd, start_new_session=True)
    if child.wait():
        raise SystemExit(f"{side}: its process exited with {child.returncode}")
    # Ray's processes (GCS, raylet, dashboard, workers) end some seconds after the driver: 2 s was too short
    # for the first --quick run, whose leftovers were then killed and the run stopped.
    deadline = time.monotonic() + SESSION_GRACE_S
    while (left := _session_pids(child.pid)) and time.monotonic() < deadline:
        time.sleep(1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        time.sleep(1)
        if still := _session_pids(child.pid):
            raise SystemExit(f"{side}: {len(still)} processes of its session survive SIGKILL: {still}")
        print(f"{side}: {len(left)} processes of its session outlived it by {SESSION_GRACE_S:.0f} s (killed)")
    return SideResult(**json.loads(result_path.read_text()))


def _session_pids(sid: int) -> list[int]:
    """The processes of session `sid` (a session's id is its leader's pid)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(proc.name)) == sid:
                    out.append(int(proc.name))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 steps of 2 prompts, n 4, 16 tokens: for development")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the config's, 10)")
    ap.add_argument("--sides", default="arctic-rl,trl", help="comma-separated, the first repetition's order")
    ap.add_argument("--repeats", type=int, default=1, help="repetitions; each after the first reverses the order")
    ap.add_argument(
        "--check-only", action="store_true", help="check that both sides get the same settings; run nothing"
    )
    ap.add_argument(
        "--trl-generation",
        choices=sorted(TRL_GENERATIONS),
        default="vllm",
        help="TRL's generation: vLLM-CPU colocated (default), transformers generate (fp32), or transformers "
        "continuous batching (bf16 weights)",
    )
    ap.add_argument("--out", type=Path, default=Path("outputs/bench_vs_trl"), help="TRL's output folder")
    ap.add_argument("--side-worker", choices=("arctic-rl", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    add_report_args(ap)
    args = ap.parse_args()
    sides = args.sides.split(",")
    if set(sides) - {"arctic-rl", "trl"} or not sides:
        raise SystemExit(f"--sides {args.sides!r}: expected a comma-separated subset of arctic-rl,trl")
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"--steps {args.steps}: expected an integer >= 1")
    if args.repeats < 1:
        raise SystemExit(f"--repeats {args.repeats}: expected an integer >= 1")

    use_trl()
    cfg = run_config(args.quick, args.steps)
    w = arctic_workload(cfg)
    tw = trl_workload(
        trl_config(w, args.out / "trl", args.trl_generation),
        w.model,
        w.dtype,
        w.max_prompt_length,
        w.stop,
        w.recipe_options,
        w.sampler_dtype,
    )
    allowed = GENERATION_FIELDS if args.trl_generation != "vllm" else ()
    if args.side_worker:
        run_side(args, cfg, w, args.side_worker, args.result)
        return
    unlike = check_same(w, tw, allowed)
    print("one workload, both sides (arctic-rl run config and TRL GRPOConfig read back equal):")
    for k, v in asdict(w).items():
        print(f"  {k}: {v}")
    for d in unlike:
        print(f"  differs in this TRL mode: {d}")
    if args.check_only:
        return
    report = Report.start("vs_trl", "TRL's GRPOTrainer vs arctic-rl run: text2sql CPU workload, end to end", args)
    report.note(__doc__.split("\n\n", 1)[1].split("\n    python")[0])
    report.add("workload (both sides)", **{k: v for k, v in asdict(w).items() if k != "recipe_options"})
    if unlike:
        report.note("**Not the same settings** (TRL's generation mode): " + "; ".join(unlike) + ".")
    if args.steps is not None:
        report.note(
            f"**Fewer steps**: {w.steps} GRPO steps (--steps), not the config's {run_config(args.quick).train.steps}."
        )
    generation = TRL_GENERATIONS[args.trl_generation]
    report.note(f"TRL generation in this run: {generation}.")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; TRL generation: {generation}")

    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, SideResult]] = []
    for rep in range(args.repeats):
        order = sides if rep % 2 == 0 else sides[::-1]
        results = {side: spawn_side(side, rep, args.out / f"{side}-{rep}.json") for side in order}
        report.note(f"Repetition {rep + 1}: {' then '.join(order)}, each in a fresh process.")
        runs.append(results)

    print("\nseconds per step (median over the steps after the first):")
    all_ratios = []
    for rep, results in enumerate(runs):
        if args.repeats > 1:
            print(f"repetition {rep + 1}:")
        all_ratios.append(summarize(results, report, f" (repetition {rep + 1})" if args.repeats > 1 else ""))
    results = runs[0]
    png = report.path().with_suffix(".png")
    tracking.plot_reward_runs(
        {f"{name} (rep {i + 1})": (r.rewards, None) for i, res in enumerate(runs) for name, r in res.items()},
        png,
        title="text2sql CPU: TRL vs arctic-rl",
    )
    report.note(f"Reward curves: [{png.name}]({png.name}) (per step, rolling mean over {tracking.ROLLING_WINDOW}).")
    if all_ratios and all_ratios[0]:
        med = {k: statistics.median(r[k] for r in all_ratios) for k in all_ratios[0]}
        spread = {k: (min(r[k] for r in all_ratios), max(r[k] for r in all_ratios)) for k in all_ratios[0]}
        rewards = {name: statistics.mean(x for res in runs for x in res[name].rewards) for name in ("arctic-rl", "trl")}
        summary = (
            f"arctic-rl is {med['end to end']:.2f}x TRL end to end (target >= 3x), {med['steps only']:.2f}x on the "
            f"steps alone, {med['step']:.2f}x per step (median)"
            + (
                f"; over {len(runs)} repetitions end to end {spread['end to end'][0]:.2f}-"
                f"{spread['end to end'][1]:.2f}x"
                if len(runs) > 1
                else ""
            )
            + f"; mean reward arctic-rl {rewards['arctic-rl']:.3f}, TRL {rewards['trl']:.3f} (one seed from the "
            "base model: not a learning comparison)"
        )
        print(summary)
        report.note(f"**Summary**: {summary}. MLflow: `arctic-rl compare --experiment {EXPERIMENT}`.")
    report.write()


if __name__ == "__main__":
    main()
