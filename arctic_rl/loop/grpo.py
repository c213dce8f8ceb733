"""The reference GRPO loop: a recipe run on arctic-rl's public client ops, step by timed step.

    arctic-rl run tests/configs/tiny_loop.yaml model.name_or_path=/path/to/model
    # or: from arctic_rl.loop import run; run(load_run_config(path, overrides))

One step (verl's phase names, logged as timing_s/<phase>):
  gen            take prompts_per_step examples (a seeded order, reshuffled each epoch), apply the chat
                 template to `messages` + `assistant_prefix`, sample n responses each (seed from (seed, step))
  reward         recipe.reward(assistant_prefix + text, example), in a process pool (arctic_rl.rewards),
                 plus DAPO's overlong punishment (overlong.buffer_len); with filter_groups.enable, groups whose
                 rewards are all equal are dropped and more prompts drawn (arctic_rl.rollout.dynamic)
  adv            GRPO / Dr.GRPO / RLOO over each prompt's group (arctic_rl.advantages)
  old_log_prob   the trainer's log-probs of the samples (PPO's pi_old; in async mode the proximal policy),
                 and their mismatch with the sampler's, logged as verl's rollout_corr/ metrics
                 (arctic_rl.losses.mismatch), sync and async
  ref            the reference model's log-probs, only when the loss has a KL term (else not logged)
  update_actor   ppo_epochs x mini-batches (whole prompt groups, in order): forward_backward + optimizer_step
  update_weights sync_weights: trainer -> sampler
Colocated engines (backend.colocate, sync loop, sleep_engines): the trainer and reference sleep during gen,
the sampler sleeps (vLLM level 2: the sync reloads its weights) from the end of gen until just before
update_weights (which needs both awake), so on CUDA each side gives the other its device memory
(arctic_rl.server.controller's sleep/wake ops; arctic_rl.client.sleep.EngineSleep).
Checkpoints (checkpoint.every): <dir>/step_K after every K steps and the last; resume is exact in sync mode:
the data order and sampling seeds are functions of (seed, step), and the sampler gets the resumed weights.
Eval (eval.split): before step 1, every eval.every steps and after the last step.
SFT warm-up (sft_warmup.epochs > 0, fresh runs only): eval, supervised passes, sync, then the GRPO steps above.

The stages and the saved state live beside this file (arctic_rl/loop/):
  data.py        data order and sampling seeds (pure functions of (seed, step)), prompt tokens
  state.py       checkpoints: LoopState, RNG states, loop_state.json written last and atomically
  evaluation.py  greedy eval on a held-out split (eval/accuracy, eval/reward/mean)
  sft.py         the SFT warm-up stage
and beside the package:
  tracking.py    MLflow metric names, the Tracker, the reward-curve plot
Departures from verl: mini-batches are not reshuffled between PPO epochs; no critic.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from arctic_rl import advantages, tracking
from arctic_rl.batch import from_samples, group_rows, select_rows
from arctic_rl.chat import ObservationTemplate
from arctic_rl.client.client import ArcticRLClient, create_arctic_rl_client
from arctic_rl.client.sleep import EngineSleep
from arctic_rl.envs import make_env
from arctic_rl.errors import ConfigError
from arctic_rl.loop.data import fit_window, prompt_ids, step_indices, step_seed
from arctic_rl.loop.evaluation import LoopEvals
from arctic_rl.loop.sft import sft_warmup
from arctic_rl.loop.state import LoopState, flush_metrics, load_checkpoint, resume_path, save_checkpoint
from arctic_rl.losses.mismatch import mismatch_metrics
from arctic_rl.rewards import score_all
from arctic_rl.rollout import dynamic
from arctic_rl.rollout.multiturn import play
from arctic_rl.rollout.partial import PartialRollouts
from arctic_rl.rollout.pipeline import AsyncRollouts, Request, Rollout, Sample, SyncRollouts
from arctic_rl.runconfig import RunConfig


@dataclass
class RunResult:
    history: list[dict[str, float]]  # the metrics of each step run by this call
    rewards: list[float]  # critic/rewards/mean of every step so far (across resumes)
    run_id: str
    checkpoint_dir: Path
    wall_s: float
    plot: Path | None = None
    eval_accuracy: dict[int, float] = field(default_factory=dict)  # step (0 = before GRPO, -1 = before sft) -> acc


# -- tracking ------------------------------------------------------------------------------------------------


def _max_prompt_length(max_seq_len: int | None, max_tokens: int) -> str:
    # None: vLLM takes the model's own window, which this side does not know.
    return str(max_seq_len - max_tokens) if max_seq_len is not None else "model window"


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
        tracking.TAG_MAX_PROMPT_LENGTH: _max_prompt_length(
            client.config.vllm_config.max_seq_len, cfg.sampling.max_tokens
        ),
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


def actor_loss_config(cfg: RunConfig) -> dict:
    """The loss config the loop trains with: the run's, plus what sampling implies."""
    loss_config = dict(cfg.loss.config)
    # logits / T, as the sampler drew them; greedy sampling (T=0) has no such distribution: T=1
    loss_config.setdefault("temperature", cfg.sampling.temperature or 1.0)
    if cfg.async_.enable:
        loss_config.setdefault("rollout_is", "token")  # decoupled PPO: weight by pi_prox / pi_behaviour
    return loss_config


