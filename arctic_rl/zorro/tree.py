"""ZoRRo Train on prefix trees: every token prefix that rows of a group share is encoded once, not only the prompt.

The rows of a multi-turn group share the prompt, and often more: the first turn when the sampler agreed, a tool's
answer to the same call, a common start of the final answer. Within each prompt group (`train.prompt_groups`:
same uid, same prompt tokens and positions) the responses form a radix tree over (token, position) pairs, and the
packed row holds each tree node's tokens once, in depth-first order:

    [prompt][shared turn 1][row a's rest][row b's rest][shared start of c, d][c's rest][d's rest] ...

A node's queries attend to all keys of its ancestors and causally to its own; that is exactly what every row
through the node sees in the naive padded batch, so log-probs and gradients equal the per-row forward (tests:
tests/unit/arctic_rl/test_zorro_tree.py). A row ends at a node boundary (a row that is a prefix of another splits
the node there). The head runs once per packed token too: a shared token predicts the same next token for every
row through it, and at a branch each child's first token is predicted by the parent's last hidden state.

Attention is the "concat" form per node (gather the ancestors' keys, one SDPA call with the node's causal mask;
autograd does the backward), on any device. A batch whose rows share nothing past their prompts takes train.py's
flat plan and its backend instead (same work, and "split" is faster on CPU); zorro_train.prefix_tree picks this.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from arctic_rl.batch import LOG_PROBS_KEYS, Batch, position_ids, validate_batch
from arctic_rl.zorro import train


@dataclass
class Node:
    """`length` packed tokens from `start`; `context` the packed positions of all its ancestors' tokens."""

    start: int
    length: int
    context: torch.Tensor  # [A] long, ancestors' packed positions in order (empty for a prompt)


@dataclass
class TreePlan:
    """Duck-types train.ZorroPlan for zorro_attention_forward and zorro_log_probs: backend "tree"."""

    nodes: list[Node]
    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    pred_index: torch.Tensor  # [U] packed position whose hidden state predicts labels[u]
    labels: torch.Tensor  # [U] the packed response tokens
    out_index: torch.Tensor  # [M] row * R + column in the [B, R] outputs ...
    out_source: torch.Tensor  # [M] ... filled from output u = out_source[m]
    num_rows: int
    resp_cols: int
    shares_past_prompts: bool = True  # False: every response is its own node (the flat plan does the same work)
    backend: str = "tree"
    source_index: torch.Tensor | None = None  # [N] row * T + column of each packed token in the batch
    aliases: list = field(default_factory=list)  # (rows, first column, end column): tokens packed once for rows
    token_weights: torch.Tensor | None = None  # [N] the rows each packed token stands for
    max_seq_len: int = 0
    _cache: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]


def _branches(rows: list[int], depth: int, key) -> list[tuple[list[int], int, int]]:
    """The radix tree below a point where `rows` share `depth` response tokens, as (rows, start, stop) nodes in
    depth-first order; `key(row, d)` is the row's d-th response token (None past its end)."""
    by_next: dict = {}
    for r in rows:
        k = key(r, depth)
        if k is not None:
            by_next.setdefault(k, []).append(r)
    out = []
    for sub in by_next.values():
        stop = depth + 1
        # extend while every row of `sub` continues with the same token (a row that ends splits the node)
        while True:
            nxt = {key(r, stop) for r in sub}
            if len(nxt) != 1 or None in nxt:
                break
            stop += 1
        out.append((sub, depth, stop))
        out.extend(_branches(sub, stop, key))
    return out


