"""ZoRRo Train vs the naive padded batch: forward+backward time, peak memory, and the FLOP limit.

Workload W1: one prompt of 1024 tokens, G = 16 responses of 128 tokens, fp32 on CPU.
  baseline  what verl does: the padded [B, P+R] batch through the model, logits for every token
            ([B, T, V] fp32), log-softmax + entropy over the response columns, loss, backward.
  zorro     arctic_rl.zorro.train.zorro_log_probs: [prompt][resp_1]..[resp_G] packed, chunked head.
            Both attention forms are timed: "split" (two CPU-flash passes merged by LSE, the default
            on CPU) and "concat" (each response vs [prompt keys; own keys] in one SDPA call).

Times are the minimum over interleaved steps: wall clock, and the process's CPU time (robust when
other processes share the cores). The FLOP limit counts matmul FLOPs from the model's shapes (x3 for forward+backward, both sides):
linear layers per token (baseline B*(P+R) tokens, ZoRRo P + G*R), LM head per token (baseline all
tokens, ZoRRo only the G*R predicted ones) and attention per causal query-key pair.
Peak memory is the resident high-water mark above the level before the step (VmHWM, reset just
before it), measured in a fresh subprocess per variant.

    python benchmarks/zorro_train.py                 # W1 on both models (a few minutes on 2 cores)
    python benchmarks/zorro_train.py --quick         # small sizes, for development
    python benchmarks/zorro_train.py --device cuda   # bf16 on a GPU, Llama-3.2-1B's shape added; peak
                                                     # memory is torch's CUDA allocator high-water mark

Multi-turn groups, where rows share more than the prompt (ZoRRo on prefix trees beside this one-prompt ZoRRo):
benchmarks/zorro_tree.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from report import Report, add_report_args
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from arctic_rl.zorro.train import zorro_log_probs

MODELS = {
    # the model: hidden 256, 4 layers, 4 heads / 2 KV heads, MLP 512, vocab 4096
    "small": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=4096,
    ),
    # wider: linear layers dominate attention
    "wide": dict(
        hidden_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=2048,
        vocab_size=4096,
    ),
    # Llama-3.2-1B's shape (random weights), for GPUs
    "llama-1b": dict(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
    ),
}


def variants(device: str) -> tuple[str, ...]:
    if device == "cpu":
        return ("naive", "split", "concat")
    try:
        import flash_attn  # noqa: F401

        return ("naive", "concat", "torch_varlen", "flash_varlen")
    except ImportError:
        return ("naive", "concat", "torch_varlen")


def build(
    model_name: str, P: int, R: int, G: int, seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32
):
    torch.manual_seed(seed)
    cfg = LlamaConfig(**MODELS[model_name], max_position_embeddings=P + R + 8)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):  # initialised where it runs: a 1B model's init on the CPU takes long
        model = LlamaForCausalLM(cfg).to(dtype).train()
    prompt = torch.randint(1, cfg.vocab_size, (P,))
    resp = torch.randint(1, cfg.vocab_size, (G, R))
    ids = torch.cat([prompt.expand(G, P), resp], 1)
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "responses": resp,
        "response_mask": torch.ones_like(resp),
        "uid": ["p0"] * G,
        "advantages": torch.randn(G),
        "old_log_probs": -torch.rand(G, R),
    }
    return model, {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def verl_log_probs(model, batch) -> dict:
    """verl's actor: full logits, then log-softmax / entropy over the response columns."""
    R = batch["responses"].shape[1]
    pos = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=pos, use_cache=False
    ).logits
    logits = logits[:, -R - 1 : -1].float()
    logp = torch.log_softmax(logits, -1)
    entropy = torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
    return {"log_probs": logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1), "entropy": entropy}


def step(model, batch, variant: str) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    if variant == "naive":
        out = verl_log_probs(model, batch)
    else:
        out = zorro_log_probs(model, batch, pp_config={"compute_entropy": True}, attention=variant)
    m = batch["response_mask"].float()
    ratio = torch.exp(out["log_probs"] - batch["old_log_probs"])
    loss = ((-ratio * batch["advantages"].unsqueeze(1) - 0.01 * out["entropy"]) * m).sum() / m.sum()
    loss.backward()
    return loss.detach()


