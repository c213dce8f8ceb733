"""Request checks: every op's arguments, types, shapes and limits, before any engine sees them.

Run by the controller on every op (both transports end there) and by the HTTP front end before it
forwards a request, so a malformed request is a 4xx naming the argument, never an engine error.
Limits come from the server config (`server.max_n`, `max_tokens`, `max_batch_rows`); names of losses
and post-processors from the server's registry (`arctic_rl.losses`); checkpoint paths must lie under
`server.checkpoint_root`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import torch
from pydantic import BeforeValidator, Field, ValidationInfo, model_validator

from arctic_rl.batch import LOG_PROBS_KEYS, TRAIN_KEYS, BatchError, BatchLimits, validate_batch
from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.errors import BatchFormatError, ConfigError, UnknownNameError
from arctic_rl.losses import resolve_loss_fn, resolve_post_processor
from arctic_rl.server import checkpoint_dirs
from arctic_rl.strict import Strict, parse

ENGINES = ("training", "reference", "sampling")


_NO_REFERENCE = (
    "{op}: this deployment has no reference model (use_reference=False; a run deploys one only when its loss "
    "has a KL term, or reference.enable=true)"
)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _token_list(x, vocab: int | None) -> bool:
    return (
        isinstance(x, list)
        and len(x) > 0
        and all(_is_int(t) and t >= 0 for t in x)
        and (vocab is None or max(x) < vocab)
    )


def _int(lo: int) -> BeforeValidator:
    """An int >= lo, and <= the server's limit for this key (validation context `limits`) where it has one."""

    def check(v: Any, info: ValidationInfo) -> Any:
        hi = (info.context or {}).get("limits", {}).get(info.field_name)
        if not _is_int(v) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise ValueError(f"must be an int {rng}")
        return v

    return BeforeValidator(check)


def _float(lo: float, hi: float | None = None, zero_ok: bool = True) -> BeforeValidator:
    def check(v: Any) -> Any:
        if not _is_number(v) or v < lo or (hi is not None and v > hi) or (not zero_ok and v == 0):
            raise ValueError(f"must be a finite number in [{lo}, {hi if hi is not None else 'inf'}]")
        return v

    return BeforeValidator(check)


def _bool(v: Any) -> Any:
    if not isinstance(v, bool):
        raise ValueError("must be true or false")
    return v


def _stop(v: Any) -> Any:
    if v is not None and not (isinstance(v, str) or isinstance(v, list) and all(isinstance(s, str) for s in v)):
        raise ValueError("must be a string or a list of strings")
    return v


def _stop_token_ids(v: Any) -> Any:
    if v is not None and not (isinstance(v, list) and all(_is_int(t) and t >= 0 for t in v)):
        raise ValueError("must be a list of token ids")
    return v


Bool = Annotated[bool | None, BeforeValidator(_bool)]
VLLM_DEFAULT_MAX_TOKENS = 16  # what vLLM's SamplingParams samples when a request sets no max_tokens
PROMPT_CHARS_PER_TOKEN = 16  # server.max_prompt_chars's default, per token of vllm_config.max_seq_len


class SamplingParams(Strict):
    """vLLM's SamplingParams names we accept, with the types and ranges vLLM takes. Only checks: the request's
    dict goes to vLLM as sent (no defaults added). n, max_tokens, min_tokens, logprobs and seed are bounded by
    the validation context's `limits` (the server's)."""

    n: Annotated[int | None, _int(1)] = None
    max_tokens: Annotated[int | None, _int(1)] = None
    min_tokens: Annotated[int | None, _int(0)] = None
    top_k: Annotated[int | None, _int(-1)] = None
    logprobs: Annotated[int | None, _int(0)] = None
    seed: Annotated[int | None, _int(0)] = None
    temperature: Annotated[float | None, _float(0.0)] = None
    top_p: Annotated[float | None, _float(0.0, 1.0, zero_ok=False)] = None
    min_p: Annotated[float | None, _float(0.0, 1.0)] = None
    presence_penalty: Annotated[float | None, _float(-2.0, 2.0)] = None
    frequency_penalty: Annotated[float | None, _float(-2.0, 2.0)] = None
    repetition_penalty: Annotated[float | None, _float(0.0)] = None
    ignore_eos: Bool = None
    include_stop_str_in_output: Bool = None
    skip_special_tokens: Bool = None
    stop: Annotated[str | list[str] | None, BeforeValidator(_stop)] = None
    stop_token_ids: Annotated[list[int] | None, BeforeValidator(_stop_token_ids)] = None

    @model_validator(mode="after")
    def _min_within_max(self):
        cap = VLLM_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens
        if self.min_tokens is not None and self.min_tokens > cap:
            where = "" if self.max_tokens is not None else f" (vLLM's default, {cap}, when max_tokens is not set)"
            raise ValueError(
                f"min_tokens={self.min_tokens} exceeds max_tokens={cap}{where}: lower min_tokens or raise max_tokens"
            )
        return self