def step_mismatch(cfg: RunConfig, batch: dict, rollout: Rollout) -> dict[str, float]:
    """The step's training-inference mismatch (arctic_rl.losses.mismatch: verl's rollout_corr/ off-policy
    metrics, the ratio and the staleness histogram), from the trainer's old log-probs and the sampler's. A row's
    staleness is the policy versions between its sampler and the trainer: 0 in sync mode, up to
    async.max_staleness (the groups of a dynamic-sampling step may come from different versions)."""
    staleness = [rollout.step - 1 - v for v in rollout.row_versions(cfg.sampling.n)]
    return mismatch_metrics(
        batch["old_log_probs"],
        batch["rollout_log_probs"],
        batch["response_mask"],
        threshold=actor_loss_config(cfg).get("rollout_is_threshold", 2.0),
        staleness_B=torch.tensor(staleness),
        max_staleness=cfg.async_.max_staleness if cfg.async_.enable else 0,
    )


def make_sampler(cfg: RunConfig, client: ArcticRLClient, tokenizer) -> Sample:
    """How the loop gets a request's samples: one generate call, or (env.name) one conversation per sample with
    the recipe's environment, token in / token out (arctic_rl.rollout.multiturn), its reward in the sample."""
    if cfg.env.name is None:
        return lambda prompts, params, examples: client.generate(prompts, params)
    e = cfg.env
    template = ObservationTemplate(tokenizer, e.observation_role)
    window = client.config.vllm_config.max_seq_len

    def episodes(prompts: list[list[int]], params: dict, examples: list[dict]) -> list[dict]:
        return play(
            client.generate,
            prompts,
            params,
            examples,
            lambda: make_env(str(e.name), e.options, allow_unsandboxed_code=e.allow_unsandboxed_code),
            template,
            lambda ids: str(tokenizer.decode(ids)),
            max_turns=e.max_turns,
            max_response_tokens=e.max_response_tokens,
            window=window,
        )

    return episodes


def score(cfg: RunConfig, recipe, examples: list[dict], samples: list[dict]) -> list[float]:
    """The recipe's reward of each sample (n per example, prompt-major), plus DAPO's soft overlong punishment
    when overlong.buffer_len is set (arctic_rl.rollout.dynamic). Multi-turn (env.name): the environment's
    reward at the end of each episode."""
    if cfg.env.name is not None:
        return [float(s["reward"]) for s in samples]
    n = cfg.sampling.n
    completions = [
        ex.get("assistant_prefix", "") + s["text"]
        for i, ex in enumerate(examples)
        for s in samples[i * n : (i + 1) * n]
    ]
    scores = score_all(recipe.reward, completions, [ex for ex in examples for _ in range(n)])
    o = cfg.overlong
    penalty = dynamic.overlong_penalty(
        [len(s["token_ids"]) for s in samples], cfg.sampling.max_tokens, o.buffer_len, o.penalty_factor
    )
    return [float(x) + p for x, p in zip(scores, penalty)]


def gather(
    cfg: RunConfig, client: ArcticRLClient, recipe, rollout: Rollout, make_request, sample: Sample | None = None
) -> tuple[Rollout, list[float], dict[str, float]]:
    """The step's rollout and its scores; with filter_groups.enable, only groups with signal, drawing more
    batches while too few have it (arctic_rl.rollout.dynamic). Returns (rollout, scores, metrics: the time
    spent generating and scoring, and what the filter saw)."""
    t0 = time.perf_counter()
    scores = score(cfg, recipe, rollout.examples, rollout.samples)
    m = {"gen": rollout.wait_s, "reward": time.perf_counter() - t0}
    if cfg.env.name is not None:  # multi-turn: model turns per conversation
        m["env/num_turns/mean"] = float(np.mean([s["num_turns"] for s in rollout.samples]))
        sent = sum(s["prompt_tokens_sent"] for s in rollout.samples)  # vLLM's prefix cache, turns 2+ above all
        m["env/prefix_cache_hit_rate"] = sum(s["prompt_tokens_cached"] for s in rollout.samples) / max(sent, 1)
    if not cfg.filter_groups.enable:
        return rollout, scores, m

    def draw(d: int) -> dynamic.Draw:
        prompts, params, examples = make_request(rollout.step, d)
        t0 = time.perf_counter()
        samples = sample(prompts, params, examples) if sample else client.generate(prompts, params)
        t1 = time.perf_counter()
        extra = dynamic.Draw(examples, samples, score(cfg, recipe, examples, samples), version=rollout.step - 1)
        m["gen"] += t1 - t0
        m["reward"] += time.perf_counter() - t1
        return extra

    first = dynamic.Draw(rollout.examples, rollout.samples, scores, rollout.version)
    f = dynamic.fill_groups(
        first, draw, cfg.train.prompts_per_step, cfg.sampling.n, cfg.filter_groups.max_num_gen_batches
    )
    m.update(
        {
            "train/num_gen_batches": f.gen_batches,
            "dynamic/groups_drawn": f.groups_drawn,
            "dynamic/groups_with_signal": f.groups_with_signal,
            "dynamic/groups_trained": len(f.examples),
        }
    )
    rollout = replace(rollout, examples=f.examples, samples=f.samples, group_versions=f.group_versions)
    return rollout, f.scores, m


