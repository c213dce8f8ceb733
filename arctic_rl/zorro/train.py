"""ZoRRo Train: each shared prompt is encoded once; responses attend to it. Exact, any HF decoder.

Rows that share a prompt (same `uid` *and* the same prompt tokens and position ids, checked
exactly) are packed into one row without padding:

    [prompt][resp_1][resp_2]...[resp_G] [prompt'][resp'_1]...      (one packed row, N tokens)

Every linear layer, norm and the embedding then run over the prompt once instead of G times.
Attention is the only layer that mixes tokens; ours (registered in transformers'
`AttentionInterface`, so model classes stay unmodified) gives

    prompt queries   -> prompt keys, causal
    response queries -> prompt keys (all of them)  +  own response keys, causal

which is exactly what each response sees in the naive padded batch. Position ids of a response
continue from its prompt's (taken from the batch, so custom position ids stay exact).

Attention backends (`attention=`):
  "split"  (CPU default) two passes of torch's CPU flash kernel, responses x prompt keys (no mask,
           GQA without copies) and responses x own keys (causal), merged by their log-sum-exp
           (`merge_attention_states`). The kernel's LSE has no autograd, so the backward is written
           out: each part's flash backward run with the *merged* output and LSE gives that part's
           exact share of the gradient (the split-KV backward of FlashAttention).
  "concat" (any device) each response's queries against [prompt keys; own keys] in one SDPA call
           with an additive float mask, batched per group; autograd does the rest. Copies the prompt
           KV once per response.
  "flash_varlen" (CUDA default for bf16/fp16 when flash-attn is installed) the concat form as two
           `flash_attn_varlen_func` calls (prompts causal; responses against gathered
           [prompt; own] keys, bottom-right causal).
  "torch_varlen" (CUDA default for bf16/fp16 without flash-attn) the same two calls through the
           FlashAttention-2 kernel that CUDA builds of torch carry (`aten._flash_attention_forward`,
           which has a backward). fp32 on CUDA takes "concat" (FlashAttention has no fp32 kernel).

Legend: B rows, P prompt columns, R response columns, N packed tokens, M predicted response
tokens, H query heads, K kv heads, D head dim, G responses in a group.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from arctic_rl.batch import LOG_PROBS_KEYS, Batch, BatchError, group_rows, position_ids, validate_batch
from arctic_rl.logprob_head import DEFAULT_CHUNK_TOKENS, decoder_and_head, head_post_process
from arctic_rl.router_replay import set_routing
from arctic_rl.zorro.merge import merge_attention_states

ATTN_IMPLEMENTATION = "arctic_zorro"
ATTENTION_BACKENDS = ("auto", "split", "concat", "flash_varlen", "torch_varlen")


# ----------------------------------------------------------------------------------------------
# The plan: which rows share a prompt, and where every token goes in the packed row.


@dataclass
class Run:
    """`count` consecutive responses of equal length `length`, starting at packed offset `start`."""

    start: int
    count: int
    length: int


@dataclass
class Group:
    rows: list[int]  # batch rows, in packed order (sorted by response length)
    start: int  # packed offset of the prompt
    prompt_len: int
    resp_lens: list[int]  # per row of `rows`
    runs: list[Run] = field(default_factory=list)  # the non-empty responses, by equal length

    @property
    def resp_start(self) -> int:
        return self.start + self.prompt_len

    @property
    def num_resp_tokens(self) -> int:
        return sum(self.resp_lens)


@dataclass
class ZorroPlan:
    groups: list[Group]
    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    pred_index: torch.Tensor  # [M] packed position whose hidden state predicts labels[m]
    labels: torch.Tensor  # [M]
    out_index: torch.Tensor  # [M] row * R + column in the [B, R] outputs
    num_rows: int
    resp_cols: int
    backend: str = "split"
    max_seq_len: int = 0  # longest prompt + response (sliding-window check)
    _cache: dict = field(default_factory=dict)  # per-backend index tensors, built on first use
    source_index: torch.Tensor | None = None  # [N] row * T + column of each packed token in the batch
    aliases: list = field(default_factory=list)  # (rows, first column, end column): tokens packed once for rows
    token_weights: torch.Tensor | None = None  # [N] the rows each packed token stands for (a prompt: its group's)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]


def _check_padding(mask_BT: torch.Tensor, P: int) -> None:
    prompt, resp = mask_BT[:, :P].int(), mask_BT[:, P:].int()
    if (prompt[:, 1:] < prompt[:, :-1]).any():
        raise BatchError("ZoRRo needs prompts left-padded: batch['attention_mask'][:, :P] must be 0...0 1...1 per row")
    if resp.shape[1] > 1 and (resp[:, 1:] > resp[:, :-1]).any():
        raise BatchError(
            "ZoRRo needs responses right-padded: batch['attention_mask'][:, P:] must be 1...1 0...0 per row"
        )
    if (prompt.sum(1) == 0).any():
        row = int((prompt.sum(1) == 0).nonzero()[0])
        raise BatchError(
            f"batch['attention_mask'] row {row} has an empty prompt; ZoRRo needs at least one prompt token"
        )


def prompt_groups(batch: Batch) -> list[list[int]]:
    """Rows grouped by uid, each uid group split further by exact prompt tokens and position ids.

    Rows that only share a uid (or only look alike) are never merged."""
    ids, mask = batch["input_ids"].cpu(), batch["attention_mask"].cpu().bool()
    pos = position_ids(batch).cpu()
    P = ids.shape[1] - batch["responses"].shape[1]
    plen = mask[:, :P].sum(1).tolist()
    out: list[list[int]] = []
    for rows in group_rows(batch):
        sub: dict[bytes, list[int]] = {}
        for i in rows:
            p = plen[i]
            key = ids[i, P - p : P].numpy().tobytes() + b"|" + pos[i, P - p : P].numpy().tobytes()
            sub.setdefault(key, []).append(i)
        out.extend(sub.values())
    return out


def packed(parts: list[torch.Tensor], dtype: torch.dtype, device) -> torch.Tensor:
    """The plan's pieces concatenated (empty: a [0] tensor of `dtype`), on `device` (None: where they are)."""
    t = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)
    return t.to(device) if device is not None else t


