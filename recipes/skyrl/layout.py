"""skyrl-train (0.3.1) <-> arctic-rl batch layout.

SkyRL's trainer turns a `GeneratorOutput` (per-row `prompt_token_ids`, `response_ids`, `rewards`, `loss_masks`,
`rollout_logprobs`, and `uids` in the trainer) into a `TrainingInputBatch` with
`skyrl_train.dataset.preprocess.convert_prompts_responses_to_batch_tensors`: `sequences` = prompt left-padded to
the batch's longest prompt + response right-padded, `attention_mask`, `response_mask`/`loss_mask` [B, R], and
`metadata["response_length"] = R`, `metadata["uids"]`. Per-token outputs are the last R columns
(`action_log_probs`, `base_action_log_probs`, `advantages`). That is our layout under other names:

  SkyRL                                  arctic-rl
  sequences                              input_ids
  attention_mask                         attention_mask
  sequences[:, -response_length:]        responses
  loss_mask (else response_mask)         response_mask
  action_log_probs                       old_log_probs
  base_action_log_probs                  ref_log_prob
  advantages                             advantages
  rollout_logprobs                       rollout_log_probs
  metadata["uids"]                       uid
"""

from __future__ import annotations

from typing import Any

import torch

TO_ARCTIC = {
    "action_log_probs": "old_log_probs",
    "base_action_log_probs": "ref_log_prob",
    "advantages": "advantages",
    "rollout_logprobs": "rollout_log_probs",
}


def to_arctic(tib) -> dict[str, Any]:
    """A SkyRL TrainingInputBatch (a dict of tensors with `.metadata`) as an arctic-rl batch; tensors are shared."""
    meta = getattr(tib, "metadata", None) or {}
    R = int(meta.get("response_length") or tib["response_mask"].shape[1])
    seq = tib["sequences"]
    mask = tib.get("loss_mask")
    if mask is None:
        mask = tib["response_mask"]
    batch: dict[str, Any] = {
        "input_ids": seq,
        "attention_mask": tib["attention_mask"],
        "responses": seq[:, -R:],
        "response_mask": mask.long() if mask.dtype.is_floating_point else mask,
    }
    for src, dst in TO_ARCTIC.items():
        if tib.get(src) is not None:
            batch[dst] = tib[src]
    if meta.get("uids") is not None:
        batch["uid"] = [str(u) for u in meta["uids"]]
    return batch


def from_arctic(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """An arctic-rl batch under SkyRL's names (the tensors of a TrainingInputBatch; metadata separately)."""
    out = {
        "sequences": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "response_mask": batch["attention_mask"][:, -batch["responses"].shape[1] :],
        "loss_mask": batch["response_mask"],
    }
    for src, dst in TO_ARCTIC.items():
        if dst in batch:
            out[src] = batch[dst]
    return out


def samples_to_generator_output(samples: list[dict], rewards: list[float]) -> dict[str, Any]:
    """arctic-rl `generate` samples + per-row scores as a SkyRL GeneratorOutput (token-level rewards: the score
    on the last response token, as SkyRL's generator does)."""
    resp = [list(s["token_ids"]) for s in samples]
    return {
        "prompt_token_ids": [list(s["prompt_token_ids"]) for s in samples],
        "response_ids": resp,
        "rewards": [[0.0] * (len(r) - 1) + [float(sc)] if r else [] for r, sc in zip(resp, rewards)],
        "loss_masks": [[1] * len(r) for r in resp],
        "stop_reasons": [s.get("finish_reason", "stop") for s in samples],
        "rollout_metrics": None,
        "rollout_logprobs": [list(s.get("logprobs") or [0.0] * len(s["token_ids"])) for s in samples],
    }
