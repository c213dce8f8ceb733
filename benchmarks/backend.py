"""Backend throughput on the demo model (SmolLM2-135M-Instruct), each next to its limit on the machine it runs on:

  weight sync   seconds per sync_weights, and its bandwidth vs a plain in-memory copy of the same bytes
  generate      sampled tokens/s (vLLM), n samples per prompt
  train         forward_backward tokens/s, and the model FLOP rate it reaches vs a dense matmul's
  sleep / wake  per engine (trainer with its optimizer state, reference, sampler at vLLM level 1): seconds,
                bytes moved to host memory and device memory released (0 on CPU, where the device is the host)

    python benchmarks/backend.py [--prompts 8] [--n 4] [--max-tokens 64] [--out runs/bench/backend.json]
A benchmark, not a test: numbers depend on the machine; run it alone. It writes its dated report to
docs/benchmarks/ (benchmarks/report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from report import Report, add_report_args

PROMPT = "Write a short story about a robot who learns to paint. Describe the colours it discovers."


def matmul_flops(dtype=torch.bfloat16, n=1024, reps=10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def copy_bandwidth(num_bytes: int) -> float:
    src = torch.empty(num_bytes // 2, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    dst.copy_(src)
    return num_bytes / (time.perf_counter() - t0)


def sleep_wake(client) -> dict[str, dict[str, float]]:
    """Each engine put to sleep and woken once, the trainer with its optimizer state (after a step)."""
    out = {}
    for engine in ("training", "reference", "sampling"):
        slept = client.sleep(engine)
        woke = client.wake(engine)
        out[engine] = {
            "sleep_s": slept["seconds"],
            "wake_s": woke["seconds"],
            "moved_bytes": slept["moved_bytes"],
            "freed_bytes": slept["freed_bytes"],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="runs/bench/backend.json")
    add_report_args(ap)
    a = ap.parse_args()
    report = Report.start("backend", "Backend throughput on the demo model (SmolLM2-135M-Instruct)", a)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
    from arctic_rl.batch import from_samples
    from arctic_rl.demo_model import demo_model_path

    model = demo_model_path()
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"{PROMPT} ({i})"}], tokenize=False, add_generation_prompt=True
        )
        for i in range(a.prompts)
    ]
    client = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(model),
            training_config={"dtype": "bfloat16", "zero_stage": 1, "micro_batch_size": 8},
            vllm_config={"max_seq_len": 1024},
        )
    )
    try:
        params = {"n": a.n, "max_tokens": a.max_tokens, "temperature": 1.0, "seed": 0, "ignore_eos": True}
        client.generate(prompts[:1], {**params, "n": 1, "max_tokens": 4})  # warm-up
        gen_s, tokens = [], 0
        for r in range(a.reps):
            t0 = time.perf_counter()
            samples = client.generate(prompts, {**params, "seed": r})
            gen_s.append(time.perf_counter() - t0)
            tokens = sum(len(s["token_ids"]) for s in samples)
        gen_tps = tokens / min(gen_s)

        batch = from_samples(samples, [i // a.n for i in range(len(samples))], tok.pad_token_id or 0)
        batch["old_log_probs"] = batch["rollout_log_probs"]
        batch["advantages"] = torch.randn(len(samples))
        num_tokens = int(batch["attention_mask"].sum())
        fb_s = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            client.forward_backward(batch, "grpo", {})
            fb_s.append(time.perf_counter() - t0)
        client.optimizer_step()
        sleep = sleep_wake(client)
        fb_tps = num_tokens / min(fb_s)
        num_params = 134_515_008  # SmolLM2-135M (embeddings tied)
        model_flops = 6 * num_params * fb_tps
        peak = matmul_flops()

        sync = [client.sync_weights() for _ in range(a.reps)]
        sync_s = min(s["sync_s"] for s in sync)
        num_bytes = num_params * 2
        bw = copy_bandwidth(num_bytes)
    finally:
        client.shutdown()

    result = {
        "weight_sync_s": sync_s,
        "weight_sync_GBps": num_bytes / sync_s / 1e9,
        "memcpy_GBps": bw / 1e9,
        "weight_sync_vs_memcpy": (num_bytes / sync_s) / bw,
        "generate_tokens_per_s": gen_tps,
        "generate_tokens": tokens,
        "train_tokens_per_s": fb_tps,
        "train_model_TFLOPs": model_flops / 1e12,
        "matmul_TFLOPs": peak / 1e12,
        "train_flop_utilization": model_flops / peak,
        "sleep_wake": sleep,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(
        f"weight sync      {sync_s:.3f} s  ({result['weight_sync_GBps']:.2f} GB/s; a plain memcpy of the same "
        f"{num_bytes / 1e6:.0f} MB: {bw / 1e9:.1f} GB/s -> {result['weight_sync_vs_memcpy']:.2%} of the limit)"
    )
    print(f"generate         {gen_tps:.0f} tokens/s ({tokens} tokens, {a.prompts} prompts x n={a.n})")
    print(
        f"forward_backward {fb_tps:.0f} tokens/s = {model_flops / 1e9:.1f} GFLOP/s of model math "
        f"(6 x params x tokens); bf16 matmul peak here {peak / 1e9:.1f} GFLOP/s -> {result['train_flop_utilization']:.1%}"
    )
    report.add(
        "rates beside their limits",
        op="sync_weights",
        measured=f"{sync_s:.3f} s = {result['weight_sync_GBps']:.2f} GB/s",
        limit=f"plain memcpy of the same {num_bytes / 1e6:.0f} MB: {bw / 1e9:.1f} GB/s",
        **{"fraction of limit": f"{result['weight_sync_vs_memcpy']:.2%}"},
    )
    report.add(
        "rates beside their limits",
        op="generate",
        measured=f"{gen_tps:.0f} tokens/s ({tokens} tokens, {a.prompts} prompts x n={a.n})",
        limit="",
        **{"fraction of limit": ""},
    )
    report.add(
        "rates beside their limits",
        op="forward_backward",
        measured=f"{fb_tps:.0f} tokens/s = {model_flops / 1e9:.1f} GFLOP/s (6 x params x tokens)",
        limit=f"bf16 matmul peak {peak / 1e9:.1f} GFLOP/s",
        **{"fraction of limit": f"{result['train_flop_utilization']:.1%}"},
    )
    for engine, r in sleep.items():
        print(
            f"sleep/wake {engine:<9} {r['sleep_s']:.3f} s / {r['wake_s']:.3f} s, {r['moved_bytes'] / 2**20:.1f} MiB "
            f"moved, {r['freed_bytes'] / 2**20:.1f} MiB of device memory released"
        )
        report.add(
            "sleep and wake per engine",
            engine=engine,
            **{
                "sleep (s)": f"{r['sleep_s']:.3f}",
                "wake (s)": f"{r['wake_s']:.3f}",
                "moved to host (MiB)": f"{r['moved_bytes'] / 2**20:.1f}",
                "device memory released (MiB)": f"{r['freed_bytes'] / 2**20:.1f}",
            },
        )
    report.note("weight sync includes its norm and log-prob checks; generate has no limit measured here.")
    report.note(
        "sleep/wake: on CPU the device is the host, so nothing is released (the moves still run); the sampler "
        "has no sleep mode on CPU (vLLM's is CUDA only) and moves nothing there."
    )
    report.write()
    print(f"summary: sync {sync_s:.2f}s, generate {gen_tps:.0f} tok/s, train {fb_tps:.0f} tok/s -> {a.out}")


if __name__ == "__main__":
    main()
