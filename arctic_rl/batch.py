"""The batch schema: one place that says what a batch is (verl's names and layout).

Shapes legend: B rows, T = P + R total columns, P prompt columns, R response columns.

  key              shape    dtype   meaning
  input_ids        [B, T]   int32/64 prompt left-padded to P, then response right-padded to R; ids < vocab
  attention_mask   [B, T]   int/bool 1 on real tokens (prompt and response), 0 on padding
  position_ids     [B, T]   int32/64 optional; default cumsum(attention_mask) - 1; in [0, max_seq_len)
  responses        [B, R]   int32/64 == input_ids[:, P:]
  response_mask    [B, R]   int/bool 1 on response tokens that count in the loss, else 0 (padding; multi-turn:
                                    the observation and template tokens between the model's turns)
  old_log_probs    [B, R]   float   log-probs of the policy that produced the data (PPO ratio)
  advantages       [B, R]   float   per-token advantages ([B] is accepted and broadcast)
  ref_log_prob     [B, R]   float   optional; reference policy log-probs (KL penalty)
  rollout_log_probs[B, R]   float   optional; sampler log-probs (decoupled / off-policy correction)
  weights          [B, R]   float   optional; per-token loss weights (the Tinker losses' cross_entropy)
  rollout_policy_version [B, R] int optional; the policy version that sampled each response token (partial
                                    rollouts, arctic_rl/rollout/partial.py); -1 on padding; no op reads it
  routed_experts   [B, T, L, k] int16/32/64 optional; per token and decoder layer, the k experts the sampler routed it
                                    to (router replay, arctic_rl/router_replay.py); -1 where none; L, k and the
                                    ids (< experts) the model's (BatchLimits.routing)
  uid              [B]      str     the prompt group of each row (a list of strings, or ints)

No other key is accepted; each row's tokens (prompt + response) are at most the deployment's max_seq_len, and
so are P and R (BatchLimits). Only the keys an op needs
are required: `log_probs` needs input_ids, attention_mask, responses
(and uid for ZoRRo); `forward_backward` also needs response_mask and what its loss reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from arctic_rl.errors import BatchFormatError

Batch = dict[str, Any]

FLOAT_KEYS = ("old_log_probs", "advantages", "ref_log_prob", "rollout_log_probs", "weights")
INT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "rollout_policy_version")
LOG_PROBS_KEYS = ("input_ids", "attention_mask", "responses")
TRAIN_KEYS = ("input_ids", "attention_mask", "responses", "response_mask")
MASK_KEYS = ("attention_mask", "response_mask")
ROUTING_KEY = "routed_experts"
ROUTING_DTYPES = (torch.int16, torch.int32, torch.int64)
KNOWN_KEYS = (*INT_KEYS, *FLOAT_KEYS, ROUTING_KEY, "uid")
# Token ids and positions index embeddings and rotary tables: a narrower dtype (bool, uint8) wraps or is read
# as a mask. Masks may be any integer or bool dtype (frameworks hand over their own), valued 0 or 1.
ID_DTYPES = (torch.int32, torch.int64)
MASK_DTYPES = (*ID_DTYPES, torch.int16, torch.int8, torch.uint8, torch.bool)


class BatchError(BatchFormatError):
    """A malformed batch: the message names the key, what it expected and what it got."""


@dataclass(frozen=True)
class BatchLimits:
    """What the deployment's model takes: token ids below `vocab`, at most `max_seq_len` columns (and
    positions below it). None: not known here (the check is skipped)."""

    vocab: int | None = None
    max_seq_len: int | None = None
    routing: RoutingShape | None = None  # the model's MoE routing, for routed_experts (router replay)


@dataclass(frozen=True)
class RoutingShape:
    """What `routed_experts` [B, T, layers, k] must fit: the model's decoder layers, the experts each token is routed
    to, and the experts an id may name ([0, experts); -1 for none). Names: the HF config keys they come from."""

    layers: int
    top_k: int
    experts: int
    layers_key: str = "num_hidden_layers"
    top_k_key: str = "num_experts_per_tok"
    experts_key: str = "num_experts"


def _shape(x) -> str:
    return str(list(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def validate_batch(
    batch: Batch, required: Iterable[str] = LOG_PROBS_KEYS, limits: BatchLimits | None = None
) -> tuple[int, int, int]:
    """Checks keys, dtypes, shapes and values against the schema above (and `limits`); returns (B, P, R).
    Raises BatchError naming the key, the value and what is allowed."""
    if not isinstance(batch, dict):
        raise BatchError(f"batch must be a dict of tensors, got {type(batch).__name__}")
    unknown = sorted(str(k)[:60] for k in batch if k not in KNOWN_KEYS)
    if unknown:
        raise BatchError(f"batch has unknown key(s) {unknown}; the schema's keys are {list(KNOWN_KEYS)}")
    for key in required:
        if key not in batch:
            raise BatchError(f"batch is missing key {key!r} (required: {sorted(required)}; got {sorted(batch)})")
    for key, val in batch.items():
        if key != "uid" and not isinstance(val, torch.Tensor):
            raise BatchError(f"batch[{key!r}] must be a tensor, got {type(val).__name__}")
    _check_dtypes(batch)
    ids = batch["input_ids"]
    if ids.dim() != 2:
        raise BatchError(f"batch['input_ids'] must be [B, T], got shape {_shape(ids)}")
    B, T = ids.shape
    resp = batch["responses"]
    if resp.dim() != 2 or resp.shape[0] != B or resp.shape[1] > T:
        raise BatchError(f"batch['responses'] must be [B={B}, R<=T={T}], got shape {_shape(resp)}")
    R = resp.shape[1]
    P = T - R
    if P < 1:
        raise BatchError(f"batch has no prompt columns: input_ids is [B, {T}] and responses is [B, {R}]")
    expect = {
        "attention_mask": (B, T),
        "position_ids": (B, T),
        "response_mask": (B, R),
        "old_log_probs": (B, R),
        "ref_log_prob": (B, R),
        "rollout_log_probs": (B, R),
        "weights": (B, R),
        "rollout_policy_version": (B, R),
    }
    for key, shape in expect.items():
        if key in batch and tuple(batch[key].shape) != shape:
            raise BatchError(f"batch[{key!r}] must have shape {list(shape)}, got {_shape(batch[key])}")
    if ROUTING_KEY in batch:
        routed = batch[ROUTING_KEY]
        if routed.dim() != 4 or tuple(routed.shape[:2]) != (B, T):
            raise BatchError(f"batch['routed_experts'] must be [B={B}, T={T}, layers, k], got shape {_shape(routed)}")
        if routed.numel() and int(routed.min()) < -1:
            raise BatchError(f"batch['routed_experts'] holds {int(routed.min())}: expert ids are >= 0, -1 for none")
        if limits is not None and limits.routing is not None:
            check_routing(routed, limits.routing)
    if "advantages" in batch and tuple(batch["advantages"].shape) not in ((B, R), (B,)):
        raise BatchError(f"batch['advantages'] must have shape [{B}, {R}] or [{B}], got {_shape(batch['advantages'])}")
    if not torch.equal(ids[:, P:], resp):
        raise BatchError("batch['responses'] must equal input_ids[:, P:] (prompt left-padded, then responses)")
    if "uid" in batch:
        uid = batch["uid"]
        n = len(uid) if isinstance(uid, (list, tuple)) else (uid.shape[0] if isinstance(uid, torch.Tensor) else -1)
        if n != B:
            raise BatchError(f"batch['uid'] must have one entry per row (B={B}), got {_shape(uid)} of length {n}")
    _check_values(batch, limits or BatchLimits())
    return B, P, R


def check_routing(routed: torch.Tensor, shape: RoutingShape, name: str = "batch['routed_experts']") -> None:
    """`routed` [..., layers, k] against the model's routing: its layer and top-k dimensions, and every expert id in
    [0, experts) or -1; a BatchError naming the field, the value and the bound. Before any router gathers an id: one
    past the experts fails the gather on CPU and is a device assert on CUDA (the trainer dead until restarted)."""
    L, k = routed.shape[-2], routed.shape[-1]
    if L != shape.layers:
        raise BatchError(
            f"{name} has {L} layers (dimension -2); the model has {shape.layers_key}={shape.layers}: the routing is "
            "another model's"
        )
    if k != shape.top_k:
        raise BatchError(
            f"{name} has {k} experts per token (dimension -1); the model routes each token to "
            f"{shape.top_k_key}={shape.top_k}"
        )
    if routed.numel() and int(routed.max()) >= shape.experts:
        at = [int(i) for i in (routed == routed.max()).nonzero()[0]]
        where = f"row {at[0]}, column {at[1]}, layer {at[2]}" if len(at) == 4 else f"index {at}"
        raise BatchError(
            f"{name} holds expert id {int(routed.max())} ({where}); the model has {shape.experts_key}="
            f"{shape.experts}: ids are in [0, {shape.experts}), -1 for none"
        )


def _check_dtypes(batch: Batch) -> None:
    for key, val in batch.items():
        if key in MASK_KEYS:
            allowed: tuple[torch.dtype, ...] = MASK_DTYPES
        elif key == ROUTING_KEY:
            allowed = ROUTING_DTYPES
        elif key in INT_KEYS:
            allowed = ID_DTYPES
        elif key in FLOAT_KEYS:
            if val.dtype.is_floating_point:
                continue
            raise BatchError(f"batch[{key!r}] must be a float tensor, got {val.dtype}")
        else:  # uid
            continue
        if val.dtype not in allowed:
            names = [str(d).removeprefix("torch.") for d in allowed]
            raise BatchError(f"batch[{key!r}] must be an integer tensor of dtype {names}, got {val.dtype}")


def _range(batch: Batch, key: str, hi: int | None, what: str) -> None:
    """batch[key]'s values within [0, hi) (hi None: >= 0 only), else a BatchError naming the limit."""
    x = batch.get(key)
    if x is None or not x.numel():
        return
    lo_v, hi_v = int(x.min()), int(x.max())
    if lo_v < 0 or (hi is not None and hi_v >= hi):
        bound = f"[0, {hi})" if hi is not None else ">= 0"
        raise BatchError(f"batch[{key!r}] holds values outside {bound} ({what}): min {lo_v}, max {hi_v}")


