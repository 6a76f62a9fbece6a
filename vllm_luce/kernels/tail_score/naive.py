"""Reference semantics of tail_score (plain PyTorch, fp32), written for clarity rather than speed.

SpecPrefill-style token importance: the last L prompt tokens' queries (the "lookahead" rows) attend
causally over all S prompt keys, and each key gets one score per lookahead row, the largest softmax
probability any query head gives it. Row i sits at prompt position S - L + i, so it sees keys
j <= S - L + i; the keys after it score exactly 0. Query head h reads KV head h // (Hq // Hkv).
"""

from __future__ import annotations

import torch

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


def check_args(q_tail, k, out, accumulate: bool, name: str) -> None:
    """Raises ValueError on inputs that tail_score and tail_score_naive do not accept."""
    for arg, label in ((q_tail, "q_tail [L, Hq, D]"), (k, "k [S, Hkv, D]")):
        if not isinstance(arg, torch.Tensor) or arg.dim() != 3:
            shape = tuple(arg.shape) if isinstance(arg, torch.Tensor) else type(arg).__name__
            raise ValueError(f"{name}: {label} must be a 3-D tensor, got {shape}")
    (L, Hq, D), (S, Hkv, Dk) = q_tail.shape, k.shape
    if D != Dk or not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: q_tail and k need the same head_dim in 1..{MAX_HEAD_DIM}, got {D} and {Dk}")
    if not 1 <= L <= S:
        raise ValueError(f"{name}: need 1 <= L <= S (the tail is part of the prompt), got L={L}, S={S}")
    if Hq < 1 or Hkv < 1 or Hq % Hkv:
        raise ValueError(f"{name}: {Hq} query heads do not group over {Hkv} KV heads")
    if q_tail.dtype not in _DTYPES or k.dtype != q_tail.dtype:
        raise ValueError(f"{name}: q_tail and k must share one dtype of float32, float16, bfloat16; "
                         f"got {q_tail.dtype} and {k.dtype}")
    if k.device != q_tail.device:
        raise ValueError(f"{name}: q_tail is on {q_tail.device} but k on {k.device}")
    if out is None:
        if accumulate:
            raise ValueError(f"{name}: accumulate=True needs out (the running max to update)")
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != (L, S) or out.dtype != torch.float32
          or out.device != k.device):
        got = (f"{list(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor)
               else type(out).__name__)
        raise ValueError(f"{name}: out must be [{L}, {S}] torch.float32 on {k.device}, got {got}")


def tail_score_naive(q_tail: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
                     out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """result[i, j] = max_h softmax_j(scale * q_tail[i, h] . k[j, h // group]) over keys j <= S - L + i.

    q_tail [L, Hq, D] and k [S, Hkv, D] share a dtype (any strides); scale defaults to D ** -0.5.
    Returns fp32 [L, S]; masked entries are 0. With out, writes the result into it, or with
    accumulate=True replaces it by max(out, result) (a running max across layers), and returns it.
    """
    check_args(q_tail, k, out, accumulate, "tail_score_naive")
    L, Hq, D = q_tail.shape
    S, Hkv, _ = k.shape
    scale = D ** -0.5 if scale is None else float(scale)

    keys = k.float().repeat_interleave(Hq // Hkv, dim=1)  # [S, Hq, D]: KV head of every query head
    logits = torch.einsum("lhd,shd->hls", q_tail.float(), keys) * scale  # [Hq, L, S]
    query_pos = S - L + torch.arange(L, device=k.device)
    visible = torch.arange(S, device=k.device)[None, :] <= query_pos[:, None]  # [L, S]
    probs = logits.masked_fill(~visible, float("-inf")).softmax(dim=-1)  # masked keys: exactly 0
    result = probs.amax(dim=0)

    if out is None:
        return result
    if accumulate:
        return torch.maximum(out, result, out=out)
    return out.copy_(result)
