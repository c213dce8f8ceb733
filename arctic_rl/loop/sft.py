"""The SFT warm-up stage of the reference loop (sft_warmup.epochs > 0, fresh runs only): supervised passes
over recipe.sft_completion(example) with the sft loss and the run's optimizer, then a weight sync, before
the GRPO steps. arctic_rl.loop runs it after an eval of the model before it (eval/*_before_sft).
"""

from __future__ import annotations

import time

import numpy as np

from arctic_rl import tracking
from arctic_rl.batch import from_samples
from arctic_rl.client.client import ArcticRLClient
from arctic_rl.errors import ConfigError
from arctic_rl.loop.data import epoch_order, prompt_ids
from arctic_rl.runconfig import RunConfig


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
    options = cfg.stage_options(w.options)
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
        order = epoch_order(cfg.seed + 7919, epoch, len(pairs))  # its own stream, not the GRPO order
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