def flops(model_name: str, P: int, R: int, G: int) -> dict:
    c = MODELS[model_name]
    h, L, nh, nkv, f, V = (
        c["hidden_size"],
        c["num_hidden_layers"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["intermediate_size"],
        c["vocab_size"],
    )
    d = h // nh
    linear_tok = 2 * L * (h * nh * d + 2 * h * nkv * d + nh * d * h + 3 * h * f)
    head_tok = 2 * h * V
    attn_pair = 4 * L * nh * d

    def causal(n):
        return n * (n + 1) // 2

    naive_tok, zorro_tok = G * (P + R), P + G * R
    naive = naive_tok * (linear_tok + head_tok) + G * causal(P + R) * attn_pair
    zorro = zorro_tok * linear_tok + G * R * head_tok + (causal(P) + G * (R * P + causal(R))) * attn_pair
    zorro_head_all = zorro + P * head_tok  # if ZoRRo also ran the head over prompt tokens
    # the padded batch with the LM head over response positions only (arctic-rl's engine without ZoRRo)
    naive_response_head = naive - G * P * head_tok
    return {
        "naive": 3 * naive,
        "zorro": 3 * zorro,
        "limit": naive / zorro,
        "limit_head_all": naive / zorro_head_all,
        "limit_response_head": naive_response_head / zorro,
        "linear_limit": naive_tok / zorro_tok,
        "attn_limit": (G * causal(P + R)) / (causal(P) + G * (R * P + causal(R))),
    }


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_worker(model_name, variant, P, R, G) -> None:
    """One step in a fresh process: resident high-water mark (VmHWM, reset just before) minus the
    resident size before the step. Imports and model building do not count."""
    model, batch = build(model_name, P, R, G)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    base = _status_bytes("VmRSS")
    step(model, batch, variant)
    print(json.dumps({"peak_bytes": max(0, _status_bytes("VmHWM") - base)}))


def peak_memory(model_name, variant, P, R, G) -> int:
    cmd = [
        sys.executable,
        __file__,
        "--memory-worker",
        model_name,
        variant,
        "--prompt",
        str(P),
        "--response",
        str(R),
        "--group",
        str(G),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])["peak_bytes"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="small,wide")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3, help="timed steps per variant (interleaved; min reported)")
    ap.add_argument("--quick", action="store_true", help="prompt 256, response 32, G 8, 2 reps")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("outputs/bench_zorro_train"), help="where the plot goes")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--profile", action="store_true", help="CUDA: the top kernels of one step per variant")
    ap.add_argument("--memory-worker", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    add_report_args(ap)
    args = ap.parse_args()
    P, R, G = args.prompt, args.response, args.group
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    VARIANTS = variants(args.device)
    if cuda and args.models == "small,wide":
        args.models = "small,wide,llama-1b"
    if args.memory_worker:
        memory_worker(*args.memory_worker, P, R, G)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        P, R, G, args.reps = 256, 32, 8, 2
    report = Report.start(
        "zorro_train_cuda" if cuda else "zorro_train",
        f"ZoRRo Train vs the naive padded batch (prompt {P}, response {R}, G {G}, {str(dtype)[6:]}, {args.device})",
        args,
        device=args.device,
        bandwidth=not cuda,
    )
    report.note(
        "speedup = naive / variant time (min over interleaved steps); FLOP limit = naive / ZoRRo matmul FLOPs "
        "from the model's shapes. matmul GFLOP/s = each side's matmul FLOPs over its time: where both run at the "
        "same rate the wall speedup equals the FLOP limit; above it, the naive side also paid memory-bound work "
        "(full logits, more activations) that ZoRRo skips. Peak memory: resident high-water mark above the level "
        "before the step (CPU, fresh process per variant) or the CUDA allocator's."
    )
    load = os.getloadavg()[0]
    where = (
        torch.cuda.get_device_name()
        if cuda
        else f"load average {load:.1f} on {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    )
    print(
        f"ZoRRo Train benchmark ({where}): prompt {P}, response {R}, G {G}, {str(dtype)[6:]}, torch {torch.__version__}"
    )
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    summary = []
    panels: dict[str, list[tuple[str, float, float]]] = {}
    for name in args.models.split(","):
        model, batch = build(name, P, R, G, device=args.device, dtype=dtype)
        fl = flops(name, P, R, G)
        # exactness on this very batch, before timing
        with torch.no_grad():
            ref = verl_log_probs(model, batch)
            z = zorro_log_probs(model, batch, pp_config={"compute_entropy": True})
        err = max((ref[k] - z[k]).abs().max().item() for k in ("log_probs", "entropy"))
        del ref, z
        times = {v: [] for v in VARIANTS}
        cpu = {v: [] for v in VARIANTS}
        for v in VARIANTS:  # warm-up
            step(model, batch, v)
        for _ in tqdm(range(args.reps), desc=f"{name}: timing", leave=False):
            for v in VARIANTS:  # interleaved so that load from other processes hits all alike
                sync()
                t0, c0 = time.perf_counter(), time.process_time()
                step(model, batch, v)
                sync()
                times[v].append(time.perf_counter() - t0)
                cpu[v].append(time.process_time() - c0)
        best = {v: min(ts) for v, ts in times.items()}
        if args.profile and cuda:
            from torch.profiler import ProfilerActivity, profile

            for v in VARIANTS:
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    step(model, batch, v)
                    sync()
                print(f"\n{name} / {v}: top CUDA ops of one step")
                print(
                    prof.key_averages().table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=60)
                )
        best_cpu = {v: min(ts) for v, ts in cpu.items()}
        mem = {}
        if not args.no_memory and cuda:
            for v in VARIANTS:  # the allocator's high-water mark above what is held before the step
                model.zero_grad(set_to_none=True)
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                step(model, batch, v)
                mem[v] = torch.cuda.max_memory_allocated() - base
        elif not args.no_memory:
            for v in tqdm(VARIANTS, desc=f"{name}: memory", leave=False):
                mem[v] = peak_memory(name, v, P, R, G)
        c = MODELS[name]
        print(
            f"\nmodel {name}: hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
            f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads, MLP {c['intermediate_size']}, "
            f"vocab {c['vocab_size']}; tokens {G * (P + R)} -> {P + G * R}; max |log-prob/entropy diff| {err:.1e}"
        )
        print(
            f"  FLOP limit {fl['limit']:.2f}x  (linear {fl['linear_limit']:.2f}x, attention pairs "
            f"{fl['attn_limit']:.2f}x; {fl['limit_head_all']:.2f}x if the LM head also ran on prompt tokens)"
        )
        print(
            f"  {'variant':8s} {'wall s':>8s} {'speedup':>8s} {'% limit':>8s} {'cpu s':>8s} {'speedup':>8s} "
            f"{'peak MiB':>9s} {'mem ratio':>9s}"
        )
        for v in VARIANTS:
            sp, sp_cpu = best["naive"] / best[v], best_cpu["naive"] / best_cpu[v]
            mem_s = f"{mem[v] / 2**20:9.0f}" if mem else f"{'-':>9s}"
            ratio = f"{mem[v] / mem['naive']:9.3f}" if mem else f"{'-':>9s}"
            pct = "       -" if v == "naive" else f"{100 * sp / fl['limit']:7.1f}%"
            print(f"  {v:8s} {best[v]:8.3f} {sp:7.2f}x {pct} {best_cpu[v]:8.3f} {sp_cpu:7.2f}x {mem_s} {ratio}")
            report.add(
                f"model {name}: hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
                f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads, MLP {c['intermediate_size']}, "
                f"vocab {c['vocab_size']}",
                variant=v,
                **{"wall s": best[v], "speedup": f"{sp:.2f}x", "FLOP limit": f"{fl['limit']:.2f}x"},
                **{"% of limit": "" if v == "naive" else f"{100 * sp / fl['limit']:.0f}%"},
                **{"CPU-time speedup": f"{sp_cpu:.2f}x" if not cuda else ""},
                **{"matmul GFLOP/s": fl["naive" if v == "naive" else "zorro"] / best[v] / 1e9},
                **{"peak MiB": mem[v] / 2**20 if mem else "", "memory ratio": mem[v] / mem["naive"] if mem else ""},
                **{"max abs diff": f"{err:.1e}"},
            )
        panels[f"{name}: hidden {c['hidden_size']}, MLP {c['intermediate_size']}"] = [
            (v, best["naive"] / best[v], fl["limit"]) for v in VARIANTS if v != "naive"
        ]
        pick = min(VARIANTS[1:], key=lambda v: best[v])
        sp = best["naive"] / best[pick]
        summary.append(
            f"{name}: {sp:.2f}x ({100 * sp / fl['limit']:.0f}% of {fl['limit']:.2f}x limit)"
            + (f", memory {mem[pick] / mem['naive']:.2f}x" if mem else "")
            + f" [{pick}]"
        )
        del model, batch
        gc.collect()
    from plots import speedup_png

    png = speedup_png(
        args.out / ("zorro_train_cuda.png" if cuda else "zorro_train.png"),
        panels,
        f"ZoRRo Train vs naive forward+backward (prompt {P}, response {R}, G {G}, "
        + ("bf16 " + torch.cuda.get_device_name() if cuda else "fp32 CPU")
        + ")",
    )
    print("\nsummary: " + "; ".join(summary) + f"; plot {png}")
    report.note(f"Plot: `{png}` (not committed).")
    report.write()


if __name__ == "__main__":
    main()