SAMPLING_KEYS = frozenset(SamplingParams.model_fields)


Unit = Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]


class OptimParams(Strict):
    """optimizer_step's optim_params: AdamW's hyper-parameters (torch's names)."""

    lr: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    betas: tuple[Unit, Unit] | None = None
    eps: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    weight_decay: float | None = Field(None, ge=0.0, allow_inf_nan=False)


def check_sampling_params(params: Any, cfg: ArcticRLClientConfig) -> dict:
    """vLLM's names with the types and ranges vLLM takes, n and max_tokens within the server's limits.
    Raises ConfigError naming the key and the value; returns `params` as given."""
    if not isinstance(params, dict):
        raise ConfigError(f"sampling_params must be a dict, got {type(params).__name__}")
    max_tokens = cfg.server.max_tokens or cfg.vllm_config.max_seq_len
    limits = {
        "n": cfg.server.max_n,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "logprobs": 20,
        "seed": 2**63 - 1,
    }
    parse(SamplingParams, params, name="sampling_params", context={"limits": limits})
    check_stops(params, cfg)
    return params


def check_stops(params: dict, cfg: ArcticRLClientConfig) -> None:
    """vLLM matches every stop string against every new token of every sequence: their count and length are
    bounded (server.max_stops, server.max_stop_chars); stop_token_ids' count too."""
    stop = params.get("stop")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    for key, values in (("stop", stops), ("stop_token_ids", params.get("stop_token_ids") or [])):
        if len(values) > cfg.server.max_stops:
            raise ConfigError(
                f"sampling_params['{key}'] has {len(values)} entries; the server takes at most "
                f"{cfg.server.max_stops} (server.max_stops)"
            )
    for i, s in enumerate(stops):
        if len(s) > cfg.server.max_stop_chars:
            raise ConfigError(
                f"sampling_params['stop'][{i}] has {len(s)} characters ({s[:40]!r}...); the server takes at most "
                f"{cfg.server.max_stop_chars} (server.max_stop_chars)"
            )


def check_output_budget(num_prompts: int, params: dict, cfg: ArcticRLClientConfig) -> None:
    """prompts x n x max_tokens within server.max_request_tokens: what one generate asks the sampler to decode."""
    n = params.get("n") or 1
    max_tokens = params.get("max_tokens") or VLLM_DEFAULT_MAX_TOKENS
    total = num_prompts * n * max_tokens
    if total > cfg.server.max_request_tokens:
        raise BatchFormatError(
            f"{num_prompts} prompts x n={n} x max_tokens={max_tokens} = {total} tokens exceeds the server's "
            f"output budget of {cfg.server.max_request_tokens} per request (server.max_request_tokens): "
            "send fewer prompts, a smaller n or max_tokens"
        )


def max_prompt_chars(cfg: ArcticRLClientConfig) -> int | None:
    if cfg.server.max_prompt_chars is not None:
        return cfg.server.max_prompt_chars
    limit = cfg.vllm_config.max_seq_len
    return None if limit is None else PROMPT_CHARS_PER_TOKEN * limit