def build_plan(batch: Batch, *, device: torch.device | str | None = None, backend: str = "split") -> ZorroPlan:
    """Group, order and index everything once, on the CPU; tensors land on `device`."""
    B, P, R = validate_batch(batch, LOG_PROBS_KEYS)
    ids, mask = batch["input_ids"].cpu(), batch["attention_mask"].cpu().bool()
    pos = position_ids(batch).cpu().long()
    _check_padding(mask, P)
    plen, rlen = mask[:, :P].sum(1).tolist(), mask[:, P:].sum(1).tolist()

    ids_parts, pos_parts, pred_parts, label_parts, out_parts, src_parts, w_parts = [], [], [], [], [], [], []
    aliases: list[tuple[list[int], int, int]] = []
    T = ids.shape[1]
    groups: list[Group] = []
    offset, max_len = 0, 0
    for rows in prompt_groups(batch):
        rows = sorted(rows, key=lambda i: rlen[i])  # stable: equal lengths stay in row order
        p = plen[rows[0]]
        g = Group(rows=rows, start=offset, prompt_len=p, resp_lens=[rlen[i] for i in rows])
        ids_parts.append(ids[rows[0], P - p : P])
        pos_parts.append(pos[rows[0], P - p : P])
        src_parts.append(torch.arange(rows[0] * T + P - p, rows[0] * T + P))
        w_parts.append(torch.full((p,), float(len(rows))))
        aliases.append((rows, P - p, P))
        last_prompt = offset + p - 1
        cur = offset + p
        for i in rows:
            r = rlen[i]
            max_len = max(max_len, p + r)
            if r == 0:
                continue
            ids_parts.append(ids[i, P : P + r])
            pos_parts.append(pos[i, P : P + r])
            src_parts.append(torch.arange(i * T + P, i * T + P + r))
            w_parts.append(torch.ones(r))
            # response token j is predicted by the hidden state of token j-1 (the prompt's last for j=0)
            pred_parts.append(torch.cat([torch.tensor([last_prompt]), torch.arange(cur, cur + r - 1)]))
            label_parts.append(ids[i, P : P + r])
            out_parts.append(torch.arange(i * R, i * R + r))
            if g.runs and g.runs[-1].length == r:
                g.runs[-1].count += 1
            else:
                g.runs.append(Run(start=cur, count=1, length=r))
            cur += r
        offset = cur
        groups.append(g)

    def cat(parts, dtype=torch.long):
        return packed(parts, dtype, device)

    return ZorroPlan(
        groups=groups,
        input_ids=cat(ids_parts, ids.dtype).view(1, -1),
        position_ids=cat(pos_parts).view(1, -1),
        pred_index=cat(pred_parts),
        labels=cat(label_parts, ids.dtype),
        out_index=cat(out_parts),
        num_rows=B,
        resp_cols=R,
        backend=backend,
        max_seq_len=max_len,
        source_index=cat(src_parts),
        aliases=aliases,
        token_weights=cat(w_parts, torch.float),
    )


