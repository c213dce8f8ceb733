"""Tinker's wire (the SDK's protobuf module and types) <-> arctic-rl's batch schema (arctic_rl/batch.py).

A Tinker Datum is `model_input` (N tokens) and `loss_fn_inputs` aligned with it: position i of the input predicts
`target_tokens[i]`, the next token of the full sequence. The full sequence is the input plus the last target; the
batch's layout splits it into a prompt S[:p] and a response S[p:], whose column j is target position p - 1 + j.
  p = 1 ("full"): every target position is a response column (log-probs for all N positions).
  p = 1 + the number of leading positions that carry no loss ("shared"): rows of one request whose prompts are
      equal get one uid, so ZoRRo Train encodes the prompt once; dropping positions whose loss terms are zero
      (weight 0, or advantage 0) changes no loss value and no gradient.
Only next-token targets are supported (target_tokens[:-1] == model_input[1:]): the engine computes the log-probs
of the sequence's own next tokens. Only token chunks (no images, no audio).

Legend: B rows, N targets of a datum, P prompt columns, R response columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from google.protobuf.message import DecodeError
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.response_conv import _PROTO_DTYPE_TO_NUMPY, _tensor_data_from_proto

from arctic_rl.batch import Batch
from arctic_rl.errors import BatchFormatError, ProtocolError, UnknownNameError
from arctic_rl.losses.config import TINKER_LOSSES

# The loss_fn_inputs each loss reads, and the batch key each goes to (target_tokens make the sequence).
INPUTS: dict[str, dict[str, str]] = {
    "cross_entropy": {"weights": "weights"},
    **{n: {"logprobs": "rollout_log_probs", "advantages": "advantages"} for n in TINKER_LOSSES[1:]},
}
# The input whose leading zeros mark positions that carry no loss (dro's penalty counts everywhere: none).
LOSS_CARRIER = {
    "cross_entropy": "weights",
    "importance_sampling": "advantages",
    "ppo": "advantages",
    "cispo": "advantages",
}


@dataclass(frozen=True)
class Limits:
    """What one forward_backward request may hold (the server's config), checked on the declared sizes before
    anything is allocated: a sparse tensor's shape, or the padding of every datum to the longest, would
    otherwise turn a small body into gigabytes."""

    max_seq_len: int  # tokens of a datum's full sequence (vllm_config.max_seq_len)
    max_rows: int  # datums (server.max_batch_rows)
    max_cells: int  # rows x padded columns of the batch built from them (server.max_batch_tokens)


@dataclass
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[types.Datum]


def parse_forward_backward(body: bytes, limits: Limits) -> ForwardBackwardCall:
    """The SDK's protobuf ForwardBackwardRequest, as SDK types, within `limits`; ProtocolError / BatchFormatError
    name what is wrong."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as e:
        raise ProtocolError(f"forward_backward: the body is not a ForwardBackwardRequest protobuf ({e})") from None
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():  # the SDK writes both; v2 carries strings too and wins
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    _check_sizes(msg, limits)
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for c in d.model_input:
            kind = c.WhichOneof("chunk")
            if kind != "encoded_text":
                raise BatchFormatError(f"data[{i}].model_input: {kind} chunks are not supported (token chunks only)")
            tokens.extend(np.frombuffer(c.encoded_text.tokens, dtype=np.int32).tolist())
        try:
            inputs = {name: _tensor_data_from_proto(t) for name, t in d.loss_fn_inputs.items()}
        except ValueError as e:
            raise BatchFormatError(f"data[{i}].loss_fn_inputs: {e}") from None
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs))
    return ForwardBackwardCall(msg.model_id, msg.seq_id, msg.loss_fn, config, msg.forward_only, data)


def _declared_numel(t: pb.Tensor) -> int:
    """How many elements `t` becomes once dense: its declared shape's product, or what it stores if more."""
    if any(n < 0 for n in t.shape):
        raise ValueError(f"negative dimension in shape {list(t.shape)}")
    itemsize = np.dtype(_PROTO_DTYPE_TO_NUMPY.get(t.dtype, np.uint8)).itemsize
    stored = len(t.sparse_csr.values if t.HasField("sparse_csr") else t.dense) // itemsize
    return max(stored, math.prod(t.shape))


