"""verl <-> arctic-rl batch layout.

verl 0.9.1 keeps a step's data as a `DataProto` in the same left/right padded layout as ours (`prompts`
[B, P] left-padded, `responses` [B, R] right-padded, `input_ids` = cat(prompts, responses),
`attention_mask`, `response_mask`, uid in `non_tensor_batch["uid"]`). Before calling a worker,
`RayPPOTrainer` converts it with `left_right_2_no_padding` into a TensorDict whose `input_ids` /
`position_ids` are jagged nested tensors (padding removed), keeps `prompts`, `responses`,
`attention_mask`, `response_mask` and the [B, R] float tensors padded, and reads the worker's per-token
outputs back with `no_padding_2_padding` (values over each sequence's real tokens, shifted by one).

  to_arctic(td_or_dataproto) -> our Batch     tensors are shared, not copied (input_ids is rebuilt only when
                                               verl holds it nested: one cat of prompts and responses)
  to_no_padding(x_BR, td) -> nested tensor    a [B, R] per-token output in the layout no_padding_2_padding reads
  samples_to_dataproto(...) -> DataProto      `generate` output in verl's rollout layout (prompts left-padded
                                               to prompt_length, responses right-padded to response_length)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

FLOAT_KEYS = ("old_log_probs", "advantages", "ref_log_prob", "rollout_log_probs")


def _get(td, key: str, default=None):
    from verl.utils import tensordict_utils as tu

    return tu.get(td, key, default)


def _uids(obj) -> list | None:
    if hasattr(obj, "non_tensor_batch"):  # DataProto
        uid = obj.non_tensor_batch.get("uid")
    else:
        uid = _get(obj, "uid")
    if uid is None:
        return None
    return [str(u) for u in (uid.tolist() if isinstance(uid, np.ndarray) else list(uid))]


def to_arctic(data) -> dict[str, Any]:
    """A verl DataProto (padded) or worker TensorDict (padded or no-padding) as an arctic-rl batch."""
    td = data.batch if hasattr(data, "non_tensor_batch") else data
    responses = td["responses"]
    input_ids = td["input_ids"] if "input_ids" in td.keys() else None
    if input_ids is None or input_ids.is_nested:
        input_ids = torch.cat([td["prompts"], responses], dim=1)
    batch: dict[str, Any] = {"input_ids": input_ids, "attention_mask": td["attention_mask"], "responses": responses}
    if "response_mask" in td.keys():
        batch["response_mask"] = td["response_mask"]
    else:
        batch["response_mask"] = td["attention_mask"][:, -responses.shape[1] :]
    pos = td["position_ids"] if "position_ids" in td.keys() else None
    if pos is not None and not pos.is_nested and pos.dim() == 2:
        batch["position_ids"] = pos
    for key in FLOAT_KEYS:
        if key in td.keys():
            batch[key] = td[key]
    uid = _uids(data)
    if uid is not None:
        batch["uid"] = uid
    return batch


def to_no_padding(x_BR: torch.Tensor, td) -> torch.Tensor:
    """The inverse of verl's `no_padding_2_padding` for a [B, R] per-token output: a jagged nested tensor with
    one row per sequence over its real (prompt + response) tokens, the response values at positions
    [prompt_len - 1, prompt_len - 1 + resp_len) (the model output that predicts each response token)."""
    P = td["prompts"].shape[1]
    mask = td["attention_mask"]
    prompt_lens = mask[:, :P].sum(1).tolist()
    resp_lens = mask[:, P:].sum(1).tolist()
    rows = []
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        row = x_BR.new_zeros(p + r)
        row[p - 1 : p - 1 + r] = x_BR[i, :r]
        rows.append(row)
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def samples_to_dataproto(
    samples: list[dict],
    prompt_length: int,
    response_length: int,
    pad_token_id: int,
    scores: list[float] | None = None,
    non_tensor: dict | None = None,
):
    """`generate` samples (one per row, in row order) in verl's rollout output layout, with `rm_scores`
    (the score on each row's last response token, where verl's agent loop puts it) when scores are given."""
    from verl import DataProto

    B = len(samples)
    P, R = prompt_length, response_length
    prompts = torch.full((B, P), pad_token_id, dtype=torch.long)
    responses = torch.full((B, R), pad_token_id, dtype=torch.long)
    pmask = torch.zeros(B, P, dtype=torch.long)
    rmask = torch.zeros(B, R, dtype=torch.long)
    rlp = torch.zeros(B, R, dtype=torch.float32)
    for i, s in enumerate(samples):
        p = list(s["prompt_token_ids"])[-P:]  # verl truncates prompts from the left ("left" truncation)
        r = list(s["token_ids"])[:R]
        prompts[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        pmask[i, P - len(p) :] = 1
        if r:
            responses[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            rmask[i, : len(r)] = 1
            if s.get("logprobs"):
                rlp[i, : len(r)] = torch.tensor(list(s["logprobs"])[: len(r)], dtype=torch.float32)
    attention_mask = torch.cat([pmask, rmask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": rmask,
        "rollout_log_probs": rlp,
    }
    if scores is not None:
        rm = torch.zeros(B, R, dtype=torch.float32)
        last = (rmask.sum(1) - 1).clamp(min=0)
        rm[torch.arange(B), last] = torch.tensor(scores, dtype=torch.float32)
        tensors["rm_scores"] = rm
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensor or {})


def dataproto_to_samples(data) -> list[dict]:
    """Rows of a verl rollout DataProto as `generate`-style samples (the inverse of samples_to_dataproto)."""
    td = data.batch
    P = td["prompts"].shape[1]
    mask = td["attention_mask"]
    out = []
    for i in range(td["prompts"].shape[0]):
        pm, rm = mask[i, :P].bool(), td["response_mask"][i].bool()
        out.append(
            {
                "prompt_token_ids": td["prompts"][i][pm].tolist(),
                "token_ids": td["responses"][i][rm].tolist(),
                "logprobs": td["rollout_log_probs"][i][rm].tolist() if "rollout_log_probs" in td.keys() else None,
            }
        )
    return out
