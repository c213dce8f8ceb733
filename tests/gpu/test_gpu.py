"""The GPU checks: run with `scripts/gpu_check.sh` on a CUDA machine (skipped everywhere else).

Each one is the CUDA counterpart of a CPU test that runs in CI. The first group needs only CUDA torch,
transformers, pydantic and DeepSpeed:
  ZoRRo Train exact in fp32 (SDPA) and within bf16 noise on torch's FlashAttention-2 varlen kernel
                                                   <- test_zorro_train
  ZoRRo Inference's cascade step on FlashAttention-2 (vllm_cuda.cascade_decode_varlen)
                                                   <- test_cascade_attention (torch stand-in)
  one DeepSpeed rank on CUDA (NCCL, ZeRO-1/2/3, bf16 with ZoRRo Train)
                                                   <- test_training
  router replay's trainer side on a tiny MoE, ZoRRo exact with it <- test_router_replay
The rest need the `gpu` extra (vLLM 0.32's CUDA build, flash-attn) and Ray, and skip without them:
  ZoRRo Train through flash-attn's own varlen kernel, the FLASH_ATTN cascade step with vLLM's kernel,
  vLLM on CUDA with the ZoRRo backend installed, the backend on one GPU (DeepSpeed + vLLM + sync).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from repo_paths import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU checks (scripts/gpu_check.sh)"),
]


def _cuda(batch: dict) -> dict:
    return {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_zorro_train_exact_fp32_on_cuda(name):
    """fp32 on CUDA ("auto" = concat over SDPA): log-probs, entropy, loss and every gradient equal the
    naive batch within the CPU tests' fp32 tolerance."""
    from test_zorro_train import MIXED, assert_same, make_batch, tiny_model

    from arctic_rl.zorro.train import pick_backend

    assert pick_backend(torch.device("cuda"), "auto", torch.float32) == "concat"
    assert_same(tiny_model(name, seed=1).cuda(), _cuda(make_batch(MIXED, P=12, R=6, seed=1)))


def test_router_replay_on_cuda():
    """R3's trainer side on CUDA (the sampler's side there is vLLM's own enable_return_routed_experts, which this
    image's missing vLLM cannot run): a tiny Qwen3-MoE routes every token where the batch says, and ZoRRo Train with
    the replayed routing equals the naive batch, gradients included <- test_router_replay."""
    from test_router_replay import L, other_routing, own_routing
    from test_zorro_train import MIXED, assert_same, make_batch, tiny_model

    from arctic_rl import router_replay
    from arctic_rl.engines.forward import naive_log_probs

    model = tiny_model("qwen3_moe", seed=3).cuda()
    batch = _cuda(make_batch(MIXED, P=12, R=6, seed=3))
    forced = other_routing(own_routing(model, batch).cpu()).cuda()
    state = router_replay.install(model)
    state.record = True
    with torch.no_grad():
        naive_log_probs(model, batch, routed_experts=forced)
    B, T = batch["input_ids"].shape
    used = torch.stack([state.used[layer] for layer in range(L)], 1).view(B, T, L, -1)
    assert torch.equal(used, forced.long())
    state.record = False
    assert_same(model, batch, routed_experts=forced, naive_kw={"routed_experts": forced})


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_zorro_train_bf16_flash_on_cuda(name):
    """bf16 on CUDA through FlashAttention-2 varlen (torch's kernel; flash-attn's too if installed):
    against the fp32 naive batch, ZoRRo's error is bf16 noise of the same size as the naive bf16 batch's,
    and its gradients are as close to fp32's as the naive bf16 gradients are."""
    from test_zorro_train import MIXED, make_batch, run, tiny_model

    from arctic_rl.zorro.train import pick_backend

    backends = ["torch_varlen"]
    try:
        import flash_attn  # noqa: F401

        backends.append("flash_varlen")
    except ImportError:
        pass
    assert pick_backend(torch.device("cuda"), "auto", torch.bfloat16) == backends[-1]
    batch = _cuda(make_batch(MIXED + [(12, [6] * 16)], P=12, R=6, seed=5))
    m = batch["response_mask"].bool()
    model = tiny_model(name, seed=5).cuda()
    out_ref, loss_ref, grads_ref = run(model, batch, zorro=False)
    model = model.to(torch.bfloat16)
    out_n, loss_n, grads_n = run(model, batch, zorro=False)

    def errors(out, grads):
        lp = (out["log_probs"].float() - out_ref["log_probs"])[m].abs().max().item()
        g = max(
            ((grads[k].float() - grads_ref[k]).norm() / grads_ref[k].norm().clamp(min=1e-12)).item() for k in grads_ref
        )
        return lp, g

    lp_n, g_n = errors(out_n, grads_n)
    for attention in backends:
        out_z, loss_z, grads_z = run(model, batch, zorro=True, attention=attention)
        lp_z, g_z = errors(out_z, grads_z)
        print(
            f"{name} {attention}: max |log-prob err| naive bf16 {lp_n:.3g}, zorro {lp_z:.3g}; "
            f"worst relative grad err naive {g_n:.3g}, zorro {g_z:.3g}"
        )
        assert lp_z <= 2 * lp_n + 1e-2, (attention, lp_z, lp_n)
        assert g_z <= 2 * g_n + 1e-2, (attention, g_z, g_n)
        assert abs(loss_z.item() - loss_ref.item()) <= 2 * abs(loss_n.item() - loss_ref.item()) + 1e-2