# ----------------------------------------------------------------------------------------------
# "split": CPU flash kernel, two passes + LSE merge, hand-written exact backward.

_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_cpu_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _run_view(x: torch.Tensor, run: Run, base: int = 0) -> torch.Tensor:
    """[1, H, N, *] (or [1, H, N]) -> [count, H, length, *] view of a run's tokens, no copy."""
    s = run.start - base
    y = x[0, :, s : s + run.count * run.length].unflatten(1, (run.count, run.length))
    return y.transpose(0, 1)


class _SplitAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, groups, scale):
        # q [1, H, N, D], k/v [1, K, N, D] (strided views of [1, N, H, D] projections are fine)
        _, H, N, D = q.shape
        out = q.new_empty(1, N, H, D)
        out_h = out.transpose(1, 2)
        lse = None
        for g in groups:
            ps, pe = g.start, g.start + g.prompt_len
            kp, vp = k[:, :, ps:pe], v[:, :, ps:pe]
            o, l = _flash_cpu(q[:, :, ps:pe], kp, vp, 0.0, True, scale=scale)
            if lse is None:
                lse = torch.empty(1, H, N, dtype=l.dtype, device=q.device)
            out_h[:, :, ps:pe] = o
            lse[:, :, ps:pe] = l
            re = pe + g.num_resp_tokens
            if re == pe:
                continue
            # every response query of the group against the prompt keys: one call, prompt KV read once
            oa, la = _flash_cpu(q[:, :, pe:re], kp, vp, 0.0, False, scale=scale)
            for run in g.runs:
                ob, lb = _flash_cpu(_run_view(q, run), _run_view(k, run), _run_view(v, run), 0.0, True, scale=scale)
                o_m, l_m = merge_attention_states(_run_view(oa, run, pe), _run_view(la, run, pe), ob, lb)
                _run_view(out_h, run).copy_(o_m)
                _run_view(lse, run).copy_(l_m)
        ctx.groups, ctx.scale = groups, scale
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        scale = ctx.scale
        _, H, N, D = q.shape
        Hk = k.shape[1]
        dq = torch.zeros(1, N, H, D, dtype=q.dtype, device=q.device).transpose(1, 2)
        dk = torch.zeros(1, N, Hk, D, dtype=k.dtype, device=k.device).transpose(1, 2)
        dv = torch.zeros_like(dk)
        do_h, out_h = dout.transpose(1, 2), out.transpose(1, 2)
        for g in ctx.groups:
            ps, pe = g.start, g.start + g.prompt_len
            re = pe + g.num_resp_tokens
            kp, vp = k[:, :, ps:pe], v[:, :, ps:pe]
            a, b, c = _flash_cpu_bwd(
                do_h[:, :, ps:pe], q[:, :, ps:pe], kp, vp, out_h[:, :, ps:pe], lse[:, :, ps:pe], 0.0, True, scale=scale
            )
            dq[:, :, ps:pe] = a
            dk[:, :, ps:pe] = b
            dv[:, :, ps:pe] = c
            if re == pe:
                continue
            # Each part's backward with the merged (out, lse): P = exp(s - lse_full) is the full
            # softmax restricted to that part and rowsum(dO * O_full) is the full D term, so the
            # parts' gradients add up to the gradient of one attention over all keys.
            a, b, c = _flash_cpu_bwd(
                do_h[:, :, pe:re], q[:, :, pe:re], kp, vp, out_h[:, :, pe:re], lse[:, :, pe:re], 0.0, False, scale=scale
            )
            dq[:, :, pe:re] = a
            dk[:, :, ps:pe] += b
            dv[:, :, ps:pe] += c
            for run in g.runs:
                a, b, c = _flash_cpu_bwd(
                    _run_view(do_h, run),
                    _run_view(q, run),
                    _run_view(k, run),
                    _run_view(v, run),
                    _run_view(out_h, run),
                    _run_view(lse, run),
                    0.0,
                    True,
                    scale=scale,
                )
                _run_view(dq, run).add_(a)
                _run_view(dk, run).copy_(b)
                _run_view(dv, run).copy_(c)
        return dq, dk, dv, None, None


