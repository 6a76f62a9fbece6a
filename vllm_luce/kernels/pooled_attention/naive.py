"""Reference semantics of pooled attention (plain PyTorch, fp32).

Request b's page table lists its keys: entry i holds pool slot ``slot_table[b, i]`` (-1: unused), whose
``chunk`` rows are the keys at logical positions ``chunk_pos[b, i] .. + chunk - 1``. A query token at
logical position p sees a key at position j when j <= p (causal by logical position, so a partial
last chunk and rejected drafts written past it are masked) and, with ``window``, j > p - window.
Query head h reads KV head ``h // (Hq / Hkv)``. A query that sees nothing gets zeros.

Decode has one query per request at position ``seq_lens[b] - 1``; chunked prefill packs request b's
query tokens at rows ``query_start_loc[b] .. query_start_loc[b + 1] - 1`` with positions ``q_pos``.
"""

from __future__ import annotations

import torch


def pooled_attention_varlen_naive(q, k_pool, v_pool, query_start_loc, q_pos, slot_table, chunk_pos, scale: float,
                                  window: int | None = None) -> torch.Tensor:
    """q [N, Hq, D]; k_pool, v_pool [slots, chunk, Hkv, D]; query_start_loc [B + 1]; q_pos [N];
    slot_table, chunk_pos [B, E]."""
    N, Hq, D = q.shape
    chunk, Hkv = k_pool.shape[1], k_pool.shape[2]
    group = Hq // Hkv
    out = torch.zeros(N, Hq, D, dtype=torch.float32)
    for b in range(len(query_start_loc) - 1):
        lo, hi = int(query_start_loc[b]), int(query_start_loc[b + 1])
        used = slot_table[b] >= 0
        slots, starts = slot_table[b][used].long(), chunk_pos[b][used].long()
        if hi == lo or len(slots) == 0:
            continue
        keys = k_pool[slots].float().reshape(-1, Hkv, D)  # [E * chunk, Hkv, D]
        vals = v_pool[slots].float().reshape(-1, Hkv, D)
        kpos = (starts[:, None] + torch.arange(chunk)).reshape(-1)
        qp = q_pos[lo:hi].long()[:, None]
        visible = kpos[None, :] <= qp  # [T, keys]
        if window is not None:
            visible &= kpos[None, :] > qp - window
        for h in range(Hq):
            logits = q[lo:hi, h].float() @ keys[:, h // group].T * scale
            probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)
            out[lo:hi, h] = probs @ vals[:, h // group]
    return out


def pooled_attention_naive(q, k_pool, v_pool, slot_table, chunk_pos, seq_lens, scale: float,
                           window: int | None = None) -> torch.Tensor:
    """Decode: q [B, Hq, D], one token per request at position seq_lens[b] - 1."""
    B = q.shape[0]
    return pooled_attention_varlen_naive(q, k_pool, v_pool, torch.arange(B + 1), seq_lens.long() - 1, slot_table,
                                         chunk_pos, scale, window)