def _check_values(batch: Batch, limits: BatchLimits) -> None:
    # Each row (its prompt plus its response) fits the model's window. The columns may not: prompts are
    # left-padded to the longest prompt and responses right-padded to the longest response, which may be
    # other rows', so P and R are each bounded by max_seq_len and T only by twice it.
    cap = limits.max_seq_len
    if cap is not None:
        T, R = batch["input_ids"].shape[1], batch["responses"].shape[1]
        for what, n in (("prompt", T - R), ("response", R)):
            if n > cap:
                raise BatchError(
                    f"batch['input_ids'] has {n} {what} columns; the deployment takes at most "
                    f"vllm_config.max_seq_len={cap} (shorten the sequences or raise max_seq_len)"
                )
        if "attention_mask" in batch and batch["attention_mask"].numel():
            lengths = batch["attention_mask"].to(torch.int64).sum(-1)
            row = int(lengths.argmax())
            if int(lengths[row]) > cap:
                raise BatchError(
                    f"batch['input_ids'] row {row} has {int(lengths[row])} tokens (attention_mask); the deployment takes at most "
                    f"vllm_config.max_seq_len={cap} (shorten the sequences or raise max_seq_len)"
                )
    _range(batch, "input_ids", limits.vocab, f"token ids below the model's vocabulary of {limits.vocab}")
    _range(batch, "position_ids", limits.max_seq_len, f"positions below vllm_config.max_seq_len={limits.max_seq_len}")
    for key in MASK_KEYS:
        _range(batch, key, 2, "a mask is 0 or 1")
    for key in FLOAT_KEYS:
        if key in batch and not torch.isfinite(batch[key]).all():
            raise BatchError(f"batch[{key!r}] contains NaN or inf")