def _split_attention(q, k, v, plan: ZorroPlan, scale: float) -> torch.Tensor:
    return _SplitAttention.apply(q, k, v, plan.groups, scale)


# ----------------------------------------------------------------------------------------------
# "concat": [prompt keys; own keys] per response in one SDPA call per group (any device).


def _concat_indices(plan: ZorroPlan, device) -> list[tuple | None]:
    key = ("concat", str(device))
    if key in plan._cache:
        return plan._cache[key]
    dtype = torch.get_default_dtype()
    per_group: list[tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None] = []
    for g in plan.groups:
        lens = [r for r in g.resp_lens if r > 0]
        if not lens:
            per_group.append(None)
            continue
        G, p, rmax = len(lens), g.prompt_len, max(lens)
        starts = torch.tensor([0] + lens[:-1]).cumsum(0) + g.resp_start
        j = torch.arange(rmax)
        valid = j.view(1, -1) < torch.tensor(lens).view(-1, 1)  # [G, rmax]
        own = torch.where(valid, starts.view(-1, 1) + j.view(1, -1), torch.full_like(valid, g.start, dtype=torch.long))
        q_index = own.reshape(-1)  # [G*rmax]
        prompt = torch.arange(g.start, g.start + p).expand(G, p)
        kv_index = torch.cat([prompt, own], 1).reshape(-1)  # [G*(p+rmax)]
        allowed = torch.ones(G, rmax, p + rmax, dtype=torch.bool)
        allowed[:, :, p:] = torch.ones(rmax, rmax, dtype=torch.bool).tril() & valid.unsqueeze(1)
        bias = torch.zeros(G, 1, rmax, p + rmax, dtype=dtype).masked_fill(~allowed.unsqueeze(1), float("-inf"))
        per_group.append(
            (
                G,
                rmax,
                q_index.to(device),
                kv_index.to(device),
                bias.to(device),
                valid.reshape(-1).nonzero().squeeze(1).to(device),
            )
        )
    plan._cache[key] = per_group
    return per_group


def _concat_attention(q, k, v, plan: ZorroPlan, scale: float) -> torch.Tensor:
    _, H, N, D = q.shape
    Hk = k.shape[1]
    pieces = []
    for g, idx in zip(plan.groups, _concat_indices(plan, q.device)):
        ps, pe = g.start, g.start + g.prompt_len
        o = F.scaled_dot_product_attention(
            q[:, :, ps:pe], k[:, :, ps:pe], v[:, :, ps:pe], is_causal=True, scale=scale, enable_gqa=H != Hk
        )
        pieces.append(o[0].transpose(0, 1))  # [p, H, D]
        if idx is None:
            continue
        G, rmax, q_index, kv_index, bias, keep = idx
        qg = q[0].index_select(1, q_index).view(H, G, rmax, D).transpose(0, 1)
        kg = k[0].index_select(1, kv_index).view(Hk, G, -1, D).transpose(0, 1)
        vg = v[0].index_select(1, kv_index).view(Hk, G, -1, D).transpose(0, 1)
        o = F.scaled_dot_product_attention(
            qg, kg, vg, attn_mask=bias.to(q.dtype), scale=scale, enable_gqa=H != Hk
        )  # [G, H, rmax, D]
        pieces.append(o.transpose(1, 2).reshape(G * rmax, H, D).index_select(0, keep))
    return torch.cat(pieces).unsqueeze(0)


