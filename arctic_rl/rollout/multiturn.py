"""Multi-turn rollouts, token in and token out: a conversation is one token sequence that nothing decodes and
encodes again.

A conversation starts from its prompt's token ids. Each turn the sampler continues the sequence so far (token
ids in) and its tokens are appended exactly as it produced them, with their log-probs (loss mask 1). The
environment (arctic_rl.envs) reads the turn as text and answers; its observation becomes tokens once, through
the chat template (ObservationTemplate), and is appended after the model's tokens (loss mask 0, log-prob 0),
followed by the header of the next assistant turn (and the example's `assistant_prefix`, if its prompt
pre-fills the answer's opening: every turn then opens with it, and the environment reads it with the turn). The trainer then scores the very tokens the sampler made:
re-tokenizing a decoded conversation does not in general give them back (BPE merges across turn boundaries,
a turn cut inside a multi-byte character), which is the most reported multi-turn bug of the peers.

Layout of a sample (from_samples turns it into one batch row):
    prompt_token_ids   the rendered prompt, as for a single-turn step
    token_ids          turn 1 | observation 1 | turn 2 | observation 2 | turn 3      (one response)
    loss_mask          1...1  | 0.........0   | 1...1  | 0.........0   | 1...1
    logprobs           sampler's | 0.0        | sampler's | 0.0        | sampler's
A turn that does not end with the tokenizer's end-of-turn token (cut by a stop string) gets that token from the
template, masked like the observation. The episode ends when the environment says done (its reward), after
`max_turns` model turns, or when the next turn would not fit in `max_response_tokens` (finish "length": no
reward from the environment, 0.0; overlong.filter drops such rows from the loss as it drops cut answers).

Sampling: the first turn is the loop's request as made (n samples per prompt, the step's seed); later turns are
one request per turn for all conversations still going, n = 1 and no seed (one seed would give the conversations
of a group the same draws once their prefixes agree).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from arctic_rl.chat import ObservationTemplate
from arctic_rl.envs import Env, Step
from arctic_rl.errors import ConfigError

Generate = Callable[..., list[dict]]  # client.generate: (prompts, params, routing_keys=...) -> samples


@dataclass
class Conversation:
    prompt: list[int]
    env: Env
    budget: int  # response tokens this conversation may hold (turns and observations)
    prefix: str = ""  # the example's assistant_prefix: every turn opens with it (template tokens)
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)  # the model's turns as the environment read them
    sent: int = 0  # prompt tokens of its requests, over its turns
    cached: int = 0  # of those, found in the replica's prefix cache
    reward: float | None = None
    finish: str = ""

    def add(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None) -> None:
        self.tokens += ids
        self.mask += [mask] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    def sample(self, decode: Callable[[list[int]], str]) -> dict:
        return {
            "prompt_token_ids": list(self.prompt),
            "token_ids": list(self.tokens),
            "logprobs": list(self.logprobs),
            "loss_mask": list(self.mask),
            "text": decode(self.tokens),
            "turn_texts": list(self.turns),
            "prompt_tokens_sent": self.sent,
            "prompt_tokens_cached": self.cached,
            "num_turns": len(self.turns),
            "reward": 0.0 if self.reward is None else float(self.reward),
            "finish_reason": self.finish,
        }


def play(
    generate: Generate,
    prompts: list[list[int]],
    params: dict,
    examples: list[dict],
    envs: Callable[[], Env],
    template: ObservationTemplate,
    decode: Callable[[list[int]], str],
    *,
    max_turns: int,
    max_response_tokens: int | None = None,
    window: int | None = None,
) -> list[dict]:
    """Plays one conversation per sample (params["n"] per prompt, prompt-major, as `generate` returns them) to
    the end and returns one sample dict each (layout in the module docstring). `envs()` makes a fresh
    environment; conversation i is reset with examples[i // n]. A conversation's response (turns and
    observations) stays within max_response_tokens, and prompt plus response within the sampler's `window`."""
    if max_turns < 1:
        raise ConfigError(f"env.max_turns={max_turns}: a conversation needs at least one model turn")
    n = int(params.get("n", 1))
    turn_max = int(params.get("max_tokens", 16))
    convs = []
    for i, prompt in enumerate(p for p in prompts for _ in range(n)):
        env = envs()
        env.reset(examples[i // n])
        budget = min(max_response_tokens or sys.maxsize, (window or sys.maxsize) - len(prompt))
        prefix = str(examples[i // n].get("assistant_prefix", ""))
        convs.append(Conversation(list(prompt), env, budget=budget, prefix=prefix))
    # Routing: a group's conversations keep one key, so every turn goes to the replica that holds their prefix.
    tag = uuid.uuid4().hex[:12]
    answers = generate([list(p) for p in prompts], params, routing_keys=[f"{tag}-{g}" for g in range(len(prompts))])
    going = list(range(len(convs)))
    while going:
        if len(answers) != len(going):
            raise ValueError(f"the sampler answered {len(answers)} samples for {len(going)} conversations")
        still = []
        for i, out in zip(going, answers, strict=True):
            c = convs[i]
            c.sent += len(out.get("prompt_token_ids") or [])
            c.cached += int(out.get("num_cached_tokens") or 0)
            if _take_turn(c, out, template, decode, max_turns, turn_max):
                still.append(i)
        going = still
        if going:
            follow = {k: v for k, v in params.items() if k not in ("n", "seed")}
            answers = generate(
                [convs[i].prompt + convs[i].tokens for i in going],
                {**follow, "n": 1},
                routing_keys=[f"{tag}-{i // n}" for i in going],
            )
    return [c.sample(decode) for c in convs]


def _take_turn(
    c: Conversation,
    out: dict,
    template: ObservationTemplate,
    decode: Callable[[list[int]], str],
    max_turns: int,
    turn_max: int,
) -> bool:
    """Appends the model's turn and the environment's answer; True if the conversation goes on."""
    ids = list(out["token_ids"])
    c.add(ids, 1, out.get("logprobs") or [0.0] * len(ids))
    text = out["text"] if isinstance(out.get("text"), str) else decode(ids)  # as the sampler decoded it
    turn = c.prefix + text  # the environment reads the whole answer, pre-filled opening included
    c.turns.append(turn)
    if out.get("finish_reason") == "length":  # cut mid-turn: the environment never sees half a turn
        c.finish = "length"
        return False
    result: Step = c.env.step(turn)
    if result.done:
        c.reward, c.finish = result.reward, "stop"
        return False
    if len(c.turns) >= max_turns:
        c.finish = "length"  # out of turns without an answer
        return False
    obs = [] if ids and ids[-1] == template.eos_id else [template.eos_id]
    obs += template.ids(result.observation or "", c.prefix)
    if len(c.tokens) + len(obs) + turn_max > c.budget:
        c.finish = "length"  # the next turn would not fit
        return False
    c.add(obs, 0)
    return True
