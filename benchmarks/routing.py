"""Conversation routing on two sampler replicas: prefix-cache hits and time, sticky routing vs contiguous slices.

A multi-turn rollout sends every conversation back to the sampler once per turn with its whole history as the
prompt. With `routing_keys` (what arctic_rl.rollout.multiturn.play passes: one key per group) the controller
sends each conversation to the replica that served its earlier turns, whose prefix cache holds that history
(arctic_rl/server/routing.py). Without keys the controller cuts each request into contiguous slices, one per
replica: as conversations end, the later turns' slices shift, and a conversation can land on the replica that
never saw it. Both modes play the same kind of episodes on one deployment (the demo model, 2 vLLM-CPU replicas,
prefix caching on), interleaved, each repetition on prompts of its own (so no mode finds the other's prefixes).

Measured per mode: the prefix-cache hit rate of the follow-up turns (vLLM's num_cached_tokens over the prompt
tokens sent, turns 2+) and the wall time of the episodes. The limit: the hit rate if every follow-up found its
whole previous request and answer cached, in whole blocks (what a prefix cache can hold). Conversations end
after 2 to 4 turns, drawn per conversation (the same draws for both modes of a repetition), so the set still
going changes from turn to turn. A mode's episodes are its own prompts and samples: compare hit rates with their
limits, and times together with the tokens sent.

    python benchmarks/routing.py            # a few minutes on 2 cores
    python benchmarks/routing.py --quick    # 1 repetition, 4 prompts
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from report import Report, add_report_args
from tqdm import tqdm

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.chat import ObservationTemplate
from arctic_rl.envs import Step
from arctic_rl.rollout.multiturn import play

BLOCK = 32  # tokens per KV block (the sampler is given it; vLLM-CPU takes multiples of 32)
MAX_TURNS = 4
TABLE = "\n".join(f"| {i} | customer_{i} | {1000 + 37 * i} | 2024-0{1 + i % 9}-1{i % 10} |" for i in range(12))


class ToolRows:
    """Answers each turn with a table of rows (a tool's result); done after 2 to MAX_TURNS model turns, drawn per
    conversation (conversations of one group end at different turns, as real ones do)."""

    draw = random.Random(0)

    def reset(self, example):
        self.seen, self.turns = 0, self.draw.randint(2, MAX_TURNS)

    def step(self, turn: str) -> Step:
        self.seen += 1
        if self.seen >= self.turns:
            return Step(done=True, reward=1.0)
        return Step(observation=f"rows for query {self.seen}:\n{TABLE}")


def prompts_for(tok, rep: int, mode: str, count: int) -> list[list[int]]:
    """Prompts of their own for each (repetition, mode): a schema-sized question, different in its first line."""
    out = []
    for i in range(count):
        q = f"[{mode} {rep} {i}] Which customers spent the most? Write SQL over this schema.\n" + TABLE
        text = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


def episodes(client, tok, prompts, params, sticky: bool, rep: int) -> tuple[list[dict], dict, float]:
    """Plays one repetition; returns the samples, the follow-up turns' prompt tokens sent and cached, and seconds.
    Both modes of a repetition draw the same turn counts (conversation i ends after the same turn)."""
    ToolRows.draw = random.Random(rep)
    follow = {"sent": 0, "cached": 0}
    calls = 0

    def generate(p, sp, routing_keys=None):
        nonlocal calls
        out = client.generate(p, sp, routing_keys=routing_keys if sticky else None)
        if calls:  # turn 2 on: what routing decides
            follow["sent"] += sum(len(s["prompt_token_ids"]) for s in out)
            follow["cached"] += sum(int(s.get("num_cached_tokens") or 0) for s in out)
        calls += 1
        return out

    t0 = time.perf_counter()
    samples = play(
        generate,
        prompts,
        params,
        [{} for _ in prompts],
        ToolRows,
        ObservationTemplate(tok),
        tok.decode,
        max_turns=MAX_TURNS,
        window=2048,
    )
    return samples, follow, time.perf_counter() - t0


def follow_up_limit(samples: list[dict]) -> int:
    """The most prompt tokens of the follow-up turns a block-granular prefix cache could serve: a follow-up's
    prompt begins with its previous request and answer, whose KV the replica computed (all but the last token
    sampled), in whole blocks."""
    best = 0
    for s in samples:
        prompt, mask = len(s["prompt_token_ids"]), s["loss_mask"]
        last_model = None  # the previous answer's last token (mask 1 before an observation)
        for j in range(1, len(mask)):
            if mask[j - 1] == 1:
                last_model = j - 1
            if mask[j - 1] == 0 and mask[j] == 1 and last_model is not None:  # a follow-up request starts here
                best += (prompt + last_model) // BLOCK * BLOCK
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per repetition (4 conversations each)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="4 prompts, 1 repetition")
    add_report_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.reps = 4, 1
    from transformers import AutoTokenizer

    from arctic_rl.demo_model import demo_model_path

    model = str(demo_model_path())
    tok = AutoTokenizer.from_pretrained(model)
    title = f"Conversation routing on 2 sampler replicas ({args.prompts} prompts x 4, 2-{MAX_TURNS} turns)"
    report = Report.start("routing", title, args)
    client = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=model,
            sampling_gpus=2,
            use_reference=False,
            vllm_config={"max_seq_len": 2048, "engine_kwargs": {"block_size": BLOCK}},
        )
    )
    # a turn ends at a line break (a turn cut at max_tokens would end its conversation: rollout/multiturn.py)
    params = {"n": 4, "max_tokens": 48, "temperature": 1.0, "seed": 7, "stop": ["\n"]}
    rows: dict[str, dict] = {
        m: {"sent": 0, "cached": 0, "limit": 0, "all_sent": 0, "all_cached": 0, "secs": []}
        for m in ("sticky", "contiguous")
    }
    try:
        for rep in tqdm(range(args.reps), desc="repetitions"):
            for mode in ("sticky", "contiguous") if rep % 2 == 0 else ("contiguous", "sticky"):
                prompts = prompts_for(tok, rep, mode, args.prompts)
                samples, follow, secs = episodes(client, tok, prompts, params, mode == "sticky", rep)
                r = rows[mode]
                r["secs"].append(secs)
                r["sent"] += follow["sent"]
                r["cached"] += follow["cached"]
                r["limit"] += follow_up_limit(samples)
                r["all_sent"] += sum(s["prompt_tokens_sent"] for s in samples)
                r["all_cached"] += sum(s["prompt_tokens_cached"] for s in samples)
    finally:
        client.shutdown()
    summary = []
    for mode, r in rows.items():
        rate, limit = r["cached"] / max(1, r["sent"]), r["limit"] / max(1, r["sent"])
        report.add(
            "modes",
            mode=mode,
            **{"follow-up hit rate": f"{rate:.1%}", "limit": f"{limit:.1%}", "% of limit": f"{rate / limit:.0%}"},
            **{"follow-up prompt tokens": r["sent"], "cached": r["cached"]},
            **{"all turns' hit rate": f"{r['all_cached'] / max(1, r['all_sent']):.1%}"},
            **{"episodes s (min)": min(r["secs"]), "episodes s (mean)": sum(r["secs"]) / len(r["secs"])},
        )
        summary.append(
            f"{mode} {rate:.1%} of follow-up prompt tokens cached (limit {limit:.1%}), {min(r['secs']):.1f} s"
        )
    report.note(
        "follow-up hit rate = vLLM's num_cached_tokens / prompt tokens sent, over the requests of turns 2 and later "
        f"(what routing decides); limit = what a {BLOCK}-token-block prefix cache could serve of them: each one's "
        "previous request and answer. All turns' hit rate includes turn 1, where the n samples of a prompt and the "
        "chat template's system prompt hit alike in both modes. Episodes s: play() of one repetition (prompts of "
        "its own per mode, modes interleaved)."
    )
    path = report.write()
    print("summary: " + "; ".join(summary) + f"; report {path}")


if __name__ == "__main__":
    main()