def position_ids(batch: Batch) -> torch.Tensor:
    if batch.get("position_ids") is not None:
        return batch["position_ids"]
    return (batch["attention_mask"].long().cumsum(-1) - 1).clamp(min=0)


def uids(batch: Batch) -> list:
    """The prompt group of every row; rows without a uid are each their own group."""
    uid = batch.get("uid")
    if uid is None:
        return list(range(batch["input_ids"].shape[0]))
    return uid.tolist() if isinstance(uid, torch.Tensor) else list(uid)


def group_rows(batch: Batch) -> list[list[int]]:
    """Row indices grouped by uid, groups in order of first appearance."""
    groups: dict[Any, list[int]] = {}
    for i, u in enumerate(uids(batch)):
        groups.setdefault(u, []).append(i)
    return list(groups.values())


def select_rows(batch: Batch, rows: list[int]) -> Batch:
    idx = torch.tensor(rows, dtype=torch.long)
    out: Batch = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch["input_ids"].shape[0]:
            out[k] = v.index_select(0, idx)
        elif isinstance(v, (list, tuple)):
            out[k] = [v[i] for i in rows]
        else:
            out[k] = v
    return out


def split_micro_batches(batch: Batch, max_rows: int) -> list[list[int]]:
    """Row lists of at most `max_rows` rows each, never splitting a prompt group (ZoRRo needs
    whole groups; a group larger than max_rows becomes its own micro-batch)."""
    if max_rows < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {max_rows}")
    out: list[list[int]] = []
    cur: list[int] = []
    for g in group_rows(batch):
        if cur and len(cur) + len(g) > max_rows:
            out.append(cur)
            cur = []
        cur = cur + g
    if cur:
        out.append(cur)
    return out