def _check_sizes(msg: pb.ForwardBackwardRequest, limits: Limits) -> None:
    """Datums, tokens per datum, every loss_fn_input's declared size, and the padded batch, before decoding."""
    B = len(msg.data)
    if B > limits.max_rows:
        raise BatchFormatError(
            f"forward_backward: {B} datums exceeds the server's limit of {limits.max_rows} (server.max_batch_rows)"
        )
    longest = 0
    for i, d in enumerate(msg.data):
        # int32 token bytes; the full sequence is the input plus its last target
        n = sum(len(c.encoded_text.tokens) // 4 for c in d.model_input if c.WhichOneof("chunk") == "encoded_text")
        if n + 1 > limits.max_seq_len:
            raise BatchFormatError(
                f"data[{i}].model_input has {n} tokens; a datum's sequence (input plus its last target) takes at "
                f"most vllm_config.max_seq_len={limits.max_seq_len} tokens"
            )
        for name, t in d.loss_fn_inputs.items():
            try:
                numel = _declared_numel(t)
            except ValueError as e:
                raise BatchFormatError(f"data[{i}].loss_fn_inputs[{name!r}]: {e}") from None
            if numel > limits.max_seq_len:
                raise BatchFormatError(
                    f"data[{i}].loss_fn_inputs[{name!r}] declares shape {list(t.shape)} ({numel} elements); one "
                    f"entry per input token is expected, at most vllm_config.max_seq_len={limits.max_seq_len}"
                )
        longest = max(longest, n + 1)
    if B * longest > limits.max_cells:
        raise BatchFormatError(
            f"forward_backward: {B} datums padded to the longest ({longest} tokens) make {B * longest} cells; "
            f"the server's limit is {limits.max_cells} (server.max_batch_tokens): send fewer or shorter datums"
        )


def check_inputs(call: ForwardBackwardCall) -> None:
    """Every datum's loss_fn_inputs are those `call.loss_fn` reads (an unknown key would be ignored silently)."""
    known = ["target_tokens", *INPUTS[call.loss_fn]]
    for i, d in enumerate(call.data):
        unknown = sorted(set(d.loss_fn_inputs) - set(known))
        if unknown:
            raise BatchFormatError(
                f"data[{i}].loss_fn_inputs has unknown key(s) {[k[:60] for k in unknown]}; loss_fn "
                f"{call.loss_fn!r} reads {known}"
            )


def check_loss_fn(name: str) -> None:
    if name not in INPUTS:
        raise UnknownNameError(f"unknown loss_fn {name!r:.60}; this server supports {list(TINKER_LOSSES)}")


def _vector(datum: types.Datum, i: int, key: str, n: int) -> np.ndarray:
    td = datum.loss_fn_inputs.get(key)
    if td is None:
        raise BatchFormatError(f"data[{i}].loss_fn_inputs is missing {key!r} (has {sorted(datum.loss_fn_inputs)})")
    try:
        x = np.asarray(td.to_numpy()).reshape(-1)
    except (ValueError, AssertionError, RuntimeError) as e:
        raise BatchFormatError(f"data[{i}].loss_fn_inputs[{key!r}]: {e}") from None
    if x.shape[0] != n:
        raise BatchFormatError(f"data[{i}].loss_fn_inputs[{key!r}] has {x.shape[0]} entries; model_input has {n}")
    if not np.isfinite(x.astype(np.float64)).all():
        raise BatchFormatError(f"data[{i}].loss_fn_inputs[{key!r}] holds NaN or inf")
    return x


@dataclass
class Rows:
    """The batch built from a request's data, and where each datum's targets sit in it."""

    batch: Batch
    prompt_lens: list[int]  # p of each row
    num_targets: list[int]  # N of each row


def to_batch(data: list[types.Datum], loss_fn: str, shared: bool) -> Rows:
    """The verl-layout batch of `data` for `loss_fn` ("full" layout unless `shared`, see the module doc)."""
    check_loss_fn(loss_fn)
    if not data:
        raise BatchFormatError("data is empty: forward_backward needs at least one Datum")
    seqs: list[list[int]] = []
    vals: list[dict[str, Any]] = []
    plens: list[int] = []
    for i, d in enumerate(data):
        x = d.model_input.to_ints()
        n = len(x)
        if n == 0:
            raise BatchFormatError(f"data[{i}].model_input is empty")
        t = _vector(d, i, "target_tokens", n).astype(np.int64)
        if not np.array_equal(t[:-1], np.asarray(x[1:], dtype=np.int64)):
            raise BatchFormatError(
                f"data[{i}]: target_tokens must be the next tokens of model_input (target_tokens[:-1] == "
                "model_input[1:]); this server trains next-token targets only"
            )
        v = {key: _vector(d, i, src, n).astype(np.float32) for src, key in INPUTS[loss_fn].items()}
        p = 1
        carrier = LOSS_CARRIER.get(loss_fn)
        if shared and carrier is not None:
            nz = np.flatnonzero(v[INPUTS[loss_fn][carrier]])
            p = 1 + int(nz[0]) if nz.size else n  # no loss anywhere: keep one response token
        seqs.append([*x, int(t[-1])])
        vals.append(v)
        plens.append(p)
    B = len(data)
    P = max(plens)
    R = max(len(s) - p for s, p in zip(seqs, plens))
    ids = torch.zeros(B, P + R, dtype=torch.long)
    attn = torch.zeros(B, P + R, dtype=torch.long)
    extra = {key: torch.zeros(B, R) for key in INPUTS[loss_fn].values()}
    groups: dict[tuple[int, ...], int] = {}
    uid = []
    for i, (s, p, v) in enumerate(zip(seqs, plens, vals)):
        r = len(s) - p
        ids[i, P - p : P + r] = torch.tensor(s, dtype=torch.long)
        attn[i, P - p : P + r] = 1
        for key, vec in v.items():
            extra[key][i, :r] = torch.from_numpy(vec[p - 1 :])
        uid.append(groups.setdefault(tuple(s[:p]) if shared else (i,), len(groups)))
    batch: Batch = {
        "input_ids": ids,
        "attention_mask": attn,
        "responses": ids[:, P:].clone(),
        "response_mask": attn[:, P:].clone(),
        "uid": uid,
        **extra,
    }
    return Rows(batch, plens, [len(s) - 1 for s in seqs])


def target_log_probs(rows: Rows, log_probs: torch.Tensor) -> list[np.ndarray]:
    """Each datum's N target log-probs from a [B, R] result on `rows` (positions before the row's prompt end,
    which a "shared" layout does not compute, read 0)."""
    out = []
    for i, (p, n) in enumerate(zip(rows.prompt_lens, rows.num_targets)):
        x = np.zeros(n, dtype=np.float32)
        x[p - 1 :] = log_probs[i, : n - p + 1].numpy()
        out.append(x)
    return out


def forward_backward_output(per_datum: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """A ForwardBackwardOutput protobuf: one ArrayRecord with each datum's `logprobs`."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    record = msg.loss_fn_outputs.add(num_datums=len(per_datum))
    offsets = np.cumsum([0] + [x.nbytes for x in per_datum]).astype(np.int64)
    field = record.fields["logprobs"]
    field.data = b"".join(x.astype(np.float32).tobytes() for x in per_datum)
    field.offsets = offsets.tobytes()
    field.dtype = pb.DTYPE_FLOAT32
    return msg.SerializeToString()


_STOP = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


def sampling_params(sp: types.SamplingParams, num_samples: int) -> dict:
    """Tinker SamplingParams -> the generate op's (vLLM's names)."""
    out: dict = {"n": num_samples, "temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k}
    if sp.max_tokens is not None:
        out["max_tokens"] = sp.max_tokens
    if sp.seed is not None:
        out["seed"] = sp.seed
    stop = sp.stop
    if isinstance(stop, str):
        out["stop"] = [stop]
    elif stop is not None:
        stops = list(stop)
        if not stops:  # Tinker: [] disables every stop, EOS included
            out["ignore_eos"] = True
        elif all(isinstance(s, str) for s in stops):
            out["stop"] = stops
        elif all(isinstance(s, int) for s in stops):
            out["stop_token_ids"] = stops
        else:
            raise BatchFormatError("sampling_params.stop must be strings or token ids, not a mix")
    return out


def sample_response(samples: list[dict], prompt_logprobs: list[float] | None) -> bytes:
    """A SampleResponse protobuf from the generate op's samples (and the prompt's log-probs, first one NaN)."""
    msg = pb.SampleResponse()
    for s in samples:
        seq = msg.sequences.add()
        seq.stop_reason = _STOP.get(s.get("finish_reason") or "length", pb.STOP_REASON_STOP)
        seq.tokens = np.asarray(s["token_ids"], dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(s["logprobs"], dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray([np.nan, *prompt_logprobs], dtype=np.float32).tobytes()
    return msg.SerializeToString()
