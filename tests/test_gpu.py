"""The GPU checks: run with `scripts/gpu_check.sh` on a CUDA machine (skipped everywhere else).

They need the `gpu` extra (CUDA torch, vllm 0.32, flash-attn) and DeepSpeed. Each one is the CUDA
counterpart of a CPU test that runs in CI:
  ZoRRo Train through flash-attn's varlen kernel   <- test_zorro_train (SDPA stand-in for the kernel)
  ZoRRo Inference's FLASH_ATTN step, real kernel   <- test_cascade_attention (torch stand-in)
  vLLM on CUDA with the ZoRRo backend installed    <- the vLLM-CPU end-to-end test
  the backend on one GPU: DeepSpeed + vLLM + sync  <- test_backend
None of these has run yet (no GPU in the workplace where they were written).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU checks (scripts/gpu_check.sh)")]


def test_zorro_train_flash_varlen_matches_split_on_cuda():
    """bf16 on CUDA: the flash-attn varlen backend = the split (SDPA) backend = the naive batch, within
    bf16 noise; gradients flow through both."""
    pytest.importorskip("flash_attn")
    from test_zorro_train import MIXED, make_batch, run, tiny_model

    model = tiny_model("qwen2", seed=5).to("cuda", torch.bfloat16)
    batch = {k: v.to("cuda") if isinstance(v, torch.Tensor) else v
             for k, v in make_batch(MIXED, P=12, R=6, seed=5).items()}
    out_n, loss_n, _ = run(model, batch, zorro=False)
    for attention in ("split", "flash_varlen"):
        out_z, loss_z, grads = run(model, batch, zorro=True, attention=attention)
        m = batch["response_mask"].bool()
        diff = (out_z["log_probs"] - out_n["log_probs"])[m].abs().max().item()
        assert diff < 5e-2, (attention, diff)
        assert abs(loss_z.item() - loss_n.item()) < 5e-2, attention
        assert all(torch.isfinite(g).all() for g in grads.values())


def test_cascade_step_with_the_real_kernel():
    """cascade_decode_varlen with vLLM's flash_attn_varlen_func = one standard paged varlen call."""
    from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func, get_flash_attn_version

    from arctic_rl.zorro.vllm_cuda import cascade_decode_varlen, find_groups, plan_cascade

    torch.manual_seed(0)
    bs, K, H, D = 16, 2, 8, 64
    prefix_blocks, G = 8, 6
    suffix = [1, 5, 16, 17, 30, 3]
    nblocks = prefix_blocks + sum(-(-s // bs) for s in suffix) + 1
    perm = torch.randperm(nblocks).tolist()
    prefix, nxt, rows = perm[:prefix_blocks], prefix_blocks, []
    for s in suffix:
        own = perm[nxt:nxt + -(-s // bs)]
        nxt += len(own)
        rows.append(prefix + own)
    width = max(map(len, rows))
    table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32, device="cuda")
    lens = [prefix_blocks * bs + s for s in suffix]
    kc = torch.randn(nblocks, bs, K, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(G, H, D, device="cuda", dtype=torch.bfloat16)
    attend = lambda **kw: flash_attn_varlen_func(softmax_scale=D ** -0.5, return_softmax_lse=True,  # noqa: E731
                                                 fa_version=get_flash_attn_version(), **kw)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ref, _ = attend(q=q, k=kc, v=vc, cu_seqlens_q=torch.arange(G + 1, dtype=torch.int32, device="cuda"),
                    max_seqlen_q=1, seqused_k=seq, max_seqlen_k=max(lens), block_table=table, causal=True)
    groups = find_groups(table.cpu(), lens, bs, min_prefix_len=bs)
    assert groups and groups[0].prefix_len == prefix_blocks * bs
    out = cascade_decode_varlen(q, kc, vc, plan_cascade(table, lens, groups, bs), attend)
    assert (out.float() - ref.float()).abs().max().item() < 2e-2


_VLLM_CUDA = r"""
import json, sys
from vllm import LLM, SamplingParams
from arctic_rl.zorro import inference, vllm_cuda
model, use = sys.argv[1], sys.argv[2] == "zorro"
kw = inference.vllm_engine_kwargs({"enable": True, "min_prefix_len": 64}, "cuda") if use else {}
llm = LLM(model=model, dtype="float16", max_model_len=1024, enforce_eager=True, seed=0, enable_prefix_caching=True,
          gpu_memory_utilization=0.3, **kw)
prompt = {"prompt_token_ids": [(7 * i) % 300 + 5 for i in range(400)]}
llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)
outs = llm.generate([prompt], SamplingParams(n=6, max_tokens=16, temperature=0.0, logprobs=0), use_tqdm=False)
res = [[list(c.token_ids), [d[t].logprob for d, t in zip(c.logprobs, c.token_ids)]] for o in outs for c in o.outputs]
print("RESULT " + json.dumps({"res": res, "cascade": vllm_cuda.ZorroFlashAttentionImpl.cascade_calls}))
"""


def test_vllm_cuda_backend_end_to_end(tiny_llama):
    """vLLM on CUDA with the ZoRRo FLASH_ATTN backend: the cascade path runs and greedy samples of a
    cached prompt agree with vLLM's own attention (first token equal, log-probs close in fp16)."""
    def gen(mode: str) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "ARCTIC_ZORRO_INFERENCE"}
        p = subprocess.run([sys.executable, "-c", _VLLM_CUDA, str(tiny_llama), mode], capture_output=True,
                           text=True, timeout=900, env=env, cwd=Path(__file__).parents[1])
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        assert line, p.stderr[-3000:]
        return json.loads(line[-1][7:])

    base, zorro = gen("vllm"), gen("zorro")
    assert zorro["cascade"] > 0 and base["cascade"] == 0
    for (tb, lb), (tz, lz) in zip(base["res"], zorro["res"]):
        assert tb[0] == tz[0]
        n = next((i for i, (a, b) in enumerate(zip(tb, tz)) if a != b), len(tb))
        assert max(abs(a - b) for a, b in zip(lb[:n], lz[:n])) < 5e-2


def test_backend_on_one_gpu(tiny_llama):
    """The default colocated deployment on one GPU (DeepSpeed ZeRO-1 bf16, vLLM, shared reference):
    it schedules, samples, trains and syncs."""
    from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
    from arctic_rl.batch import from_samples

    c = create_arctic_rl_client(ArcticRLClientConfig(model_name=str(tiny_llama), vllm_config={"max_seq_len": 256}))
    try:
        samples = c.generate(["the quick brown fox"], {"n": 4, "max_tokens": 8, "seed": 0})
        batch = from_samples(samples, [0] * 4)
        batch["old_log_probs"] = c.log_probs(batch)["log_probs"]
        batch["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])
        c.forward_backward(batch)
        c.optimizer_step()
        assert c.sync_weights()["probe_max_abs_logprob_diff"] < 5e-2
    finally:
        c.shutdown()
