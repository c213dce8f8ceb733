"""Eval in the reference loop (eval.split): greedy decoding on a held-out split before step 1, every
eval.every steps and after the last step; eval/accuracy is the share of examples whose reward is >= 1 (the
recipe's full-credit answer). With an SFT warm-up, the model before it is evaluated too (eval/*_before_sft).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from arctic_rl import tracking
from arctic_rl.client.client import ArcticRLClient
from arctic_rl.loop.data import prompt_ids
from arctic_rl.rewards import score_all
from arctic_rl.rollout.pipeline import Sample
from arctic_rl.runconfig import RunConfig


@dataclass
class EvalResult:
    accuracy: float
    reward_mean: float
    num_examples: int
    seconds: float
    completions: list[str]  # what the reward scored: the example's assistant_prefix + the generated text


def evaluate(
    client: ArcticRLClient, recipe, examples: list[dict], tokenizer, cfg: RunConfig, sample: Sample | None = None
) -> EvalResult:
    """Greedy decoding over `examples`; accuracy = share whose reward reaches full credit (>= 1). With
    `sample` (multi-turn: the loop's make_sampler) greedy episodes, scored by their environment."""
    t0 = time.perf_counter()
    params = {
        "n": 1,
        "max_tokens": cfg.eval.max_tokens or cfg.sampling.max_tokens,
        "temperature": 0.0,
        "stop": list(cfg.sampling.stop),
    }
    prompts = [prompt_ids(tokenizer, ex) for ex in examples]
    if sample is not None and cfg.env.name is not None:
        samples = sample(prompts, params, examples)
        completions = [s["text"] for s in samples]
        rewards = [float(s["reward"]) for s in samples]
    else:
        samples = client.generate(prompts, params)
        completions = [ex.get("assistant_prefix", "") + s["text"] for s, ex in zip(samples, examples)]
        rewards = score_all(recipe.reward, completions, examples)
    return EvalResult(
        float(np.mean([r >= 1.0 for r in rewards])),
        float(np.mean(rewards)),
        len(examples),
        time.perf_counter() - t0,
        completions,
    )


class LoopEvals:
    """The run's evals: loads the eval split once (none without eval.split), evaluates at the steps the loop
    asks for, each step at most once, and logs eval/* to MLflow."""

    def __init__(
        self,
        cfg: RunConfig,
        client: ArcticRLClient,
        recipe,
        tokenizer,
        tracker: tracking.Tracker,
        quiet: bool,
        sample: Sample | None = None,
    ):
        self.cfg, self.client, self.recipe, self.tokenizer, self.sample = cfg, client, recipe, tokenizer, sample
        self.tracker, self.quiet = tracker, quiet
        examples = recipe.load_examples(cfg.eval.split, **cfg.stage_options(cfg.eval.options)) if cfg.eval.split else []
        self.examples = examples[: cfg.eval.limit] if cfg.eval.limit else examples
        self.results: dict[int, EvalResult] = {}

    def run(self, step: int) -> None:
        """step -1 = the model before the SFT warm-up (logged at step 0 as eval/*_before_sft)."""
        if not self.examples or step in self.results:
            return
        r = evaluate(self.client, self.recipe, self.examples, self.tokenizer, self.cfg, self.sample)
        self.results[step] = r
        suffix = "_before_sft" if step < 0 else ""
        self.tracker.log_metrics(
            {
                f"eval/accuracy{suffix}": r.accuracy,
                f"eval/reward/mean{suffix}": r.reward_mean,
                f"timing_s/eval{suffix}": r.seconds,
            },
            step=max(step, 0),
        )
        if not self.quiet:
            when = "before the sft warm-up" if step < 0 else f"after step {step}"
            print(
                f"eval ({self.cfg.eval.split}, {r.num_examples} examples, greedy) {when}: "
                f"accuracy {r.accuracy:.1%}, reward {r.reward_mean:.3f} ({r.seconds:.0f}s)",
                flush=True,
            )

    def accuracy(self) -> dict[int, float]:
        return {step: r.accuracy for step, r in self.results.items()}