def from_samples(samples: list[dict], uids: list, pad_token_id: int = 0) -> Batch:
    """A verl-layout batch from `generate` samples: prompts left-padded, responses right-padded.
    Adds `rollout_log_probs` (the sampler's log-probs) and `uid`; the caller adds advantages etc. A sample's
    `loss_mask` (multi-turn, arctic_rl.rollout.multiturn) zeroes response_mask on its observation tokens."""
    if len(samples) != len(uids):
        raise BatchError(f"got {len(samples)} samples but {len(uids)} uids")
    P = max(len(s["prompt_token_ids"]) for s in samples)
    R = max(1, max(len(s["token_ids"]) for s in samples))
    B = len(samples)
    ids = torch.full((B, P + R), pad_token_id, dtype=torch.long)
    attn = torch.zeros(B, P + R, dtype=torch.long)
    rlp = torch.zeros(B, R)
    # Partial rollouts: the policy version that produced each response token (-1: padding).
    versions = torch.full((B, R), -1, dtype=torch.long) if any("token_versions" in s for s in samples) else None
    masks: list[tuple[int, torch.Tensor]] = []
    for i, s in enumerate(samples):
        p, r = s["prompt_token_ids"], s["token_ids"]
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) : P] = 1
        if r:
            ids[i, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
            attn[i, P : P + len(r)] = 1
            if s.get("logprobs"):
                rlp[i, : len(r)] = torch.tensor(s["logprobs"], dtype=torch.float32)
            if s.get("loss_mask") is not None:  # multi-turn: observation and template tokens take no loss
                mask = torch.tensor(s["loss_mask"], dtype=torch.long)
                if mask.shape != (len(r),):
                    raise BatchError(f"sample {i}: loss_mask has {mask.numel()} entries for {len(r)} tokens")
                masks.append((i, mask))
            if versions is not None and s.get("token_versions"):
                versions[i, : len(r)] = torch.tensor(s["token_versions"], dtype=torch.long)
    response_mask = attn[:, P:].clone()
    for i, m in masks:
        response_mask[i, : m.numel()] = m
    out: Batch = {
        "input_ids": ids,
        "attention_mask": attn,
        "responses": ids[:, P:].clone(),
        "response_mask": response_mask,
        "rollout_log_probs": rlp,
        "uid": list(uids),
    }
    if versions is not None:
        out["rollout_policy_version"] = versions
    routed = routed_experts(samples, P, R)
    if routed is not None:
        out[ROUTING_KEY] = routed
    return out


def routed_experts(samples: list[dict], P: int, R: int) -> torch.Tensor | None:
    """[B, P + R, L, k] int16 from the samples' `routed_experts` ([tokens, L, k]: the sampler's expert ids for the
    tokens it computed, prompt then response, in order), aligned with input_ids; -1 elsewhere. None when no
    sample has them; all or none must (router replay is a deployment's setting)."""
    have = [s.get(ROUTING_KEY) is not None for s in samples]
    if not any(have):
        return None
    if not all(have):
        raise BatchError(f"routed_experts: samples {[i for i, h in enumerate(have) if not h][:8]} have none")
    first = torch.as_tensor(samples[have.index(True)][ROUTING_KEY])
    out = torch.full((len(samples), P + R, *first.shape[1:]), -1, dtype=torch.int16)
    for i, s in enumerate(samples):
        rows = torch.as_tensor(s[ROUTING_KEY]).to(torch.int16)
        start = P - len(s["prompt_token_ids"])
        n = min(rows.shape[0], len(s["prompt_token_ids"]) + len(s["token_ids"]))
        out[i, start : start + n] = rows[:n]
    return out
