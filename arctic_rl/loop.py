"""The reference GRPO loop: a recipe run on arctic-rl's public client ops, step by timed step.

    arctic-rl run tests/configs/tiny_loop.yaml model.name_or_path=/path/to/model
    # or: from arctic_rl.loop import run; run(load_run_config(path, overrides))

One step (verl's phase names, logged as timing_s/<phase>):
  gen            take prompts_per_step examples (a seeded order, reshuffled each epoch), apply the chat
                 template to `messages` + `assistant_prefix`, sample n responses each (seed from (seed, step))
  reward         recipe.reward(assistant_prefix + text, example), in a process pool (arctic_rl.rewards)
  adv            GRPO / Dr.GRPO / RLOO over each prompt's group (arctic_rl.advantages)
  old_log_prob   the trainer's log-probs of the samples (PPO's pi_old; in async mode the proximal policy)
  ref            the reference model's log-probs, only when the loss has a KL term (else not logged)
  update_actor   ppo_epochs x mini-batches (whole prompt groups, in order): forward_backward + optimizer_step
  update_weights sync_weights: trainer -> sampler
Colocated engines (backend.colocate, sync loop, sleep_engines): the trainer and reference sleep during gen,
the sampler sleeps from the end of gen until just before update_weights (which needs both awake), so on
CUDA vLLM gives its memory back while the trainer works (arctic_rl.server.controller's sleep/wake ops).
Checkpoints (checkpoint.every): the backend's save_checkpoint (weights, optimizer, scheduler) into
<dir>/step_K, then loop_state.json (step, data position, RNG states, MLflow run id) written last and
atomically: a step_K without it is half-written and resume skips it. The checkpoint dir must be on a
filesystem the backend also sees (it writes there). Resume is exact in sync mode: the data order and
sampling seeds are functions of (seed, step), and the sampler gets the resumed weights.
Eval (eval.split): greedy decoding on a held-out split before step 1, every eval.every steps and after the
last step; eval/accuracy is the share of examples whose reward is >= 1 (the recipe's full-credit answer).
SFT warm-up (sft_warmup.epochs > 0, fresh runs only): eval, supervised passes over recipe.sft_completion(example)
with the sft loss and the run's optimizer, sync, then the GRPO steps above.
Departures from verl: mini-batches are not reshuffled between PPO epochs; no critic.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arctic_rl import advantages, tracking
from arctic_rl.batch import from_samples, group_rows, select_rows
from arctic_rl.client.client import ArcticRLClient, create_arctic_rl_client
from arctic_rl.errors import ConfigError
from arctic_rl.pipeline import AsyncRollouts, Request, Rollout, SyncRollouts
from arctic_rl.rewards import score_all
from arctic_rl.runconfig import RunConfig

STATE_FILE = "loop_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class RunResult:
    history: list[dict[str, float]]  # the metrics of each step run by this call
    rewards: list[float]  # critic/rewards/mean of every step so far (across resumes)
    run_id: str
    checkpoint_dir: Path
    wall_s: float
    plot: Path | None = None
    eval_accuracy: dict[int, float] = field(default_factory=dict)  # step (0 = before GRPO, -1 = before sft) -> acc


@dataclass
class EvalResult:
    accuracy: float
    reward_mean: float
    num_examples: int
    seconds: float


def evaluate(client: ArcticRLClient, recipe, examples: list[dict], tokenizer, cfg: RunConfig) -> EvalResult:
    """Greedy decoding over `examples`; accuracy = share whose reward reaches full credit (>= 1)."""
    t0 = time.perf_counter()
    params = {
        "n": 1,
        "max_tokens": cfg.eval.max_tokens or cfg.sampling.max_tokens,
        "temperature": 0.0,
        "stop": list(cfg.sampling.stop),
    }
    samples = client.generate([prompt_ids(tokenizer, ex) for ex in examples], params)
    rewards = score_all(
        recipe.reward, [ex.get("assistant_prefix", "") + s["text"] for s, ex in zip(samples, examples)], examples
    )
    return EvalResult(
        float(np.mean([r >= 1.0 for r in rewards])), float(np.mean(rewards)), len(examples), time.perf_counter() - t0
    )


@dataclass
class LoopState:
    step: int = 0  # steps done
    run_id: str | None = None
    rewards: list[float] = field(default_factory=list)
    # With checkpoints on, a step's metrics reach MLflow only once a checkpoint covers the step: a step run
    # again after a requeue is then never logged twice. They travel in the checkpoint, so steps whose
    # checkpoint was written but whose metrics were not yet logged (killed in between) are logged on resume.
    unlogged: dict[int, dict[str, float]] = field(default_factory=dict)


# -- data order and prompts ----------------------------------------------------------------------------------
def step_indices(step: int, num_examples: int, per_step: int, seed: int) -> list[int]:
    """Example indices of `step` (1-based): a pure function of (seed, step), so resume needs no data state.
    Epoch e visits the examples in permutation(seed, e); steps run across epoch boundaries."""
    out = []
    for g in range((step - 1) * per_step, step * per_step):
        epoch, pos = divmod(g, num_examples)
        out.append(int(_epoch_order(seed, epoch, num_examples)[pos]))
    return out


def _epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of a step: reproducible across resumes, different every step."""
    return int(np.random.default_rng([seed, step, 7]).integers(2**31 - 1))


