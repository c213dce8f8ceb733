"""Chat turns as tokens: what the chat template appends after an assistant turn, rendered once and never from a
conversation's decoded text. Used by multi-turn rollouts (arctic_rl.rollout.multiturn) and the OpenAI-compatible
front (arctic_rl.server.openai_api), so a conversation stays the token sequence the sampler produced.
"""

from __future__ import annotations

from arctic_rl.errors import ConfigError

_PROBE = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


class ObservationTemplate:
    """The tokens that show an observation to the model: the end of the model's turn as the chat template writes
    it, the observation as a `role` message, and the header of the next assistant turn. Rendered from the
    tokenizer's own chat template, once per observation, never from the conversation's decoded text."""

    def __init__(self, tokenizer, role: str = "user"):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"multi-turn rollouts render observations with the tokenizer's chat template, and "
                f"{type(tokenizer).__name__} has none: use an instruct model (or set tokenizer.chat_template)"
            )
        eos = tokenizer.eos_token
        if eos is None:
            raise ConfigError("multi-turn rollouts need the tokenizer's eos_token (the end of an assistant turn)")
        self.tokenizer, self.role = tokenizer, role
        self.eos_id = tokenizer.convert_tokens_to_ids(eos)
        base = tokenizer.apply_chat_template(_PROBE, tokenize=False)
        if eos not in base:
            raise ConfigError(f"the chat template does not end an assistant turn with eos_token {eos!r}")
        # What the template writes after the assistant's end-of-turn token ("\n" in ChatML): it belongs to
        # the observation's tokens, since the model's turn ends at its eos.
        self._after_eos = base[base.rindex(eos) + len(eos) :]
        self._base = base

    def ids(self, observation: str, assistant_prefix: str = "") -> list[int]:
        """The observation's tokens, ending with the next assistant turn's header and `assistant_prefix` (the
        example's pre-filled opening of every answer, as its prompt has it)."""
        return self.messages_ids([{"role": self.role, "content": observation}], assistant_prefix)

    def messages_ids(self, messages: list[dict], assistant_prefix: str = "") -> list[int]:
        """The tokens of `messages` (tool results, user turns) following an assistant turn, through the header
        of the next assistant turn and `assistant_prefix`."""
        full = self.tokenizer.apply_chat_template([*_PROBE, *messages], tokenize=False, add_generation_prompt=True)
        if not full.startswith(self._base):
            raise ConfigError(
                "the chat template renders a conversation's earlier turns differently once a message follows "
                "them, so observations cannot be appended as tokens; use a template that only appends"
            )
        text = self._after_eos + full[len(self._base) :] + assistant_prefix
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