# ----------------------------------------------------------------------------------------------
# "flash_varlen": the concat form through flash-attn's varlen kernel (CUDA).


def _varlen_indices(plan: ZorroPlan, device) -> dict:
    key = ("varlen", str(device))
    if key in plan._cache:
        return plan._cache[key]
    p_idx, p_lens, rq_idx, rq_lens, rk_idx, rk_lens = [], [], [], [], [], []
    for g in plan.groups:
        prompt = torch.arange(g.start, g.start + g.prompt_len)
        p_idx.append(prompt)
        p_lens.append(g.prompt_len)
        cur = g.resp_start
        for r in g.resp_lens:
            if r == 0:
                continue
            own = torch.arange(cur, cur + r)
            rq_idx.append(own)
            rq_lens.append(r)
            rk_idx.append(torch.cat([prompt, own]))
            rk_lens.append(g.prompt_len + r)
            cur += r

    def cu(lens):
        return torch.tensor([0] + lens).cumsum(0).to(torch.int32).to(device)

    cat = lambda xs: (torch.cat(xs) if xs else torch.zeros(0, dtype=torch.long)).to(device)  # noqa: E731
    out = {
        "p_idx": cat(p_idx),
        "p_cu": cu(p_lens),
        "p_max": max(p_lens),
        "rq_idx": cat(rq_idx),
        "rq_cu": cu(rq_lens),
        "rq_max": max(rq_lens, default=0),
        "rk_idx": cat(rk_idx),
        "rk_cu": cu(rk_lens),
        "rk_max": max(rk_lens, default=0),
    }
    plan._cache[key] = out
    return out


def _flash_varlen_fn():
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func


def _torch_flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False):
    """flash_attn_varlen_func's forward (GQA native, causal aligned bottom-right) through torch's own
    FlashAttention-2 kernel; differentiable. CUDA builds of torch only, bf16/fp16."""
    return torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=softmax_scale
    )[0]


def _flash_varlen_attention(q, k, v, plan: ZorroPlan, scale: float, varlen_fn=None) -> torch.Tensor:
    varlen_fn = varlen_fn or _flash_varlen_fn()
    ix = _varlen_indices(plan, q.device)
    qt, kt, vt = q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)  # [N, H|K, D]
    p_idx = ix["p_idx"]
    o_p = varlen_fn(
        qt.index_select(0, p_idx),
        kt.index_select(0, p_idx),
        vt.index_select(0, p_idx),
        ix["p_cu"],
        ix["p_cu"],
        ix["p_max"],
        ix["p_max"],
        softmax_scale=scale,
        causal=True,
    )
    out = torch.zeros_like(qt).index_copy(0, p_idx, o_p)
    if ix["rq_max"] > 0:
        # flash-attn (>= 2.1) aligns the causal diagonal bottom-right when seqlen_q < seqlen_k:
        # response query j sees the whole prompt and own keys 0..j.
        rk = ix["rk_idx"]
        o_r = varlen_fn(
            qt.index_select(0, ix["rq_idx"]),
            kt.index_select(0, rk),
            vt.index_select(0, rk),
            ix["rq_cu"],
            ix["rk_cu"],
            ix["rq_max"],
            ix["rk_max"],
            softmax_scale=scale,
            causal=True,
        )
        out = out.index_copy(0, ix["rq_idx"], o_r)
    return out.unsqueeze(0)


def varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False):
    """flash_attn_varlen_func's semantics in plain SDPA (bottom-right causal, GQA); for tests."""
    outs = []
    for i in range(len(cu_q) - 1):
        qs, qe, ks, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        L, S = qe - qs, ke - ks
        mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril(S - L) if causal else None
        o = F.scaled_dot_product_attention(
            q[qs:qe].transpose(0, 1),
            k[ks:ke].transpose(0, 1),
            v[ks:ke].transpose(0, 1),
            attn_mask=mask,
            scale=softmax_scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


# ----------------------------------------------------------------------------------------------
# The function registered in transformers' AttentionInterface.

_BACKEND_FNS = {
    "split": _split_attention,
    "concat": _concat_attention,
    "flash_varlen": _flash_varlen_attention,
    "torch_varlen": lambda q, k, v, plan, scale: _flash_varlen_attention(q, k, v, plan, scale, _torch_flash_varlen),
}


def zorro_attention_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    zorro_plan: ZorroPlan | None = None,
    **kwargs,
):
    """transformers attention-interface function: query [1, H, N, D], key/value [1, K, N, D] ->
    ([1, N, H, D], None). Needs `zorro_plan` in the model call's kwargs (set by zorro_log_probs)."""
    if zorro_plan is None:  # a plain forward of a model ZoRRo has switched (see use_zorro_attention)
        return _fallback_attention()(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.shape[0] != 1 or query.shape[2] != zorro_plan.num_tokens:
        raise RuntimeError(
            f"ZoRRo attention expects one packed row of {zorro_plan.num_tokens} tokens, got query {list(query.shape)}"
        )
    if dropout:
        raise NotImplementedError(
            f"ZoRRo Train does not support attention dropout (got {dropout}); set the model's attention_dropout to 0"
        )
    if softcap or kwargs.get("s_aux") is not None:
        raise NotImplementedError("ZoRRo Train does not support attention logit soft-capping or attention sinks")
    if sliding_window is not None and zorro_plan.max_seq_len > sliding_window:
        raise NotImplementedError(
            f"ZoRRo Train: a sequence of {zorro_plan.max_seq_len} tokens exceeds the "
            f"model's sliding window of {sliding_window}; sliding windows are not supported"
        )
    if not getattr(module, "is_causal", True):
        raise NotImplementedError("ZoRRo Train needs causal (decoder) self-attention")
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    return _BACKEND_FNS[zorro_plan.backend](query, key, value, zorro_plan, scale), None


def register() -> str:
    """Registers the ZoRRo attention function with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, zorro_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _zorro_mask)
    return ATTN_IMPLEMENTATION


# True while zorro_log_probs runs the decoder body: transformers then builds no mask (ZoRRo's plan is the mask).
_IN_ZORRO_BODY: contextvars.ContextVar[bool] = contextvars.ContextVar("in_zorro_body", default=False)


def _fallback_attention():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS["sdpa"]


def _zorro_mask(*args, **kwargs):
    """transformers' mask for a model switched to ZoRRo: none inside zorro_log_probs, SDPA's otherwise."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return None if _IN_ZORRO_BODY.get() else ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)


def use_zorro_attention(model) -> None:
    """Points every config of `model` at the ZoRRo attention function, for good (idempotent). It runs ZoRRo
    when the model call carries a `zorro_plan` and SDPA (mask and attention) otherwise. It must stay in place
    after the forward: gradient checkpointing recomputes each layer inside the backward, and a recompute with
    SDPA over the packed ZoRRo row would be wrong (where the shapes happen to match, silently)."""
    if getattr(model, "_arctic_rl_zorro_attention", False):  # every forward calls this: walk the modules once
        return
    register()
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is None or not hasattr(c, "_attn_implementation_internal"):
            continue
        impl = c._attn_implementation_internal
        if impl == ATTN_IMPLEMENTATION:
            continue
        if impl not in (None, "sdpa"):
            raise ValueError(f"ZoRRo Train runs on models loaded with attn_implementation='sdpa' (this one: {impl!r})")
        c._attn_implementation_internal = ATTN_IMPLEMENTATION
    model._arctic_rl_zorro_attention = True


def pick_backend(device: torch.device, attention: str = "auto", dtype: torch.dtype = torch.float32) -> str:
    if attention not in ATTENTION_BACKENDS:
        raise ValueError(f"attention={attention!r}; expected one of {ATTENTION_BACKENDS}")
    if attention != "auto":
        return attention
    if device.type == "cpu":
        return "split"
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        try:
            _flash_varlen_fn()
            return "flash_varlen"
        except ImportError:
            return "torch_varlen"
    return "concat"


def _packed_routing(plan, routed_BTLk: torch.Tensor) -> torch.Tensor:
    """The routing to replay ([B, T, L, k]) in the plan's packed token order. A token packed once for several rows
    (a group's prompt, a shared prefix) must have the same routing in each: the sampler's record gives equal
    prefixes equal routing (engines/routing_capture.py), and a batch where they differ is refused, since the one
    packed token can be routed only one way."""
    for rows, a, b in plan.aliases:
        if len(rows) > 1:
            block = routed_BTLk[rows, a:b]
            differ = (block != block[:1]).flatten(2).any(-1)  # [rows, columns]
            if differ.any():
                r, c = (int(x) for x in differ.nonzero()[0])
                raise BatchError(
                    f"router replay with ZoRRo: rows {rows[0]} and {rows[r]} share the token at column {a + c} "
                    f"(packed once) but batch['routed_experts'] routes it differently there; the sampler's record "
                    "routes equal prefixes equally, so this batch's routing does not come from one sampler record"
                )
    B, T = routed_BTLk.shape[:2]
    return routed_BTLk.reshape(B * T, *routed_BTLk.shape[2:]).index_select(0, plan.source_index.to(routed_BTLk.device))


def zorro_log_probs(
    model,
    batch: Batch,
    *,
    post_processor: str | Callable = "log_probs",
    pp_config: dict | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    attention: str = "auto",
    sync_chunk_count: bool = False,
    prefix_tree: bool = False,
    routed_experts: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Same outputs as `arctic_rl.engines.forward.naive_log_probs` ({"log_probs": [B, R],
    "entropy": [B, R]?}, zeros on response padding), each shared prompt encoded once; with `prefix_tree`
    every prefix that rows of a group share (arctic_rl/zorro/tree.py), its attention the "concat" form.

    >>> out = zorro_log_probs(model, batch, pp_config={"compute_entropy": True})
    >>> out["log_probs"].shape == batch["responses"].shape
    """
    pp_config = pp_config or {}
    body, head = decoder_and_head(model)
    device = batch["input_ids"].device
    dtype = next(model.parameters()).dtype
    plan: Any
    if prefix_tree:
        from arctic_rl.zorro.tree import build_tree_plan

        plan = build_tree_plan(batch, device=device)
        prefix_tree = plan.shares_past_prompts
    if not prefix_tree:
        plan = build_plan(batch, device=device, backend=pick_backend(device, attention, dtype))
    routed = _packed_routing(plan, routed_experts) if routed_experts is not None else None
    set_routing(model, routed, token_weights=plan.token_weights)
    use_zorro_attention(model)
    token = _IN_ZORRO_BODY.set(True)
    try:
        hidden_1NH = body(
            input_ids=plan.input_ids,
            position_ids=plan.position_ids,
            attention_mask=None,
            use_cache=False,
            zorro_plan=plan,
        ).last_hidden_state
    finally:
        _IN_ZORRO_BODY.reset(token)
    out_M = head_post_process(
        hidden_1NH[0].index_select(0, plan.pred_index),
        plan.labels,
        head,
        post_processor,
        pp_config,
        chunk_tokens,
        sync_chunk_count=sync_chunk_count,
    )
    B, R = plan.num_rows, plan.resp_cols
    if prefix_tree:  # one output per packed token, copied to every row through it
        out_M = {k: v.index_select(0, plan.out_source) for k, v in out_M.items()}
    return {k: v.new_zeros(B * R).index_copy(0, plan.out_index, v).view(B, R) for k, v in out_M.items()}
