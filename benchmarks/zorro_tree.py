"""ZoRRo Train on prefix trees vs ZoRRo on the prompt alone vs the naive batch, on multi-turn groups.

Workload, shaped like a multi-turn text-to-SQL group: G rows share a prompt of P tokens; each row is turn 1
(T tokens), its tool's answer (T), turn 2 (T), that answer (T) and a final answer (T), fp32 on CPU. How much the
rows share past the prompt is the case:
  shared-turn-1   every row made the same first query (so got the same answer); two branches of G/2 rows share
                  their second query and answer; the final answers differ
  nothing-shared  the rows differ from their first token (the tree is the flat plan: what does it cost?)
Variants: naive (arctic_rl.engines.forward.naive_log_probs on the padded batch), flat (zorro_log_probs: the
prompt once), tree (zorro_log_probs(prefix_tree=True)). Each step is forward + backward of a loss over the
response log-probs and entropy; times are the minimum over interleaved steps (wall and process CPU time).
The limit is the ratio of matmul FLOPs (x3 for forward + backward): linear layers per packed token, the LM head
per predicted token, attention per query-key pair, counted from each variant's own packing.

    python benchmarks/zorro_tree.py            # a few minutes on 2 cores
    python benchmarks/zorro_tree.py --quick    # small sizes, for development
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from report import Report, add_report_args
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM
from zorro_train import MODELS

from arctic_rl.engines.forward import naive_log_probs
from arctic_rl.zorro.train import build_plan, zorro_log_probs
from arctic_rl.zorro.tree import build_tree_plan

MODEL = MODELS["small"]  # benchmarks/zorro_train.py's hidden-256 model
VARIANTS = ("naive", "flat", "tree")


def rows_of(case: str, G: int, T: int, gen: torch.Generator) -> list[torch.Tensor]:
    """The G responses of one group (token ids), built from segments of T tokens."""

    def seg() -> torch.Tensor:
        return torch.randint(3, MODEL["vocab_size"], (T,), generator=gen)

    if case == "nothing-shared":
        return [torch.cat([seg() for _ in range(5)]) for _ in range(G)]
    turn1 = torch.cat([seg(), seg()])  # query and its answer
    branches = [torch.cat([seg(), seg()]) for _ in range(2)]
    return [torch.cat([turn1, branches[i * 2 // G], seg()]) for i in range(G)]


def make_batch(case: str, P: int, G: int, T: int, groups: int, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    R = 5 * T
    ids, uid = [], []
    for q in range(groups):
        prompt = torch.randint(3, MODEL["vocab_size"], (P,), generator=gen)
        for resp in rows_of(case, G, T, gen):
            ids.append(torch.cat([prompt, resp]))
            uid.append(f"q{q}")
    input_ids = torch.stack(ids)
    mask = torch.ones_like(input_ids)
    loss_mask = torch.zeros(len(ids), R, dtype=torch.long)
    for turn in (0, 2, 4):  # the model's turns; the tool answers in between are not trained on
        loss_mask[:, turn * T : (turn + 1) * T] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "responses": input_ids[:, P:],
        "response_mask": loss_mask,
        "uid": uid,
    }


def step(model, batch, variant: str) -> None:
    model.zero_grad(set_to_none=True)
    kw = {"pp_config": {"compute_entropy": True}}
    if variant == "naive":
        out = naive_log_probs(model, batch, **kw)
    else:
        out = zorro_log_probs(model, batch, prefix_tree=variant == "tree", **kw)
    m = batch["response_mask"].float()
    ((-out["log_probs"] - 0.01 * out["entropy"]) * m).sum().div(m.sum()).backward()


def flops(model, batch) -> dict[str, float]:
    """Matmul FLOPs of forward + backward per variant, from each variant's packing."""
    c = model.config
    linear = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
    linear -= c.vocab_size * c.hidden_size  # the LM head is counted per predicted token
    head, attn = c.hidden_size * c.vocab_size, 2 * c.hidden_size * c.num_hidden_layers  # per token / per pair
    B, T = batch["input_ids"].shape
    R = batch["responses"].shape[1]
    naive_pairs = B * T * (T + 1) / 2
    flat = build_plan(batch)
    flat_pairs = 0.0
    for g in flat.groups:
        p = g.prompt_len
        flat_pairs += p * (p + 1) / 2 + sum(r * p + r * (r + 1) / 2 for r in g.resp_lens)
    tree = build_tree_plan(batch)
    tree_pairs = sum(n.length * len(n.context) + n.length * (n.length + 1) / 2 for n in tree.nodes)

    def total(tokens: float, predicted: float, pairs: float) -> float:
        return 3 * 2 * (linear * tokens + head * predicted + attn * pairs)

    return {
        "naive": total(B * T, B * R, naive_pairs),
        "flat": total(flat.num_tokens, len(flat.labels), flat_pairs),
        "tree": total(tree.num_tokens, len(tree.labels), tree_pairs),
        "tokens": {"naive": B * T, "flat": flat.num_tokens, "tree": tree.num_tokens},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--turn", type=int, default=64, help="tokens of each turn and each tool answer")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="timed steps per variant (interleaved; min reported)")
    ap.add_argument("--quick", action="store_true", help="prompt 128, turns 16, 1 group, 2 reps")
    ap.add_argument("--out", type=Path, default=Path("outputs/bench_zorro_tree"), help="where the plot goes")
    add_report_args(ap)
    args = ap.parse_args()
    P, T, G = args.prompt, args.turn, args.group
    if args.quick:
        P, T, args.groups, args.reps = 128, 16, 1, 2
    title = f"ZoRRo on prefix trees, multi-turn groups (prompt {P}, 5 segments of {T}, G {G}, {args.groups} groups)"
    report = Report.start("zorro_tree", title, args)
    report.note(
        "speedup = baseline time / variant time (min over interleaved steps); limit = baseline / variant matmul "
        "FLOPs from each one's packing. Rows: each case against naive, and tree against flat (the prompt-only ZoRRo "
        "it extends). max abs diff: tree's log-probs and entropy against naive on the case's batch."
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(**MODEL, max_position_embeddings=P + 5 * T + 8)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).train()
    print(f"{title}; {torch.get_num_threads()} threads")
    summary, panels = [], {}
    for case in ("shared-turn-1", "nothing-shared"):
        batch = make_batch(case, P, G, T, args.groups)
        fl = flops(model, batch)
        with torch.no_grad():
            ref = naive_log_probs(model, batch, pp_config={"compute_entropy": True})
            got = zorro_log_probs(model, batch, pp_config={"compute_entropy": True}, prefix_tree=True)
        err = max(float((ref[k] - got[k]).abs().max()) for k in ref)
        times = {v: [] for v in VARIANTS}
        cpu = {v: [] for v in VARIANTS}
        for v in VARIANTS:
            step(model, batch, v)  # warm-up
        for _ in tqdm(range(args.reps), desc=f"{case}: timing", leave=False):
            for v in VARIANTS:
                t0, c0 = time.perf_counter(), time.process_time()
                step(model, batch, v)
                times[v].append(time.perf_counter() - t0)
                cpu[v].append(time.process_time() - c0)
        best = {v: min(t) for v, t in times.items()}
        best_cpu = {v: min(t) for v, t in cpu.items()}
        print(f"\n{case}: packed tokens {fl['tokens']}; max |tree - naive| {err:.1e}")
        for base, v in (("naive", "flat"), ("naive", "tree"), ("flat", "tree")):
            sp, limit = best[base] / best[v], fl[base] / fl[v]
            print(f"  {v} vs {base}: {sp:.2f}x (limit {limit:.2f}x), CPU time {best_cpu[base] / best_cpu[v]:.2f}x")
            report.add(
                case,
                comparison=f"{v} vs {base}",
                **{"baseline s": best[base], "variant s": best[v], "speedup": f"{sp:.2f}x"},
                **{"FLOP limit": f"{limit:.2f}x", "% of limit": f"{100 * sp / limit:.0f}%"},
                **{"CPU-time speedup": f"{best_cpu[base] / best_cpu[v]:.2f}x"},
                **{"packed tokens": f"{fl['tokens'][base]} -> {fl['tokens'][v]}", "max abs diff": f"{err:.1e}"},
            )
        panels[case] = [(v, best["naive"] / best[v], fl["naive"] / fl[v]) for v in ("flat", "tree")]
        summary.append(
            f"{case}: tree {best['naive'] / best['tree']:.2f}x naive, {best['flat'] / best['tree']:.2f}x flat "
            f"(limit {fl['flat'] / fl['tree']:.2f}x)"
        )
    from plots import speedup_png

    png = speedup_png(args.out / "zorro_tree.png", panels, f"ZoRRo prefix trees vs naive ({title[29:]})")
    report.note(f"Plot: `{png}` (not committed).")
    path = report.write()
    print("\nsummary: " + "; ".join(summary) + f"; report {path}")


if __name__ == "__main__":
    main()
