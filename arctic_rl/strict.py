"""The one strict pydantic base of every config, and the one formatter of its validation errors.

Every config model forbids unknown keys; an error names the dotted path, the value, and for an unknown key
the keys that are allowed there:

    train.stpes: Extra inputs are not permitted (allowed: steps, prompts_per_step, ppo_epochs, mini_batch_size, micro_batch_size)

A flat mapping that travels on its own (a loss_config, sampling_params, a recipe's options) is explained with
its `name`, in the words its users know from the request or the YAML they wrote:

    loss_config['clip_ratio'] = '0.2': expected a number
    unknown loss_config key(s) ['clip_ratio_hgih']; known: ['clip_ratio', 'clip_ratio_c', ...]
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from arctic_rl.errors import ConfigError

M = typing.TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `annotation` (X, X | None, Optional[X]), if there is one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _submodel(arg)
            if found is not None:
                return found
    return None


def _key(name: str, field: Any) -> str:
    return field.alias or name


def allowed_keys(model: type[BaseModel], path: tuple[Any, ...]) -> list[str] | None:
    """The keys the model accepts at `path` (a tuple of field names/aliases), or None where it is not a model."""
    cls = model
    for part in path:
        fields = {_key(n, f): f for n, f in cls.model_fields.items()} | dict(cls.model_fields)
        field = fields.get(str(part))
        sub = _submodel(field.annotation) if field is not None else None
        if sub is None:
            return None
        cls = sub
    return [_key(n, f) for n, f in cls.model_fields.items()]


def parse(
    model: type[M], data: Any, *, name: str | None = None, noun: str | None = None, context: dict | None = None
) -> M:
    """`model` validated from `data` (validators see `context`), or ConfigError (a ValueError) with explain's
    message."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as e:
        raise ConfigError(explain(e, model, name=name, noun=noun)) from None


MAX_SHOWN = 120  # characters of a value's repr in a message
MAX_KEYS_SHOWN = 20  # unknown keys named in a message


def _shown(value: Any) -> str:
    """repr of a value, cut: a value (or a key) may be a request's hostile megabyte."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _message(err: Any) -> str:
    return err["msg"].removeprefix("Value error, ")


def explain(
    e: ValidationError, model: type[BaseModel] | None = None, *, name: str | None = None, noun: str | None = None
) -> str:
    """One line per error: `dotted.path: message (got value)`; unknown keys list the allowed ones.

    With `name` (a flat mapping checked on its own) the errors read `name['key'] = value: message`, and the
    unknown keys together `unknown <noun>(s) [...]; known: [...]` (noun: `<name> key` unless given). A
    validator's message that starts with its field's key already names the field and the value: it reads
    `name message` (`recipe.options num_shots must be an integer >= 0, got -1`)."""
    if name is not None:
        return _explain_mapping(e, model, name, noun)
    lines = []
    for err in e.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(x) for x in loc)
        if err["type"] == "extra_forbidden":
            allowed = allowed_keys(model, loc[:-1]) if model is not None else None
            hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
            lines.append(f"{where}: {err['msg']}{hint}")
            continue
        msg = _message(err)
        val = err.get("input")
        shown = "" if isinstance(val, dict) or err["type"] in ("value_error", "missing") else f" (got {_shown(val)})"
        lines.append(f"{where}: {msg}{shown}" if where else f"{msg}{shown}")
    return "; ".join(lines)


def _explain_mapping(e: ValidationError, model: type[BaseModel] | None, name: str, noun: str | None) -> str:
    lines, unknown = [], []
    for err in e.errors():
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden" and len(loc) == 1:
            unknown.append(str(loc[0]))
            continue
        msg = _message(err)
        if not loc:  # a check across keys: its message names them
            lines.append(msg)
        elif msg.startswith(f"{loc[0]} "):
            lines.append(f"{name} {msg}")
        else:
            key = "".join(f"[{part!r}]" for part in loc)
            shown = "" if err["type"] == "missing" else f" = {_shown(err.get('input'))}"
            lines.append(f"{name}{key}{shown}: {msg}")
    if unknown:
        allowed = allowed_keys(model, ()) if model is not None else None
        known = f"; known: {sorted(allowed)}" if allowed else ""
        keys = [_shown(k) for k in sorted(unknown)[:MAX_KEYS_SHOWN]] + ["..."] * (len(unknown) > MAX_KEYS_SHOWN)
        lines.insert(0, f"unknown {noun or f'{name} key'}(s) [{', '.join(keys)}]{known}")
    return "; ".join(lines)