def _torch_flash_attend(scale: float):
    """flash_attn_varlen_func's signature (paged KV, return_softmax_lse=True) over torch's FlashAttention-2
    kernel, which has no block table here: each sequence's blocks are gathered into one varlen batch."""

    def attend(q, k, v, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, block_table, causal):
        bs = k.shape[1]
        lens = seqused_k.tolist()
        rows = [block_table[i, : -(-n // bs)] for i, n in enumerate(lens)]
        keys = torch.cat([k[r].flatten(0, 1)[:n] for r, n in zip(rows, lens)])
        vals = torch.cat([v[r].flatten(0, 1)[:n] for r, n in zip(rows, lens)])
        cu_k = torch.tensor([0] + lens, device=q.device).cumsum(0).to(torch.int32)
        out, lse = torch.ops.aten._flash_attention_forward(
            q, keys, vals, cu_seqlens_q, cu_k, max_seqlen_q, max_seqlen_k, 0.0, causal, False, scale=scale
        )[:2]
        return out, lse

    return attend


def _paged_case(bs: int = 16, K: int = 2, H: int = 8, D: int = 64, prefix_blocks: int = 8):
    """A bf16 paged cache on the GPU: 8 requests, rows 0..5 sharing a prefix of `prefix_blocks` blocks
    (suffixes of 1 to 30 tokens), rows 6 and 7 alone; blocks shuffled. -> q, key/value cache, table, lens."""
    torch.manual_seed(0)
    suffix = [1, 5, 16, 17, 30, 3, 40, 9]
    nblocks = 3 * prefix_blocks + sum(-(-s // bs) for s in suffix) + 1
    perm = torch.randperm(nblocks).tolist()
    shared, nxt, rows = perm[:prefix_blocks], prefix_blocks, []
    for i, s in enumerate(suffix):
        own_prefix = shared if i < 6 else perm[nxt : nxt + prefix_blocks]
        nxt += 0 if i < 6 else prefix_blocks
        own = perm[nxt : nxt + -(-s // bs)]
        nxt += len(own)
        rows.append(own_prefix + own)
    width = max(map(len, rows))
    table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32, device="cuda")
    kc = torch.randn(nblocks, bs, K, D, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(len(suffix), H, D, device="cuda", dtype=torch.bfloat16)
    return q, kc, torch.randn_like(kc), table, [prefix_blocks * bs + s for s in suffix]


def test_cascade_step_on_cuda_flash():
    """vllm_cuda's cascade step (plan + two varlen passes + merge) on CUDA with FlashAttention-2 equals
    attention over every request's whole sequence, in float64, within bf16 noise; groups of one and
    a request with a one-token suffix included."""
    from arctic_rl.zorro.merge import attention_with_lse
    from arctic_rl.zorro.vllm_cuda import cascade_decode_varlen, find_groups, plan_cascade

    q, kc, vc, table, lens = _paged_case()
    bs, (H, D), K = kc.shape[1], q.shape[1:], kc.shape[2]
    prefix_blocks = 8
    groups = find_groups(table.cpu(), lens, bs, min_prefix_len=bs)
    assert [g.rows for g in groups] == [tuple(range(6))] and groups[0].prefix_len == prefix_blocks * bs
    refs = []
    for i, n in enumerate(lens):
        r = table[i, : -(-n // bs)].long()
        k = kc[r].flatten(0, 1)[:n].double().transpose(0, 1).unsqueeze(0)
        v = vc[r].flatten(0, 1)[:n].double().transpose(0, 1).unsqueeze(0)
        refs.append(attention_with_lse(q[i].double().view(1, H, 1, D), k, v, scale=D**-0.5)[0][0, :, 0])
    # plain; 4 query heads packed per KV head; packed with the prefix in 4 splits; each with the Triton
    # merge (where Triton is installed) and with the torch one
    for opts in ({}, {"heads_per_kv": H // K}, {"heads_per_kv": H // K, "split_tokens": 2 * bs}):
        for merge in ("1", "0"):
            os.environ["ARCTIC_RL_TRITON_MERGE"] = merge
            try:
                out = cascade_decode_varlen(
                    q, kc, vc, plan_cascade(table, lens, groups, bs, **opts), _torch_flash_attend(D**-0.5)
                )
            finally:
                os.environ.pop("ARCTIC_RL_TRITON_MERGE")
            for i, ref in enumerate(refs):
                assert (out[i].double() - ref).abs().max().item() < 2e-2, (opts, merge, i)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_deepspeed_rank_on_cuda(tiny_llama):
    """One DeepSpeed rank on the GPU (NCCL, fused AdamW): ZeRO-1, 2 and 3 in fp32 train the fixed batch
    and agree on the final log-probs; bf16 ZeRO-2 with ZoRRo Train (FlashAttention-2) starts from the
    same log-probs within bf16 noise and trains too."""
    from test_training import fixed_batch

    from arctic_rl.config import ArcticRLClientConfig
    from arctic_rl.engines.training import TrainingWorker

    batch = fixed_batch()
    port = _free_port()

    def worker(zero_stage: int, dtype: str, zorro: bool) -> TrainingWorker:
        cfg = ArcticRLClientConfig(
            model_name=str(tiny_llama),
            seed=0,
            training_config={
                "dtype": dtype,
                "zero_stage": zero_stage,
                "optimizer": {"lr": 1e-3},
                "zorro_train": {"enable": zorro},
            },
        )
        w = TrainingWorker(cfg.to_json(), rank=0, world_size=1)
        w.setup("127.0.0.1", port)
        return w

    def train(w: TrainingWorker, steps: int = 3) -> tuple[list[float], torch.Tensor, torch.Tensor]:
        before = w.log_probs([batch], {})[0]["log_probs"]
        losses = []
        for _ in range(steps):
            losses.append(w.forward_backward([batch], "sft", {})[0]["loss"])
            w.optimizer_step()
        return losses, before, w.log_probs([batch], {})[0]["log_probs"]

    m = batch["response_mask"].bool()
    runs = {}
    for stage in (1, 2, 3):
        runs[stage] = train(worker(stage, "float32", False))
        losses = runs[stage][0]
        print(f"ZeRO-{stage} fp32 losses {losses}")
        assert all(b < a for a, b in zip(losses, losses[1:])), (stage, losses)
    for stage in (2, 3):
        diff = (runs[stage][2] - runs[1][2])[m].abs().max().item()
        assert diff < 1e-4, (stage, diff)
    losses, before, _ = train(worker(2, "bfloat16", True))
    print(f"ZeRO-2 bf16 + ZoRRo losses {losses}")
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert (before - runs[1][1])[m].abs().max().item() < 5e-2


def test_cascade_step_with_the_real_kernel():
    """cascade_decode_varlen with vLLM's flash_attn_varlen_func = one standard paged varlen call."""
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func, get_flash_attn_version

    from arctic_rl.zorro.vllm_cuda import cascade_decode_varlen, find_groups, plan_cascade

    q, kc, vc, table, lens = _paged_case()
    bs, D, G, prefix_blocks = kc.shape[1], q.shape[2], q.shape[0], 8

    def attend(**kw):
        return flash_attn_varlen_func(
            softmax_scale=D**-0.5, return_softmax_lse=True, fa_version=get_flash_attn_version(), **kw
        )

    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ref, _ = attend(
        q=q,
        k=kc,
        v=vc,
        cu_seqlens_q=torch.arange(G + 1, dtype=torch.int32, device="cuda"),
        max_seqlen_q=1,
        seqused_k=seq,
        max_seqlen_k=max(lens),
        block_table=table,
        causal=True,
    )
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
    pytest.importorskip("vllm")

    def gen(mode: str) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "ARCTIC_ZORRO_INFERENCE"}
        p = subprocess.run(
            [sys.executable, "-c", _VLLM_CUDA, str(tiny_llama), mode],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
            cwd=REPO,
        )
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
    pytest.importorskip("vllm")
    pytest.importorskip("ray")
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
