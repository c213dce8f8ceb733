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
# verl 0.9.1's rejection-sampling options (rollout_corr_helper.SUPPORTED_ROLLOUT_RS_OPTIONS): the statistic k1 = -log r,
# k2 = (log r)^2 / 2 or k3 = r - 1 - log r of r = pi_anchor / pi_rollout, per token or summed / averaged / maxed per row.
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
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


def rs_options(value: Any) -> list[str]:
    """The options of a rollout_rs spec ("token_k1,seq_mean_k3"), in order, duplicates dropped as verl does."""
    if not isinstance(value, str):
        raise ValueError(f"expected a comma-separated string of options from {list(RS_OPTIONS)}")
    options = list(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    if not options:
        raise ValueError(f"expected at least one option from {list(RS_OPTIONS)}")
    unknown = [o for o in options if o not in RS_OPTIONS]
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; known: {list(RS_OPTIONS)}")
    return options


def _positive(text: str) -> float:
    x = float(text)  # ValueError for a non-number
    if not x > 0:  # NaN too
        raise ValueError
    return x


def rs_thresholds(options: list[str], value: Any) -> list[tuple[float | None, float]]:
    """(lower or None, upper) per option from verl's rollout_rs_threshold spec: one value shared by every option or
    one per option, comma-separated. A k1 option takes ratio bounds "lower_upper" or an upper u alone (lower 1/u);
    k2/k3 options an upper bound on the statistic."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError('expected a number or a string like "0.5_2.0" or "0.5_2.0,0.01"')
    specs = [str(value)] if not isinstance(value, str) else [p.strip() for p in value.split(",") if p.strip()]
    if len(specs) not in (1, len(options)):
        raise ValueError(f"expected one threshold for all options or one per option ({len(options)}: {options})")
    out: list[tuple[float | None, float]] = []
    for option, spec in zip(options, specs * len(options) if len(specs) == 1 else specs):
        try:
            if option.endswith("k1"):
                lo, hi = spec.split("_", 1) if "_" in spec else ("", spec)
                upper = _positive(hi)
                lower = _positive(lo) if lo else 1.0 / upper
                if lower > upper:
                    raise ValueError
                out.append((lower, upper))
            elif "_" in spec:  # a k2/k3 statistic has no lower bound (and float() reads "1_0" as 10)
                raise ValueError
            else:
                out.append((None, _positive(spec)))
        except ValueError:
            k1 = option.endswith("k1")
            want = 'a positive ratio bound u or "lower_upper" with 0 < lower <= upper' if k1 else "one positive bound"
            raise ValueError(f"{spec!r} for option {option!r}: expected {want}") from None
    return out


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):  # not 1, nor "yes"
        raise ValueError("expected true or false")
    return value


def _rs_options(value: str | None) -> str | None:
    if value is not None:
        rs_options(value)
    return value


def _rs_threshold_type(value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, str))):
        raise ValueError('expected a number or a string like "0.5_2.0" or "0.5_2.0,0.01"')
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
    rollout_is_batch_normalize: Annotated[bool, BeforeValidator(_bool)] = False
    rollout_rs: Annotated[str | None, AfterValidator(_rs_options)] = None
    rollout_rs_threshold: Annotated[float | str | None, BeforeValidator(_rs_threshold_type)] = None
    bypass_mode: Annotated[bool, BeforeValidator(_bool)] = False
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"
    rollout_is_batch_mean: OptionalNonNegative = None
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
        return self._rollout_correction()

    def _rollout_correction(self):
        if self.rollout_rs is not None:
            if self.rollout_rs_threshold is None:
                raise ValueError(
                    "loss_config['rollout_rs'] needs loss_config['rollout_rs_threshold'] (verl has no default)"
                )
            try:
                rs_thresholds(rs_options(self.rollout_rs), self.rollout_rs_threshold)
            except ValueError as e:
                raise ValueError(f"loss_config['rollout_rs_threshold'] = {self.rollout_rs_threshold!r}: {e}") from None
        elif self.rollout_rs_threshold is not None:
            raise ValueError("loss_config['rollout_rs_threshold'] only applies with loss_config['rollout_rs'] set")
        if self.rollout_is_batch_normalize and self.rollout_is is None:
            raise ValueError(
                "loss_config['rollout_is_batch_normalize'] only applies with loss_config['rollout_is'] set"
            )
        if self.loss_type != "ppo_clip" and not self.bypass_mode:
            raise ValueError(
                f"loss_config['loss_type'] = {self.loss_type!r} only applies with bypass_mode=True "
                "(without it the policy loss is loss_config['policy_loss'])"
            )
        if self.bypass_mode and self.policy_loss != "ppo":
            raise ValueError(
                "loss_config['bypass_mode'] = True picks its loss with loss_config['loss_type'] "
                "(ppo_clip or reinforce), as verl does; "
                f"loss_config['policy_loss'] = {self.policy_loss!r} does not apply (leave it 'ppo')"
            )
        if self.bypass_mode and self.prox_logp_method != "recompute":
            raise ValueError(
                "loss_config['bypass_mode'] = True uses the rollout log-probs as old log-probs: "
                f"loss_config['prox_logp_method'] = {self.prox_logp_method!r} does not apply"
            )
        return self

    @property
    def rs_spec(self) -> list[tuple[str, float | None, float]]:
        """(option, lower or None, upper) for every rollout_rs option; [] without rollout_rs."""
        if self.rollout_rs is None:
            return []
        options = rs_options(self.rollout_rs)
        return [(o, lo, hi) for o, (lo, hi) in zip(options, rs_thresholds(options, self.rollout_rs_threshold))]

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