def prompt_ids(tokenizer, example: dict) -> list[int]:
    text = tokenizer.apply_chat_template(example["messages"], tokenize=False, add_generation_prompt=True)
    # The template already holds any BOS: tokenize without adding special tokens again.
    return tokenizer(text + example.get("assistant_prefix", ""), add_special_tokens=False)["input_ids"]


# -- checkpoints ---------------------------------------------------------------------------------------------
def latest_checkpoint(root: Path) -> Path | None:
    """The complete step_K folder with the largest K (complete = loop_state.json was written)."""
    if not root.is_dir():
        return None
    done = [
        (int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return max(done)[1] if done else None


def resume_path(cfg: RunConfig) -> Path | None:
    if cfg.resume == "never":
        return None
    if cfg.resume == "auto":
        return latest_checkpoint(cfg.checkpoint_dir)
    path = Path(cfg.resume).expanduser()
    if not (path / STATE_FILE).is_file():
        raise ConfigError(f"resume={cfg.resume!r}: {path / STATE_FILE} does not exist (not a complete checkpoint)")
    return path


def save_checkpoint(client: ArcticRLClient, root: Path, state: LoopState) -> Path:
    path = (root / f"step_{state.step}").resolve()
    client.save_checkpoint(str(path))
    np_state = np.random.get_state()
    payload = {
        "step": state.step,
        "run_id": state.run_id,
        "rewards": state.rewards,
        "unlogged": {str(k): v for k, v in state.unlogged.items()},
        "rng": {
            "python": _jsonable(random.getstate()),
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
            "torch": torch.get_rng_state().tolist(),
        },
    }
    tmp = path / f".{STATE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(payload))
    tmp.replace(path / STATE_FILE)  # last: its presence marks the checkpoint complete
    return path


def load_checkpoint(client: ArcticRLClient, path: Path) -> LoopState:
    payload = json.loads((path / STATE_FILE).read_text())
    client.load_checkpoint(str(path.resolve()))
    client.sync_weights()  # the sampler must sample with the resumed weights
    rng = payload["rng"]
    random.setstate(_tupled(rng["python"]))
    np.random.set_state((rng["numpy"][0], np.array(rng["numpy"][1], dtype=np.uint32), *rng["numpy"][2:]))
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    return LoopState(
        step=int(payload["step"]),
        run_id=payload.get("run_id"),
        rewards=list(payload["rewards"]),
        unlogged={int(k): v for k, v in payload.get("unlogged", {}).items()},
    )


def flush_metrics(tracker: tracking.Tracker, state: LoopState) -> None:
    """Logs the held-back metrics of checkpointed steps, skipping any MLflow already has (exactly once)."""
    if not state.unlogged:
        return
    done = tracker.logged_steps(tracking.TIMING_STEP)
    for step, metrics in sorted(state.unlogged.items()):
        if step not in done:
            tracker.log_metrics(metrics, step=step)
    state.unlogged.clear()


def _jsonable(x: Any) -> Any:
    return [_jsonable(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tupled(x: Any) -> Any:
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x


# -- tracking ------------------------------------------------------------------------------------------------
def run_setup(cfg: RunConfig, client: ArcticRLClient, num_gpus: int) -> dict[str, str]:
    """The setup tags `arctic-rl compare` groups runs by (tracking.SETUP_TAGS). Nodes are those the engines
    landed on. The longest prompt is what the sampler admits with room for max_tokens (how the SkyRL recipe
    maps its max_prompt_length too). A job launcher's ARCTIC_RL_NODES / ARCTIC_RL_GPUS win, as they do for
    the verl and SkyRL runs of the same job."""
    engines = client.health().get("engines", {})
    nodes = len({e["node_id"] for e in engines.values() if e.get("node_id")}) or 1
    setup = {
        tracking.TAG_MODEL: cfg.model.name_or_path,
        tracking.TAG_NODES: str(nodes),
        tracking.TAG_GPUS: str(num_gpus),
        tracking.TAG_PROMPTS_PER_STEP: str(cfg.train.prompts_per_step),
        tracking.TAG_N: str(cfg.sampling.n),
        tracking.TAG_MAX_PROMPT_LENGTH: str(client.config.vllm_config.max_seq_len - cfg.sampling.max_tokens),
        tracking.TAG_MAX_RESPONSE_LENGTH: str(cfg.sampling.max_tokens),
    }
    from_env = {tag for env, tag in tracking.ENV_DEFAULT_TAGS.items() if os.environ.get(env)}
    return {k: v for k, v in setup.items() if k not in from_env}


def open_tracker(cfg: RunConfig, run_id: str | None, setup: dict[str, str] | None = None) -> tracking.Tracker:
    """Continues the run a checkpoint names (same tracking store), else starts one."""
    if run_id:
        from mlflow.tracking import MlflowClient

        mc = MlflowClient(tracking_uri=tracking.default_tracking_uri())
        try:
            run = mc.get_run(run_id)
            mc.update_run(run_id, status="RUNNING")
            return tracking.Tracker(mc, run_id, run.info.experiment_id)
        except Exception:  # the store moved (another MLFLOW_TRACKING_URI): keep going in a new run
            pass
    tags = {
        tracking.TAG_FRAMEWORK: tracking.FRAMEWORK_ARCTIC,
        tracking.TAG_BACKEND: tracking.BACKEND_ARCTIC,
        tracking.TAG_RECIPE: cfg.recipe.name,
        tracking.TAG_MODEL: cfg.model.name_or_path,
        **(setup or {}),
        **cfg.tracking.tags,
    }
    return tracking.Tracker.start(
        cfg.tracking.experiment or cfg.recipe.name,
        run_name=cfg.tracking.run_name,
        tags=tags,
        params=cfg.model_dump(by_alias=True, mode="json"),
    )


# -- one step ------------------------------------------------------------------------------------------------
def compute_advantages(cfg: RunConfig, scores_B: torch.Tensor, uids: list) -> torch.Tensor:
    est = cfg.advantage.estimator
    if est == "rloo":
        return advantages.rloo(scores_B, uids)
    return advantages.grpo(scores_B, uids, norm_by_std=(est == "grpo"), eps=cfg.advantage.eps)


class EngineSleep:
    """Puts the engines a phase does not use to sleep, when they share devices and run in step (colocated,
    sync loop): trainer and reference asleep during gen, sampler asleep from the end of gen to the weight
    sync. The reference wakes only if the loss uses it. Remembers what it put to sleep, so each call is
    made once."""

    def __init__(self, client: ArcticRLClient, cfg: RunConfig):
        self.client, self.use_reference = client, cfg.use_reference
        self.enabled = cfg.sleep_engines and client.config.colocate and not cfg.async_.enable
        # what the backend says is asleep now (a given client may come from a run that stopped mid-step)
        self.asleep: set[str] = set(client.health().get("asleep", []))

    def _set(self, engine: str, asleep: bool) -> None:
        if not self.enabled or (engine in self.asleep) == asleep:
            return
        (self.client.sleep if asleep else self.client.wake)(engine)
        (self.asleep.add if asleep else self.asleep.discard)(engine)

    def before_gen(self) -> None:
        self._set("sampling", False)
        self._set("training", True)
        self._set("log_prob", True)

    def after_gen(self) -> None:
        self._set("sampling", True)
        self._set("training", False)
        if self.use_reference:
            self._set("log_prob", False)

    def before_sync(self) -> None:
        self._set("log_prob", True)
        self._set("sampling", False)

    def wake_all(self) -> None:
        """Every engine awake (also when this run sleeps none: they may be left asleep by an earlier run)."""
        for engine in sorted(self.asleep, key=("sampling", "training", "log_prob").index):
            self.client.wake(engine)
            self.asleep.discard(engine)


def train_step(
    cfg: RunConfig, client: ArcticRLClient, recipe, rollout: Rollout, pad_id: int, before_sync
) -> dict[str, float]:
    n = cfg.sampling.n
    t: dict[str, float] = {"gen": rollout.wait_s}
    t0 = time.perf_counter()
    completions = [
        ex.get("assistant_prefix", "") + s["text"]
        for i, ex in enumerate(rollout.examples)
        for s in rollout.samples[i * n : (i + 1) * n]
    ]
    examples_B = [ex for ex in rollout.examples for _ in range(n)]
    scores_B = torch.tensor(score_all(recipe.reward, completions, examples_B))
    t["reward"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    uids = [f"{rollout.step}-{i // n}" for i in range(len(rollout.samples))]
    batch = from_samples(rollout.samples, uids, pad_token_id=pad_id)
    batch["advantages"] = compute_advantages(cfg, scores_B, uids)
    t["adv"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    # Rollout, old and reference log-probs and the loss all use the sampling distribution (as verl does).
    temperature = actor_loss_config(cfg)["temperature"]
    batch["old_log_probs"] = client.log_probs(batch, temperature=temperature)["log_probs"]
    t["old_log_prob"] = time.perf_counter() - t0
    if cfg.use_reference:  # else no timing_s/ref, as verl: a phase that did not run has no time (nor tokens/s)
        t0 = time.perf_counter()
        batch["ref_log_prob"] = client.log_probs(batch, reference=True, temperature=temperature)["log_probs"]
        t["ref"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    loss_config = actor_loss_config(cfg)
    groups = group_rows(batch)
    per_mb = cfg.train.prompts_per_mini_batch
    actor: dict[str, list[float]] = {}
    for _ in range(cfg.train.ppo_epochs):
        for g in range(0, len(groups), per_mb):
            mini = select_rows(batch, [r for grp in groups[g : g + per_mb] for r in grp])
            out = client.forward_backward(mini, cfg.loss.name, loss_config)
            opt = client.optimizer_step()
            for k, v in {**out, "actor/grad_norm": opt["grad_norm"], "actor/lr": opt["lr"]}.items():
                if k.startswith(("actor/", "rollout_corr/")):
                    actor.setdefault(k, []).append(float(v))
    t["update_actor"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    before_sync()  # async: rollouts in flight finish on the weights they started with
    client.sync_weights()
    t["update_weights"] = time.perf_counter() - t0

    mask = batch["response_mask"].float()
    metrics = {f"{tracking.TIMING_PREFIX}{k}": v for k, v in t.items()}
    metrics.update({k: float(np.mean(v)) for k, v in actor.items()})
    metrics[tracking.REWARD_MEAN] = float(scores_B.mean())
    metrics[tracking.RESPONSE_LENGTH_MEAN] = float(mask.sum(-1).mean())
    metrics["async/staleness"] = float(rollout.step - 1 - rollout.version)
    metrics["async/gen_s"] = rollout.gen_s
    metrics["_num_tokens"] = float(batch["attention_mask"].sum())
    return metrics


def stage_options(cfg: RunConfig, overrides: dict) -> dict:
    """A stage's recipe options (eval, sft_warmup): its own over recipe.options; a key set to None is dropped."""
    return {k: v for k, v in {**cfg.recipe.options, **overrides}.items() if v is not None}


# -- the SFT warm-up stage -----------------------------------------------------------------------------------
def sft_warmup(
    cfg: RunConfig,
    client: ArcticRLClient,
    recipe,
    tokenizer,
    pad_id: int,
    tracker: tracking.Tracker,
    quiet: bool = False,
) -> dict[str, float]:
    """Supervised passes over the recipe's reference completions (sft loss, the run's optimizer), then a
    weight sync, so that GRPO starts from a policy that already knows the answer format. Metrics go to
    MLflow as sft/* with their own step count (1..epochs x batches)."""
    from tqdm import tqdm

    w = cfg.sft_warmup
    if not callable(getattr(recipe, "sft_completion", None)):
        raise ConfigError(
            f"sft_warmup.epochs={w.epochs}: recipe {cfg.recipe.name!r} has no sft_completion(example) to train on"
        )
    options = stage_options(cfg, w.options)
    examples = recipe.load_examples(w.split, **options)[: w.limit]
    pairs = []
    for ex in examples:
        text = recipe.sft_completion(ex)
        if text:  # None: the example's answer cannot continue its assistant_prefix
            pairs.append((prompt_ids(tokenizer, ex), tokenizer(text, add_special_tokens=False)["input_ids"]))
    if not pairs:
        raise ConfigError(
            f"sft_warmup: recipe {cfg.recipe.name!r} gave no completions for split {w.split!r} with options {options}"
        )
    t0 = time.perf_counter()
    per_epoch = -(-len(pairs) // w.batch_size)
    bar = tqdm(total=w.epochs * per_epoch, desc="sft warm-up", unit="step", disable=quiet)
    losses: list[float] = []
    step = 0
    for epoch in range(w.epochs):
        order = _epoch_order(cfg.seed + 7919, epoch, len(pairs))  # its own stream, not the GRPO order
        for b in range(0, len(pairs), w.batch_size):
            idx = [int(i) for i in order[b : b + w.batch_size]]
            samples = [{"prompt_token_ids": pairs[i][0], "token_ids": pairs[i][1]} for i in idx]
            batch = from_samples(samples, [f"sft-{epoch}-{i}" for i in idx], pad_token_id=pad_id)
            out = client.forward_backward(batch, "sft", {"loss_agg_mode": "token-mean"})
            opt = client.optimizer_step()
            step += 1
            losses.append(float(out["actor/sft_loss"]))
            tracker.log_metrics(
                {
                    "sft/loss": losses[-1],
                    "sft/grad_norm": opt["grad_norm"],
                    "sft/lr": opt["lr"],
                    "sft/epoch": float(epoch),
                },
                step=step,
            )
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    client.sync_weights()
    first, last = losses[:per_epoch], losses[-per_epoch:]
    summary = {
        "sft/loss_first_epoch": float(np.mean(first)),
        "sft/loss_last_epoch": float(np.mean(last)),
        "sft/examples": float(len(pairs)),
        "timing_s/sft": time.perf_counter() - t0,
    }
    tracker.log_metrics(summary, step=0)
    if not quiet:
        print(
            f"sft warm-up: {len(pairs)} examples x {w.epochs} epochs = {step} optimizer steps | loss first epoch "
            f"{summary['sft/loss_first_epoch']:.3f} -> last {summary['sft/loss_last_epoch']:.3f} | "
            f"{summary['timing_s/sft']:.0f}s",
            flush=True,
        )
    return summary


# -- the run -------------------------------------------------------------------------------------------------
def run(
    cfg: RunConfig, client: ArcticRLClient | None = None, *, stop_after: int | None = None, quiet: bool = False
) -> RunResult:
    """Runs steps up to train.steps (or `stop_after`, to simulate a stop). A given client is used and left
    running; otherwise one is deployed for cfg and shut down at the end."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    t_start = time.perf_counter()
    recipe = importlib.import_module(f"recipes.{cfg.recipe.name}")
    examples = recipe.load_examples("train", **cfg.recipe.options)
    if not examples:
        raise ConfigError(f"recipe {cfg.recipe.name!r} returned no train examples for options {cfg.recipe.options}")
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    own_client = client is None
    client = client or create_arctic_rl_client(cfg.client_config())
    sleep = EngineSleep(client, cfg)
    sleep.wake_all()  # a given client may come from a run that stopped mid-step with engines asleep
    ckpt_root = cfg.checkpoint_dir
    ckpt_root.mkdir(parents=True, exist_ok=True)
    resume = resume_path(cfg)
    state = load_checkpoint(client, resume) if resume else LoopState()
    num_gpus = client.config.training_gpus + (
        0 if client.config.colocate else client.config.sampling_gpus + client.config.log_prob_gpus
    )
    tracker = open_tracker(cfg, state.run_id, None if state.run_id else run_setup(cfg, client, num_gpus))
    state.run_id = tracker.run_id
    tracker.set_tags(tracking.placement_tags(client.health()))
    flush_metrics(tracker, state)
    last = min(cfg.train.steps, stop_after or cfg.train.steps)

    sampling = {
        "n": cfg.sampling.n,
        "max_tokens": cfg.sampling.max_tokens,
        "temperature": cfg.sampling.temperature,
        "top_p": cfg.sampling.top_p,
        "stop": list(cfg.sampling.stop),
    }

    def make_request(step: int) -> Request:
        exs = [examples[i] for i in step_indices(step, len(examples), cfg.train.prompts_per_step, cfg.seed)]
        return [prompt_ids(tokenizer, ex) for ex in exs], {**sampling, "seed": step_seed(cfg.seed, step)}, exs

    rollouts = (
        AsyncRollouts(client, make_request, cfg.async_.max_staleness, last)
        if cfg.async_.enable
        else SyncRollouts(client, make_request)
    )
    eval_options = stage_options(cfg, cfg.eval.options)
    eval_examples = recipe.load_examples(cfg.eval.split, **eval_options) if cfg.eval.split else []
    eval_examples = eval_examples[: cfg.eval.limit] if cfg.eval.limit else eval_examples
    evals: dict[int, EvalResult] = {}

    def run_eval(step: int) -> None:
        """step -1 = the model before the SFT warm-up (logged at step 0 as eval/*_before_sft)."""
        if not eval_examples or step in evals:
            return
        r = evaluate(client, recipe, eval_examples, tokenizer, cfg)
        evals[step] = r
        suffix = "_before_sft" if step < 0 else ""
        tracker.log_metrics(
            {
                f"eval/accuracy{suffix}": r.accuracy,
                f"eval/reward/mean{suffix}": r.reward_mean,
                f"timing_s/eval{suffix}": r.seconds,
            },
            step=max(step, 0),
        )
        if not quiet:
            when = "before the sft warm-up" if step < 0 else f"after step {step}"
            print(
                f"eval ({cfg.eval.split}, {r.num_examples} examples, greedy) {when}: "
                f"accuracy {r.accuracy:.1%}, reward {r.reward_mean:.3f} ({r.seconds:.0f}s)",
                flush=True,
            )

    history: list[dict[str, float]] = []

    def before_sync() -> None:
        rollouts.before_sync()
        sleep.before_sync()

    status = "FAILED"
    bar = tqdm(
        range(state.step + 1, last + 1),
        desc=f"arctic-rl {cfg.recipe.name}",
        unit="step",
        disable=quiet,
        initial=state.step,
        total=last,
    )
    try:
        if cfg.sft_warmup.epochs and state.step == 0:  # a resumed run's checkpoint already holds the warm-up
            run_eval(-1)
            sft_warmup(cfg, client, recipe, tokenizer, pad_id, tracker, quiet)
        run_eval(state.step)
        for step in bar:
            t0 = time.perf_counter()
            sleep.before_gen()
            rollout = rollouts.get(step)
            sleep.after_gen()
            metrics = train_step(cfg, client, recipe, rollout, pad_id, before_sync)
            metrics[tracking.TIMING_STEP] = time.perf_counter() - t0
            tokens = metrics[tracking.PERF_TOTAL_NUM_TOKENS] = metrics.pop("_num_tokens")
            metrics[tracking.PERF_THROUGHPUT] = tokens / metrics[tracking.TIMING_STEP] / num_gpus
            state.step = step
            state.rewards.append(metrics[tracking.REWARD_MEAN])
            history.append(metrics)
            if not cfg.checkpoint.every:
                tracker.log_metrics(metrics, step=step)
            else:
                state.unlogged[step] = metrics
                if step % cfg.checkpoint.every == 0 or step == cfg.train.steps:
                    save_checkpoint(client, ckpt_root, state)
                    flush_metrics(tracker, state)
            bar.set_postfix(reward=f"{metrics[tracking.REWARD_MEAN]:.3f}")
            if not quiet:
                bar.write(_step_line(step, cfg.train.steps, metrics))
            if cfg.eval.every and step % cfg.eval.every == 0:
                run_eval(step)
        sleep.wake_all()  # the client is left as it was given: every engine awake
        if state.step >= cfg.train.steps:
            run_eval(state.step)
        status = "FINISHED" if state.step >= cfg.train.steps else "KILLED"
    finally:
        rollouts.close()
        bar.close()
        tracker.end(status)
        if own_client:
            client.shutdown()
    plot = plot_rewards(state.rewards, ckpt_root / "reward_curve.png", title=cfg.recipe.name)
    result = RunResult(
        history,
        state.rewards,
        tracker.run_id,
        ckpt_root,
        time.perf_counter() - t_start,
        plot,
        {k: v.accuracy for k, v in evals.items()},
    )
    if not quiet:
        print(summary_line(result), flush=True)
    return result


def actor_loss_config(cfg: RunConfig) -> dict:
    """The loss config the loop trains with: the run's, plus what sampling implies."""
    loss_config = dict(cfg.loss.config)
    # logits / T, as the sampler drew them; greedy sampling (T=0) has no such distribution: T=1
    loss_config.setdefault("temperature", cfg.sampling.temperature or 1.0)
    if cfg.async_.enable:
        loss_config.setdefault("rollout_is", "token")  # decoupled PPO: weight by pi_prox / pi_behaviour
    return loss_config


def _step_line(step: int, total: int, m: dict[str, float]) -> str:
    phases = " ".join(
        f"{p} {m[tracking.TIMING_PREFIX + p]:.2f}s" for p in tracking.PHASES if tracking.TIMING_PREFIX + p in m
    )
    loss = m.get("actor/pg_loss", float("nan"))
    return (
        f"step {step}/{total} | reward {m[tracking.REWARD_MEAN]:.3f} | len {m[tracking.RESPONSE_LENGTH_MEAN]:.1f}"
        f" | pg_loss {loss:+.4f} | {phases} | {m[tracking.PERF_THROUGHPUT]:.0f} tok/s/gpu"
    )


def summary_line(r: RunResult) -> str:
    first, last = r.rewards[:5], r.rewards[-5:]
    mean = lambda xs: float(np.mean(xs)) if xs else float("nan")  # noqa: E731
    ev = ""
    if len(r.eval_accuracy) >= 2:
        label = lambda s: "before sft" if s < 0 else f"step {s}"  # noqa: E731
        ev = "eval accuracy " + " -> ".join(f"{label(s)} {a:.1%}" for s, a in sorted(r.eval_accuracy.items())) + " | "
    return (
        f"arctic-rl: {len(r.rewards)} steps | reward first-5 {mean(first):.3f} -> last-5 {mean(last):.3f} | {ev}"
        f"wall {r.wall_s:.1f}s | mlflow run {r.run_id} | checkpoints {r.checkpoint_dir}"
        + (f" | curve {r.plot}" if r.plot else "")
    )


def plot_rewards(rewards: list[float], path: Path, title: str = "") -> Path | None:
    if not rewards:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(rewards) + 1), rewards, marker="o", ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel(tracking.REWARD_MEAN)
    ax.set_title(f"reward curve {title}".strip())
    ax.grid(alpha=0.3)
    return tracking.save_figure(fig, path)
