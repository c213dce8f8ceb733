"""The loss configs of the built-in losses, as strict pydantic models (no torch: the run config checks
`loss.config` with them when it parses, long before a loss runs).

    cfg = parse_loss_config("grpo", {"clip_ratio": 0.28, "use_kl_loss": True})   # a GRPOConfig
    parse_loss_config("my_plugin_loss", {...})                                    # None: not ours to check

Errors are ConfigError (a ValueError) through the one formatter (arctic_rl.strict.explain), naming the key,
the value and what is allowed:

    loss_config['clip_ratio_c'] = 1.0: must be > 1.0
    unknown loss_config key(s) ['clip_ratio_hgih']; known: ['policy_loss', 'clip_ratio', ...]

Every key and its meaning: arctic_rl/losses/grpo.py (GRPO family) and arctic_rl/losses/sft.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, field_validator, model_validator

from arctic_rl.errors import ConfigError
from arctic_rl.strict import Strict, parse

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
POLICY_LOSS_NAMES = ("ppo", "gspo", "cispo", "m2po")
# Read by the engine's post-processor from the same loss_config (arctic_rl/engines/training.py); ignored by losses.
POST_PROCESSOR_KEYS = ("temperature", "compute_entropy")

AggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _number(min_value: float | None = None, above: float | None = None, optional: bool = False) -> BeforeValidator:
    """A float from an int, a float or a one-element tensor (the engine's normalizers may be tensors); not from
    a bool or a string, which a YAML or JSON typo gives."""

    def check(value: Any) -> Any:
        if value is None and optional:
            return None
        if hasattr(value, "numel") and hasattr(value, "item") and value.numel() == 1:  # a tensor, without torch
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("expected a number")
        if min_value is not None and value < min_value:
            raise ValueError(f"must be >= {min_value}")
        if above is not None and value <= above:
            raise ValueError(f"must be > {above}")
        return float(value)

    return BeforeValidator(check)


def _kl_type(value: str) -> str:
    if value.removesuffix("+") not in KL_TYPES:
        raise ValueError(f"expected one of {list(KL_TYPES)}, optionally with a '+' suffix")
    return value


def is_threshold(value: Any) -> tuple[float, float | None]:
    """(upper, lower or None) from verl's rollout_is_threshold spec: 2.0 or "0.5_2.0"."""
    lower = None
    try:
        if isinstance(value, str) and "_" in value:
            lo, hi = value.split("_", 1)
            lower, upper = float(lo), float(hi)
        elif isinstance(value, bool):
            raise TypeError
        else:
            upper = float(value)
    except (TypeError, ValueError):
        raise ValueError('expected a float or a "lower_upper" string like "0.5_2.0"') from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError("bounds must satisfy 0 < lower <= upper")
    return upper, lower


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):  # not 1, nor "yes"
        raise ValueError("expected true or false")
    return value


def _threshold(value: Any) -> Any:
    is_threshold(value)
    return value


Number = Annotated[float, _number()]
NonNegative = Annotated[float, _number(min_value=0.0)]
OptionalNonNegative = Annotated[float | None, _number(min_value=0.0, optional=True)]
OptionalPositive = Annotated[float | None, _number(above=0.0, optional=True)]


class LossConfigBase(Strict):
    """Keys every built-in loss takes: the engine's global normalizers, and the post-processor's keys, which
    travel in the same loss_config (accepted, ignored by the loss)."""

    model_config = ConfigDict(frozen=True, validate_assignment=False)

    loss_agg_mode: AggMode = "token-mean"
    loss_scale_factor: OptionalPositive = None
    global_num_tokens: OptionalNonNegative = None
    global_num_seqs: OptionalNonNegative = None
    temperature: OptionalPositive = None  # divides the logits: 0 would make the loss and the weights NaN
    compute_entropy: Any = None


class GRPOConfig(LossConfigBase):
    """The `grpo` loss's config; the key table is in arctic_rl/losses/grpo.py."""

    policy_loss: Literal["ppo", "gspo", "cispo", "m2po"] = "ppo"
    clip_ratio: NonNegative = 0.2
    clip_ratio_low: OptionalNonNegative = None
    clip_ratio_high: OptionalNonNegative = None
    clip_ratio_c: Annotated[float, _number(above=1.0)] = 3.0
    m2_threshold: NonNegative = 0.04
    entropy_coeff: Number = 0.0
    use_kl_loss: Annotated[bool, BeforeValidator(_bool)] = False
    kl_loss_coef: Number = 0.001
    kl_loss_type: Annotated[str, AfterValidator(_kl_type)] = "low_var_kl"
    rollout_is: Literal["token", "sequence"] | None = None
    rollout_is_threshold: Annotated[float | str, BeforeValidator(_threshold)] = 2.0
    prox_logp_method: Literal["recompute", "loglinear"] = "recompute"
    prox_alpha: OptionalNonNegative = None
    prox_staleness: Annotated[float | None, _number(min_value=1.0, optional=True)] = None

    @field_validator("prox_alpha")
    @classmethod
    def _alpha_at_most_one(cls, v: float | None) -> float | None:
        if v is not None and v > 1.0:
            raise ValueError("must be in [0, 1]")
        return v

    @model_validator(mode="after")
    def _proximal(self):
        if self.prox_logp_method == "loglinear" and (self.prox_alpha is None) == (self.prox_staleness is None):
            raise ValueError(
                "prox_logp_method='loglinear' needs exactly one of loss_config['prox_alpha'] "
                f"(got {self.prox_alpha!r}) and loss_config['prox_staleness'] (got {self.prox_staleness!r})"
            )
        if self.prox_logp_method == "recompute" and (self.prox_alpha is not None or self.prox_staleness is not None):
            raise ValueError(
                "loss_config['prox_alpha'] / ['prox_staleness'] only apply with "
                "prox_logp_method='loglinear' (got prox_logp_method='recompute')"
            )
        return self

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


class SFTConfig(LossConfigBase):
    """The `sft` loss's config: aggregation and normalizers only (arctic_rl/losses/sft.py)."""


LOSS_CONFIGS: dict[str, type[LossConfigBase]] = {"grpo": GRPOConfig, "sft": SFTConfig}


def parse_loss_config(loss: str, config: dict | None, name: str = "loss_config") -> LossConfigBase | None:
    """The validated config of the built-in loss `loss` (None for a plugin loss, whose config is its own);
    raises ConfigError naming the key (as `name['key']`), the value and what is allowed."""
    model = LOSS_CONFIGS.get(loss)
    if model is None:
        return None
    if config is not None and not isinstance(config, dict):
        raise ConfigError(f"{name} must be a mapping, got {type(config).__name__}")
    return parse(model, config or {}, name=name)


class TinkerLossConfig(LossConfigBase):
    """The Tinker built-in losses' `loss_fn_config` keys (arctic_rl/losses/tinker.py). Their losses are sums over
    tokens, so the aggregation keys inherited from LossConfigBase are accepted and not used."""

    clip_low_threshold: NonNegative = 0.8  # ppo / cispo: ratio clipped to [low, high]
    clip_high_threshold: NonNegative = 1.2
    beta: OptionalNonNegative = None  # dro: the quadratic penalty's weight (required there)

    @model_validator(mode="after")
    def _ordered(self):
        if self.clip_low_threshold > self.clip_high_threshold:
            raise ValueError(
                f"clip_low_threshold={self.clip_low_threshold} must be <= clip_high_threshold={self.clip_high_threshold}"
            )
        return self


TINKER_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")
LOSS_CONFIGS.update(dict.fromkeys(TINKER_LOSSES, TinkerLossConfig))