def check_prompts(
    prompts: Any,
    n: int,
    cfg: ArcticRLClientConfig,
    vocab: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> None:
    """Types, token ids below `vocab`, the row limit, and each prompt shorter than vllm_config.max_seq_len: a
    token list by its length, a string first by its characters (server.max_prompt_chars, before any tokenizer
    reads it), then by `count_tokens` where given (the controller's: the model's tokenizer, as vLLM counts)."""
    if not isinstance(prompts, list) or not prompts:
        raise BatchFormatError(
            f"prompts must be a non-empty list of strings or token-id lists, got {type(prompts).__name__}"
        )
    if len(prompts) * n > cfg.server.max_batch_rows:
        raise BatchFormatError(
            f"{len(prompts)} prompts x n={n} = {len(prompts) * n} samples exceeds the server's "
            f"limit of {cfg.server.max_batch_rows} (server.max_batch_rows)"
        )
    chars = max_prompt_chars(cfg)
    # max_seq_len None: the model's window is unknown here and vLLM enforces its own.
    limit = cfg.vllm_config.max_seq_len
    for i, p in enumerate(prompts):
        if not (isinstance(p, str) and p) and not _token_list(p, vocab):
            raise BatchFormatError(
                f"prompts[{i}] must be a non-empty string or list of token ids"
                f"{f' < {vocab}' if vocab else ''}, got {p!r:.80}"
            )
        if isinstance(p, str) and chars is not None and len(p) > chars:
            raise BatchFormatError(
                f"prompts[{i}] has {len(p)} characters; the server takes at most {chars} "
                "(server.max_prompt_chars): shorten the prompt"
            )
        tokens = len(p) if isinstance(p, list) else (count_tokens(p) if count_tokens is not None else None)
        if tokens is not None and limit is not None and tokens >= limit:
            raise BatchFormatError(
                f"prompts[{i}] has {tokens} tokens; the sampler takes fewer than vllm_config.max_seq_len={limit}"
            )


def check_loss_config(lc: Any) -> None:
    """The keys the engine's post-processor reads from loss_config, whatever the loss: a temperature of 0 divides
    the logits by zero (NaN loss, NaN weights after the step)."""
    if lc is None:
        return
    if not isinstance(lc, dict):
        raise ConfigError(f"forward_backward: argument 'loss_config' must be a dict, got {type(lc).__name__}")
    t = lc.get("temperature")
    if t is not None and not (_is_number(t) and t > 0):
        raise ConfigError(
            f"forward_backward: loss_config['temperature'] must be a finite number > 0 (the sampler's "
            f"temperature; 1.0 for none), got {t!r:.60}"
        )
    e = lc.get("compute_entropy")
    if e is not None and not isinstance(e, bool):
        raise ConfigError(f"forward_backward: loss_config['compute_entropy'] must be true or false, got {e!r:.60}")


def check_batch(batch: Any, required, cfg: ArcticRLClientConfig, vocab: int | None = None) -> None:
    """validate_batch against the deployment's limits (vocabulary, max_seq_len), plus the row limit and uids."""
    limits = BatchLimits(vocab=vocab, max_seq_len=cfg.vllm_config.max_seq_len)
    B, _, _ = validate_batch(batch, required, limits)
    if B > cfg.server.max_batch_rows:
        raise BatchError(
            f"batch has {B} rows; the server's limit is {cfg.server.max_batch_rows} (server.max_batch_rows)"
        )
    uid = batch.get("uid")
    if uid is not None and not (
        isinstance(uid, torch.Tensor)
        and not uid.dtype.is_floating_point
        or isinstance(uid, list)
        and all(isinstance(u, str) or _is_int(u) for u in uid)
    ):
        raise BatchError("batch['uid'] must be a list of strings or ints (or an integer tensor)")


T = TypeVar("T")


def _check_type(op: str, name: str, value, kind: type[T], what: str) -> T:
    if not isinstance(value, kind):
        raise BatchFormatError(f"{op}: argument {name!r} must be {what}, got {type(value).__name__} {value!r:.60}")
    return value


def check_name(kind: str, name: Any, cfg: ArcticRLClientConfig) -> None:
    """A loss or post-processor name the server may run (its registry; dotted paths with allow_imports)."""
    resolve = resolve_loss_fn if kind == "loss_fn" else resolve_post_processor
    resolve(name, cfg.server.allow_imports)


def checkpoint_path(path: Any, cfg: ArcticRLClientConfig) -> Path:
    """`path` resolved (symlinks followed, `..` folded) and required to lie under the server's
    checkpoint_root; relative paths are taken under the root."""
    root_cfg = cfg.server.checkpoint_root
    if root_cfg is None:
        raise ConfigError("the server has no checkpoint_root (server.checkpoint_root): checkpoints are refused")
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ConfigError(f"checkpoint path must be a non-empty string, got {path!r:.80}")
    root = Path(root_cfg).resolve()
    p = Path(path).expanduser()
    resolved = (p if p.is_absolute() else root / p).resolve()
    if not resolved.is_relative_to(root):
        raise ConfigError(
            f"checkpoint path {path!r} resolves to {str(resolved)!r}, outside the server's "
            f"checkpoint_root {str(root)!r}"
        )
    return resolved


def save_target(path: Any, cfg: ArcticRLClientConfig) -> Path:
    """checkpoint_path, for a save: a folder inside the root (a save swaps the whole folder, server/checkpoint_dirs.py),
    new or a checkpoint."""
    target = checkpoint_path(path, cfg)
    if target == Path(str(cfg.server.checkpoint_root)).resolve():
        raise ConfigError(
            f"checkpoint path {path!r} is the server's checkpoint_root itself: save under a name inside it (e.g. 'step_1')"
        )
    checkpoint_dirs.check_replaceable(target)
    return target


def check_request(
    op: str,
    args: dict,
    cfg: ArcticRLClientConfig,
    vocab: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> None:
    """Raises a 4xx error (BatchFormatError, ConfigError, UnknownNameError) naming the bad argument. `vocab`: the
    model's vocabulary size (token ids must be below it); `count_tokens`: a string prompt's length in tokens."""
    if op == "generate":
        params = check_sampling_params(args.get("sampling_params") or {}, cfg)
        check_prompts(args.get("prompts"), params.get("n", 1), cfg, vocab, count_tokens)
        check_output_budget(len(args["prompts"]), params, cfg)
        keys = args.get("routing_keys")
        if keys is not None:
            prompts = args.get("prompts") or []
            if not isinstance(keys, list) or len(keys) != len(prompts):
                raise BatchFormatError(f"routing_keys must be a list of one string per prompt ({len(prompts)})")
            for i, k in enumerate(keys):
                if not isinstance(k, str) or not 1 <= len(k) <= 200:
                    raise BatchFormatError(f"routing_keys[{i}] must be a string of 1-200 characters, got {k!r:.60}")
    elif op == "sampler_log_probs":
        seqs = _check_type(op, "sequences", args.get("sequences"), list, "a list of token-id lists")
        lens = _check_type(op, "prompt_lens", args.get("prompt_lens"), list, "a list of ints")
        if len(seqs) != len(lens):
            raise BatchFormatError(f"sequences ({len(seqs)}) and prompt_lens ({len(lens)}) differ in length")
        if len(seqs) > cfg.server.max_batch_rows:
            raise BatchFormatError(f"{len(seqs)} sequences exceeds the server's limit of {cfg.server.max_batch_rows}")
        for i, (s, p) in enumerate(zip(seqs, lens)):
            limit = cfg.vllm_config.max_seq_len  # None: the model's window is unknown here; vLLM enforces its own
            if not _token_list(s, vocab) or (limit is not None and len(s) > limit):
                raise BatchFormatError(
                    f"sequences[{i}] must be a list of 1..{cfg.vllm_config.max_seq_len} token ids"
                    f"{f' < {vocab}' if vocab else ''}, got {s!r:.80}"
                )
            if not _is_int(p) or not 1 <= p <= len(s):
                raise BatchFormatError(f"prompt_lens[{i}] must be an int in [1, {len(s)}], got {p!r}")
    elif op in ("log_probs", "forward_backward"):
        check_batch(args.get("batch"), LOG_PROBS_KEYS if op == "log_probs" else TRAIN_KEYS, cfg, vocab)
        check_name("post_processor", args.get("post_processor", "log_probs"), cfg)
        if op == "log_probs":
            for flag in ("reference", "compute_entropy"):
                _check_type(op, flag, args.get(flag, False), bool, "true or false")
            if args.get("reference") and not cfg.use_reference:
                raise ConfigError(_NO_REFERENCE.format(op="log_probs(reference=True)"))
            t = args.get("temperature", 1.0)
            if not _is_number(t) or t <= 0:
                raise ConfigError(f"log_probs: argument 'temperature' must be a finite number > 0, got {t!r}")
        else:
            check_name("loss_fn", args.get("loss_fn", "grpo"), cfg)
            check_loss_config(args.get("loss_config"))
    elif op in ("sleep", "wake"):
        engine = args.get("engine")
        if engine not in ENGINES:
            raise UnknownNameError(f"unknown engine {engine!r:.60}; known: {list(ENGINES)}")
        level = args.get("level")
        if op == "sleep" and level is not None:
            if not _is_int(level) or level not in (1, 2):
                raise ConfigError(f"sleep: argument 'level' must be 1 or 2 (vLLM's sleep levels), got {level!r:.60}")
            if engine != "sampling":
                raise ConfigError(f"sleep: argument 'level' applies to the sampling engine only, not {engine!r}")
    elif op == "update_reference" and not cfg.use_reference:
        raise ConfigError(_NO_REFERENCE.format(op="update_reference"))
    elif op == "optimizer_step" and args.get("optim_params") is not None:
        parse(OptimParams, args["optim_params"], name="optim_params")
    elif op == "save_checkpoint":
        save_target(args.get("path"), cfg)
    elif op == "load_checkpoint":
        checkpoint_path(args.get("path"), cfg)