def build_tree_plan(batch: Batch, *, device: torch.device | str | None = None) -> TreePlan:
    """Groups by prompt, builds each group's radix tree and packs it; everything indexed once, on the CPU."""
    B, P, R = validate_batch(batch, LOG_PROBS_KEYS)
    ids, mask = batch["input_ids"].cpu(), batch["attention_mask"].cpu().bool()
    pos = position_ids(batch).cpu().long()
    train._check_padding(mask, P)
    plen, rlen = mask[:, :P].sum(1).tolist(), mask[:, P:].sum(1).tolist()
    resp = [list(zip(ids[i, P:].tolist(), pos[i, P:].tolist())) for i in range(B)]

    def key(row: int, d: int):
        return resp[row][d] if d < rlen[row] else None

    ids_parts, pos_parts, nodes, src_parts, aliases, w_parts = [], [], [], [], [], []
    pred, labels, out_index, out_source = [], [], [], []
    T = ids.shape[1]
    offset, max_len, units, shared = 0, 0, 0, False
    for rows in train.prompt_groups(batch):
        p = plen[rows[0]]
        prompt = torch.arange(offset, offset + p)
        nodes.append(Node(start=offset, length=p, context=torch.zeros(0, dtype=torch.long)))
        ids_parts.append(ids[rows[0], P - p : P])
        pos_parts.append(pos[rows[0], P - p : P])
        src_parts.append(torch.arange(rows[0] * T + P - p, rows[0] * T + P))
        w_parts.append(torch.full((p,), float(len(rows))))
        aliases.append((rows, P - p, P))
        offset += p
        # per row: packed positions of its tokens so far (prompt, then each node on its path)
        path = {r: prompt for r in rows}
        for sub, a, b in _branches(rows, 0, key):
            r0, shared = sub[0], shared or len(sub) > 1
            context = path[r0]
            own = torch.arange(offset, offset + b - a)
            nodes.append(Node(start=offset, length=b - a, context=context))
            ids_parts.append(ids[r0, P + a : P + b])
            pos_parts.append(pos[r0, P + a : P + b])
            src_parts.append(torch.arange(r0 * T + P + a, r0 * T + P + b))
            w_parts.append(torch.full((b - a,), float(len(sub))))
            aliases.append((sub, P + a, P + b))
            # token t of the node is predicted by the token before it: the context's last for the first
            pred.append(torch.cat([context[-1:], own[:-1]]))
            labels.append(ids[r0, P + a : P + b])
            for r in sub:
                path[r] = torch.cat([context, own])
                out_index.append(torch.arange(r * R + a, r * R + b))
                out_source.append(torch.arange(units, units + b - a))
            offset += b - a
            units += b - a
        max_len = max([max_len] + [p + rlen[r] for r in rows])

    def cat(parts, dtype=torch.long):
        return train.packed(parts, dtype, device)

    return TreePlan(
        nodes=nodes,
        input_ids=cat(ids_parts, ids.dtype).view(1, -1),
        position_ids=cat(pos_parts).view(1, -1),
        pred_index=cat(pred),
        labels=cat(labels, ids.dtype),
        out_index=cat(out_index),
        out_source=cat(out_source),
        num_rows=B,
        resp_cols=R,
        shares_past_prompts=shared,
        max_seq_len=max_len,
        source_index=cat(src_parts),
        aliases=aliases,
        token_weights=cat(w_parts, torch.float),
    )


def _node_inputs(plan: TreePlan, device) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Per node: the key/value positions (context, then own) and the boolean mask (None: a causal prompt)."""
    key = ("tree", str(device))
    if key not in plan._cache:
        per_node: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        for n in plan.nodes:
            own = torch.arange(n.start, n.start + n.length)
            if len(n.context) == 0:
                per_node.append((own.to(device), None))
                continue
            A, L = len(n.context), n.length
            allowed = torch.ones(L, A + L, dtype=torch.bool)
            allowed[:, A:] = torch.ones(L, L, dtype=torch.bool).tril()
            per_node.append((torch.cat([n.context, own]).to(device), allowed.to(device)))
        plan._cache[key] = per_node
    return plan._cache[key]


def tree_attention(q, k, v, plan: TreePlan, scale: float) -> torch.Tensor:
    """q [1, H, N, D], k/v [1, K, N, D] -> [1, N, H, D]; the nodes are contiguous and in packed order."""
    H, Hk = q.shape[1], k.shape[1]
    pieces = []
    for n, (kv_index, allowed) in zip(plan.nodes, _node_inputs(plan, q.device)):
        qn = q[:, :, n.start : n.start + n.length]
        if allowed is None:
            kn, vn = k[:, :, n.start : n.start + n.length], v[:, :, n.start : n.start + n.length]
        else:
            kn, vn = k.index_select(2, kv_index), v.index_select(2, kv_index)
        o = F.scaled_dot_product_attention(
            qn, kn, vn, attn_mask=allowed, is_causal=allowed is None, scale=scale, enable_gqa=H != Hk
        )
        pieces.append(o[0].transpose(0, 1))  # [L, H, D]
    return torch.cat(pieces).unsqueeze(0)


train._BACKEND_FNS["tree"] = tree_attention
