"""YaRN context extension, set once for trainer and sampler.

    >>> y = yarn_overrides(4.0, 32768, rope_theta=1_000_000.0)
    >>> y.hf_config["max_position_embeddings"], y.hf_config["rope_parameters"]["rope_type"]
    (131072, 'yarn')
    >>> y.vllm_hf_overrides == y.hf_config
    True

Trainer: `config = AutoConfig.from_pretrained(path); config.update(y.hf_config)` before building
the model (transformers >= 5 reads `config.rope_parameters`). Sampler:
`LLM(path, hf_overrides=y.vllm_hf_overrides, max_model_len=...)`. Both get the same dict:
vLLM applies `hf_overrides` to the same HF config object, and its YaRN and transformers' YaRN read
the same keys. Every YaRN knob is written out (beta_fast/beta_slow/attention_factor/truncate at
their published defaults) so a default that drifts in either library cannot split them.

`max_position_embeddings` becomes factor x original: vLLM does not multiply it by the YaRN
factor (it takes it as already scaled) and caps `max_model_len` by it, and transformers warns
when the two disagree. `rope_theta` must be the model's own (rope_parameters replaces the dict
that held it): read it with `rope_theta_of(config)`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple


class YarnOverrides(NamedTuple):
    hf_config: dict[str, Any]  # for PreTrainedConfig.update(...) in the trainer
    vllm_hf_overrides: dict[str, Any]  # for vLLM's hf_overrides in the sampler


def yarn_overrides(factor: float, original_max_position_embeddings: int, *, rope_theta: float) -> YarnOverrides:
    """The rope settings for YaRN with `factor`, as an HF config update and as vLLM hf_overrides."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 1.0:
        raise ValueError(f"model.yarn.factor must be a number > 1, got {factor!r}")
    if (
        isinstance(original_max_position_embeddings, bool)
        or not isinstance(original_max_position_embeddings, int)
        or original_max_position_embeddings <= 0
    ):
        raise ValueError(
            "model.yarn.original_max_position_embeddings must be a positive int, "
            f"got {original_max_position_embeddings!r}"
        )
    if not isinstance(rope_theta, (int, float)) or rope_theta <= 0:
        raise ValueError(f"rope_theta must be a positive number, got {rope_theta!r}")
    rope_parameters = {
        "rope_type": "yarn",
        "rope_theta": float(rope_theta),
        "factor": float(factor),
        "original_max_position_embeddings": original_max_position_embeddings,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        # YaRN paper's attention temperature, the default of both libraries, written out.
        "attention_factor": 0.1 * math.log(factor) + 1.0,
        "truncate": True,
    }
    updates = {
        "rope_parameters": rope_parameters,
        "max_position_embeddings": int(round(factor * original_max_position_embeddings)),
    }
    return YarnOverrides(hf_config=_copy(updates), vllm_hf_overrides=_copy(updates))


def rope_theta_of(config: Any) -> float:
    """The base RoPE theta of an HF config, in the transformers 5 layout or the older one."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError(f"config of model_type {getattr(config, 'model_type', '?')!r} has no rope_theta")
    return float(theta)


def _copy(updates: dict[str, Any]) -> dict[str, Any]:
    # Separate dicts: one consumer mutating its copy (transformers does) must not change the other.
    return {k: dict(v) if isinstance(v, dict) else v for k, v in updates.items()}