def mask_truncated(cfg: RunConfig, batch: dict, samples: list[dict]) -> torch.Tensor:
    """With overlong.filter, no loss on a response cut at max_tokens (its reward stayed in its group's
    baseline). Returns which rows were cut, filtered or not."""
    cut = torch.tensor(dynamic.truncated(samples), dtype=torch.bool)
    if cfg.overlong.filter:
        batch["response_mask"][cut] = 0
    return cut


def train_step(
    cfg: RunConfig,
    client: ArcticRLClient,
    rollout: Rollout,
    scores: list[float],
    gathered: dict[str, float],
    pad_id: int,
    before_sync,
    after_sync=lambda: None,
) -> dict[str, float]:
    n = cfg.sampling.n
    t = {k: gathered[k] for k in ("gen", "reward")}
    scores_B = torch.tensor(scores)
    t0 = time.perf_counter()
    uids = [f"{rollout.step}-{i // n}" for i in range(len(rollout.samples))]
    batch = from_samples(rollout.samples, uids, pad_token_id=pad_id)
    batch["advantages"] = compute_advantages(cfg, scores_B, uids)
    lengths = batch["response_mask"].float().sum(-1)
    cut = mask_truncated(cfg, batch, rollout.samples)
    t["adv"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    # Rollout, old and reference log-probs and the loss all use the sampling distribution (as verl does).
    temperature = actor_loss_config(cfg)["temperature"]
    batch["old_log_probs"] = client.log_probs(batch, temperature=temperature)["log_probs"]
    t["old_log_prob"] = time.perf_counter() - t0
    mismatch = step_mismatch(cfg, batch, rollout)
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
                if k.startswith(("actor/", "rollout_corr/", "router_replay/", "router/")):
                    actor.setdefault(k, []).append(float(v))
    t["update_actor"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    before_sync()  # async: rollouts in flight finish on the weights they started (partial: the chunk in flight)
    client.sync_weights()
    after_sync()  # partial rollouts: unfinished samples continue under the new weights
    t["update_weights"] = time.perf_counter() - t0

    metrics = {f"{tracking.TIMING_PREFIX}{k}": v for k, v in t.items()}
    metrics.update({k: v for k, v in gathered.items() if k not in t})
    metrics["response_length/clip_ratio"] = float(cut.float().mean())  # verl's name: the share cut at max_tokens
    metrics.update(mismatch)
    metrics.update({k: float(np.mean(v)) for k, v in actor.items()})
    metrics[tracking.REWARD_MEAN] = float(scores_B.mean())
    metrics[tracking.RESPONSE_LENGTH_MEAN] = float(lengths.mean())
    metrics["async/staleness"] = float(rollout.step - 1 - rollout.version)
    if "rollout_policy_version" in batch:  # partial rollouts: how many rows mix tokens of several versions
        v = batch["rollout_policy_version"].masked_fill(batch["rollout_policy_version"] < 0, 2**62)
        oldest, newest = v.min(-1).values, batch["rollout_policy_version"].max(-1).values
        metrics["async/partial_fraction"] = float((newest > oldest).float().mean())
    metrics["async/gen_s"] = rollout.gen_s
    metrics["_num_tokens"] = float(batch["attention_mask"].sum())
    return metrics


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

    client_config = client.config if client is not None else cfg.client_config()
    window = client_config.vllm_config.max_seq_len
    examples, dropped = fit_window(examples, tokenizer, window)
    if not examples:
        raise ConfigError(
            f"every train example's prompt has vllm_config.max_seq_len={window} tokens or more: raise it "
            f"(within the model's window) or shorten the prompts"
        )
    if cfg.model.dtype == "auto" and not quiet:
        print(f"arctic-rl: model.dtype auto -> {client_config.training_config.dtype} on this machine", flush=True)
    if dropped and not quiet:
        print(
            f"arctic-rl: left out {dropped} of {len(examples) + dropped} train examples whose prompt has "
            f"vllm_config.max_seq_len={window} tokens or more"
        )
    own_client = client is None
    client = client or create_arctic_rl_client(client_config)
    if cfg.use_reference and not client.config.use_reference:
        raise ConfigError(
            "the run's loss uses the reference model (KL term or reference.enable=true), but the given "
            "deployment has none (use_reference=False)"
        )
    sleep = EngineSleep(
        client, cfg.use_reference, enabled=cfg.sleep_engines and client.config.colocate and not cfg.async_.enable
    )
    sleep.wake_all()  # a given client may come from a run that stopped mid-step with engines asleep
    ckpt_root = cfg.checkpoint_dir
    ckpt_root.mkdir(parents=True, exist_ok=True)
    resume = resume_path(cfg)
    state = load_checkpoint(client, resume) if resume else LoopState()
    num_gpus = client.config.gpu_count
    tracker = open_tracker(cfg, state.run_id, None if state.run_id else run_setup(cfg, client, num_gpus))
    state.run_id = tracker.run_id
    placement = tracking.placement_tags(client.health())
    tracker.set_tags(placement)
    print(f"[arctic-rl] placement: {placement['placement']}", flush=True)
    if resume:
        say_resumed(tracker, state.step, resume)
    flush_metrics(tracker, state)
    last = min(cfg.train.steps, stop_after or cfg.train.steps)

    sampling = {
        "n": cfg.sampling.n,
        "max_tokens": cfg.sampling.max_tokens,
        "temperature": cfg.sampling.temperature,
        "top_p": cfg.sampling.top_p,
        "stop": list(cfg.sampling.stop),
    }

    def make_request(step: int, draw: int = 0) -> Request:
        per_step = cfg.train.prompts_per_step
        exs = [examples[i] for i in step_indices(step, len(examples), per_step, cfg.seed, draw)]
        return [prompt_ids(tokenizer, ex) for ex in exs], {**sampling, "seed": step_seed(cfg.seed, step, draw)}, exs

    sample = make_sampler(cfg, client, tokenizer)
    a = cfg.async_
    rollouts: SyncRollouts | AsyncRollouts | PartialRollouts
    if a.enable and a.partial_rollouts:
        rollouts = PartialRollouts(
            client,
            make_request,
            a.max_staleness,
            last,
            a.chunk_tokens,
            a.stale,
            decode=lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True)),
        )
    elif a.enable:
        rollouts = AsyncRollouts(client, make_request, a.max_staleness, last)
    else:
        rollouts = SyncRollouts(client, make_request, sample)
    evals = LoopEvals(cfg, client, recipe, tokenizer, tracker, quiet, sample)
    history: list[dict[str, float]] = []

    def before_sync() -> None:
        rollouts.before_sync()
        sleep.before_sync()

    def after_sync() -> None:
        rollouts.after_sync()

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
            evals.run(-1)
            sft_warmup(cfg, client, recipe, tokenizer, pad_id, tracker, quiet)
        evals.run(state.step)
        for step in bar:
            t0 = time.perf_counter()
            sleep.before_gen()
            rollout, scores, gathered = gather(cfg, client, recipe, rollouts.get(step), make_request, sample)
            sleep.after_gen()
            metrics = train_step(cfg, client, rollout, scores, gathered, pad_id, before_sync, after_sync)
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
                sys.stdout.flush()  # a job's log is a file: a preempted attempt must not lose the steps it ran
            if cfg.eval.every and step % cfg.eval.every == 0:
                evals.run(step)
        sleep.wake_all()  # the client is left as it was given: every engine awake
        if state.step >= cfg.train.steps:
            evals.run(state.step)
        status = "FINISHED" if state.step >= cfg.train.steps else "KILLED"
    finally:
        rollouts.close()
        bar.close()
        tracker.end(status)
        if own_client:
            client.shutdown()
    plot = tracking.plot_rewards(
        state.rewards, ckpt_root / "reward_curve.png", title=cfg.recipe.name, evals=evals.accuracy()
    )
    result = RunResult(
        history,
        state.rewards,
        tracker.run_id,
        ckpt_root,
        time.perf_counter() - t_start,
        plot,
        evals.accuracy(),
    )
    if not quiet:
        print(summary_line(result), flush=True)
    return result


def say_resumed(tracker: tracking.Tracker, step: int, checkpoint: Path) -> None:
    """Says that this run continues from a checkpoint, in its output and on its MLflow run: a requeued job
    that started from scratch instead would log the same steps (they are de-duplicated against MLflow)."""
    tracker.set_tags({tracking.TAG_RESUMED_FROM_STEP: str(step)})
    print(f"arctic-rl: resumed from step {step} ({checkpoint})", flush=True)


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
