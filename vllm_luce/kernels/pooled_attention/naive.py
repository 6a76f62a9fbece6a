"""Reference semantics of pooled decode attention (plain PyTorch, fp32).

Request b attends from one query token per head to the keys its page table lists: entry i holds
pool slot ``slot_table[b, i]`` (-1: unused), whose ``chunk`` rows are the keys at logical
positions ``chunk_pos[b, i] .. + chunk - 1``. A key is visible when its logical position is below
``seq_lens[b]`` (causal by logical position, so a partial last chunk and rejected drafts written
past it are masked). With ``window``, it is also no further back than ``window - 1`` positions
from the query (the query is at ``seq_lens[b] - 1``). Query head h reads KV head ``h // (Hq / Hkv)``.
"""

from __future__ import annotations

import torch


def pooled_attention_naive(q, k_pool, v_pool, slot_table, chunk_pos, seq_lens, scale: float,
                           window: int | None = None) -> torch.Tensor:
    """q [B, Hq, D]; k_pool, v_pool [slots, chunk, Hkv, D]; slot_table, chunk_pos [B, E]; seq_lens [B]."""
    B, Hq, D = q.shape
    chunk, Hkv = k_pool.shape[1], k_pool.shape[2]
    group = Hq // Hkv
    out = torch.zeros(B, Hq, D, dtype=torch.float32)
    for b in range(B):
        used = slot_table[b] >= 0
        slots, starts = slot_table[b][used].long(), chunk_pos[b][used].long()
        if len(slots) == 0:
            continue
        keys = k_pool[slots].float().reshape(-1, Hkv, D)  # [E * chunk, Hkv, D]
        vals = v_pool[slots].float().reshape(-1, Hkv, D)
        pos = (starts[:, None] + torch.arange(chunk)).reshape(-1)
        visible = pos < int(seq_lens[b])
        if window is not None:
            visible &= pos > int(seq_lens[b]) - 1 - window
        if not bool(visible.any()):
            continue
        keys, vals = keys[visible], vals[visible]
        for h in range(Hq):
            logits = keys[:, h // group] @ q[b, h].float() * scale
            out[b, h] = torch.softmax(logits, dim=0) @ vals[:, h // group]
    return out
