"""Triton kernels: block mean keys, block scores, and the table of kept key blocks (see naive.py).

Layout:
- `_block_mean_kernel`: one program per (key block, KV head), fp32 sum of the block's rows.
- `_row_max_kernel`: one program per (query head, tile of BLOCK_M query rows); loops over the key
  blocks n <= m in BLOCK_N tiles, `tl.dot(q, kmean^T)`, and writes the row maxima [Hq, S] (log2 units).
- `_block_score_kernel`: one program per (query head, query block m), heaviest m first; for each
  BLOCK_N tile of key blocks it sums `exp2(logit - rowmax)` over the block's rows (BLOCK_M at a time)
  and writes one row of the [Hq, M, M] score table, 0 past the diagonal. Two kernels rather than two
  passes in one program, so query blocks of any size are split into row tiles; the [Hq, S] row
  maxima keep memory O(S).
- The selection itself is a few torch ops on the score table (16 x 1024 x 1024 at S = 128K).

Precision: half-precision queries meet the fp32 mean keys as two tensor-core dots, q . hi + q . lo
with kmean split as hi + lo in the query dtype; the residual is below 2^-16 of kmean (bf16), so the
logits match the fp32 reference to ~1e-5 relative and only near-ties of the threshold can flip.
fp32 queries use an IEEE fp32 dot (not tf32). Pointer offsets are int64.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import LOG2E, autotune, check_device, is_interpreter, upcast_dots  # noqa: F401 (re-exported)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


@autotune(configs=[triton.Config({"BLOCK_T": 32}, num_warps=4), triton.Config({"BLOCK_T": 64}, num_warps=4),
                   triton.Config({"BLOCK_T": 16}, num_warps=2), triton.Config({"BLOCK_T": 128}, num_warps=8)],
          key=["BLOCK_SIZE", "BLOCK_D"])
@triton.jit(do_not_specialize=["seq_len"])
def _block_mean_kernel(k_ptr, out_ptr, stride_kt, stride_kh, stride_kd, stride_on, stride_oh, stride_od,
                       seq_len, head_dim, BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr):
    n = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    start = n * BLOCK_SIZE
    count = tl.minimum(seq_len - start, BLOCK_SIZE)
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < head_dim
    base = k_ptr + head * stride_kh + dims[None, :].to(tl.int64) * stride_kd
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for t0 in range(0, count, BLOCK_T):
        rows = t0 + tl.arange(0, BLOCK_T)
        ptrs = base + (start + rows[:, None]).to(tl.int64) * stride_kt
        acc += tl.load(ptrs, mask=(rows < count)[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / count.to(tl.float32)
    tl.store(out_ptr + n.to(tl.int64) * stride_on + head * stride_oh + dims.to(tl.int64) * stride_od, mean,
             mask=dmask)


@triton.jit
def _mean_logits(q, km_ptr, stride_kn, stride_kd, blocks, block_mask, dims, dmask, qk_scale, SPLIT: tl.constexpr,
                 UPCAST: tl.constexpr):
    """[rows, BLOCK_N] = qk_scale * q . kmean[blocks]; kmean rows outside block_mask read as 0."""
    km = tl.load(km_ptr + blocks[None, :].to(tl.int64) * stride_kn + dims[:, None].to(tl.int64) * stride_kd,
                 mask=block_mask[None, :] & dmask[:, None], other=0.0).to(tl.float32)  # [BLOCK_D, BLOCK_N]
    if SPLIT:
        hi = km.to(q.dtype)
        lo = (km - hi.to(tl.float32)).to(q.dtype)
        if UPCAST:
            q, hi, lo = q.to(tl.float32), hi.to(tl.float32), lo.to(tl.float32)
        logits = tl.dot(q, lo, acc=tl.dot(q, hi))
    else:
        logits = tl.dot(q, km, input_precision="ieee")
    return logits * qk_scale


@triton.jit
def query_tile(q_ptr, stride_qt, stride_qh, stride_qd, seq_len, head_dim, BLOCK_M: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """The program's query head and tile of BLOCK_M rows, with masks, for a grid of (heads, row tiles).

    Heads vary fastest, so the programs in flight share their keys in L2; the last row tiles (most key
    blocks) go first. Returns (head, row0, rows, rmask, dims, dmask, q [BLOCK_M, BLOCK_D])."""
    head = tl.program_id(0).to(tl.int64)
    row0 = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    rmask = rows < seq_len
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < head_dim
    q = tl.load(q_ptr + rows[:, None].to(tl.int64) * stride_qt + head * stride_qh
                + dims[None, :].to(tl.int64) * stride_qd, mask=rmask[:, None] & dmask[None, :], other=0.0)
    return head, row0, rows, rmask, dims, dmask, q


_SCORE_CONFIGS = [triton.Config({}, num_warps=4), triton.Config({}, num_warps=8)]  # 2 warps spill at D = 128


@autotune(configs=_SCORE_CONFIGS, key=["BLOCK_SIZE", "BLOCK_D", "BLOCK_M", "BLOCK_N"])
@triton.jit(do_not_specialize=["seq_len"])
def _row_max_kernel(q_ptr, km_ptr, rowmax_ptr, stride_qt, stride_qh, stride_qd, stride_kn, stride_kh, stride_kd,
                    seq_len, head_dim, group, qk_scale, BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr):
    head, row0, rows, rmask, dims, dmask, q = query_tile(q_ptr, stride_qt, stride_qh, stride_qd, seq_len, head_dim,
                                                         BLOCK_M, BLOCK_D)
    m = row0 // BLOCK_SIZE
    km_base = km_ptr + (head // group) * stride_kh
    rowmax = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for n0 in range(0, m + 1, BLOCK_N):
        blocks = n0 + tl.arange(0, BLOCK_N)
        causal = blocks <= m
        logits = _mean_logits(q, km_base, stride_kn, stride_kd, blocks, causal, dims, dmask, qk_scale, SPLIT, UPCAST)
        rowmax = tl.maximum(rowmax, tl.max(tl.where(causal[None, :], logits, float("-inf")), axis=1))
    tl.store(rowmax_ptr + head * seq_len + rows, rowmax, mask=rmask)


@autotune(configs=_SCORE_CONFIGS, key=["BLOCK_SIZE", "BLOCK_D", "BLOCK_M", "BLOCK_N"])
@triton.jit(do_not_specialize=["seq_len", "num_blocks"])
def _block_score_kernel(q_ptr, km_ptr, rowmax_ptr, score_ptr, stride_qt, stride_qh, stride_qd, stride_kn, stride_kh,
                        stride_kd, stride_sh, stride_sm, seq_len, num_blocks, head_dim, group, qk_scale,
                        BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr):
    head = tl.program_id(0).to(tl.int64)
    m = num_blocks - 1 - tl.program_id(1)  # the longest rows first
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < head_dim
    q_base = q_ptr + head * stride_qh + dims[None, :].to(tl.int64) * stride_qd
    km_base = km_ptr + (head // group) * stride_kh
    score_row = score_ptr + head * stride_sh + m.to(tl.int64) * stride_sm
    for n0 in range(0, m + 1, BLOCK_N):
        blocks = n0 + tl.arange(0, BLOCK_N)
        causal = blocks <= m
        total = tl.zeros([BLOCK_N], dtype=tl.float32)
        for r0 in range(0, BLOCK_SIZE, BLOCK_M):
            rows = m * BLOCK_SIZE + r0 + tl.arange(0, BLOCK_M)
            rmask = rows < seq_len
            q = tl.load(q_base + rows[:, None].to(tl.int64) * stride_qt, mask=rmask[:, None] & dmask[None, :],
                        other=0.0)
            logits = _mean_logits(q, km_base, stride_kn, stride_kd, blocks, causal, dims, dmask, qk_scale, SPLIT,
                                  UPCAST)
            rowmax = tl.load(rowmax_ptr + head * seq_len + rows, mask=rmask, other=0.0)
            weights = tl.exp2(logits - rowmax[:, None])
            total += tl.sum(tl.where(rmask[:, None] & causal[None, :], weights, 0.0), axis=0)
        tl.store(score_row + blocks, total, mask=blocks < num_blocks)
    for n0 in range((m // BLOCK_N + 1) * BLOCK_N, num_blocks, BLOCK_N):  # past the diagonal: score 0
        blocks = n0 + tl.arange(0, BLOCK_N)
        tl.store(score_row + blocks, tl.zeros([BLOCK_N], dtype=tl.float32), mask=blocks < num_blocks)


def _check_tokens(name: str, label: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 3:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: {label} must be [tokens, heads, head_dim], got {shape}")
    if t.dtype not in _DTYPES:
        raise ValueError(f"{name}: {label} dtype must be float32, float16 or bfloat16, got {t.dtype}")
    if not 1 <= t.shape[2] <= MAX_HEAD_DIM or t.shape[1] < 1 or t.shape[0] >= 2**31:
        raise ValueError(f"{name}: {label} needs 1..{MAX_HEAD_DIM} head dims, >= 1 head and < 2**31 tokens, "
                         f"got {tuple(t.shape)}")


def check_block_size(name: str, block_size: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 16 \
            or block_size & (block_size - 1):
        raise ValueError(f"{name}: block_size must be a power of two >= 16, got {block_size!r}")


def _is_int(x, low: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def check_selection(name: str, sink_blocks: int, window_blocks: int, last_full_blocks: int, alpha: float,
                    scale: float | None) -> None:
    """The selection knobs of naive.py; alpha = 0 keeps every causal block."""
    if not _is_int(sink_blocks, 0) or not _is_int(last_full_blocks, 0):
        raise ValueError(f"{name}: sink_blocks and last_full_blocks must be ints >= 0, "
                         f"got {sink_blocks!r} and {last_full_blocks!r}")
    if not _is_int(window_blocks, 1):
        raise ValueError(f"{name}: window_blocks must be an int >= 1 (the diagonal block), got {window_blocks!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"{name}: alpha must be a number in [0, 1], got {alpha!r}")
    check_scale(name, scale)


def check_scale(name: str, scale: float | None) -> None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"{name}: scale must be a finite number or None, got {scale!r}")


def check_qkv(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
    """q [S, Hq, D]; k (and v) [S, Hkv, D] of q's dtype, Hq % Hkv == 0, one device."""
    _check_tokens(name, "q", q)
    _check_tokens(name, "k", k)
    if v is not None:
        _check_tokens(name, "v", v)
        if v.shape != k.shape:
            raise ValueError(f"{name}: v {tuple(v.shape)} must have the shape of k {tuple(k.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"{name}: k {tuple(k.shape)} must have the tokens and head_dim of q {tuple(q.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{name}: {q.shape[1]} query heads do not group over {k.shape[1]} KV heads")
    if k.dtype != q.dtype or (v is not None and v.dtype != q.dtype):
        raise ValueError(f"{name}: q, k and v must share one dtype, got {q.dtype}, {k.dtype}"
                         + (f", {v.dtype}" if v is not None else ""))
    check_device(name, q, k, *([v] if v is not None else []))


def block_mean_keys(k: torch.Tensor, block_size: int) -> torch.Tensor:
    """k [S, Hkv, D] (any strides) -> fp32 [M, Hkv, D]: the mean of each block's keys over its valid rows."""
    _check_tokens("block_mean_keys", "k", k)
    check_block_size("block_mean_keys", block_size)
    check_device("block_mean_keys", k)
    S, Hkv, D = k.shape
    M = triton.cdiv(S, block_size)
    out = torch.empty(M, Hkv, D, dtype=torch.float32, device=k.device)
    if M:
        _block_mean_kernel[(M, Hkv)](k, out, *k.stride(), *out.stride(), S, D, BLOCK_SIZE=block_size,
                                     BLOCK_D=max(16, triton.next_power_of_2(D)))
    return out


def block_scores(q: torch.Tensor, k_means: torch.Tensor, block_size: int, scale: float | None = None) -> torch.Tensor:
    """q [S, Hq, D], k_means [M, Hkv, D] -> fp32 [Hq, M, M] block scores (see naive.py), 0 where n > m."""
    _check_tokens("block_scores", "q", q)
    check_block_size("block_scores", block_size)
    S, Hq, D = q.shape
    M = triton.cdiv(S, block_size)
    if not isinstance(k_means, torch.Tensor) or k_means.dim() != 3 or k_means.shape[0] != M \
            or k_means.shape[2] != D or k_means.shape[1] < 1 or Hq % k_means.shape[1] \
            or k_means.dtype not in _DTYPES:
        shape = tuple(k_means.shape) if isinstance(k_means, torch.Tensor) else type(k_means).__name__
        raise ValueError(f"block_scores: k_means must be a float [M={M}, Hkv, {D}] tensor with Hq={Hq} a multiple "
                         f"of Hkv, got {shape}")
    check_device("block_scores", q, k_means)
    scale = D ** -0.5 if scale is None else float(scale)
    scores = torch.empty(Hq, M, M, dtype=torch.float32, device=q.device)
    if M == 0:
        return scores
    rowmax = torch.empty(Hq, S, dtype=torch.float32, device=q.device)
    # Compiled for sm_90 at D = 128: 64 x 64 tiles fit the registers for half inputs; the IEEE fp32
    # dot (FMA, not tensor cores) spills there, so fp32 takes 32 x 32.
    half = q.dtype != torch.float32
    tiles = dict(BLOCK_SIZE=block_size, BLOCK_D=max(16, triton.next_power_of_2(D)),
                 BLOCK_M=min(64 if half else 32, block_size), BLOCK_N=64 if half else 32, SPLIT=half,
                 UPCAST=upcast_dots(q.dtype))
    group, qk_scale = Hq // k_means.shape[1], scale * LOG2E
    _row_max_kernel[(Hq, triton.cdiv(S, tiles["BLOCK_M"]))](
        q, k_means, rowmax, *q.stride(), *k_means.stride(), S, D, group, qk_scale, **tiles)
    _block_score_kernel[(Hq, M)](
        q, k_means, rowmax, scores, *q.stride(), *k_means.stride(), scores.stride(0), scores.stride(1),
        S, M, D, group, qk_scale, **tiles)
    return scores


def keep_mask(scores: torch.Tensor, *, sink_blocks: int, window_blocks: int, last_full_blocks: int,
              alpha: float) -> torch.Tensor:
    """Score table [Hq, M, M] (0 past the diagonal) -> bool [Hq, M, M] of kept blocks (rule in naive.py)."""
    M = scores.shape[-1]
    n = torch.arange(M, device=scores.device)
    m = n[:, None]
    forced = (n < sink_blocks) | (m - n < window_blocks) | (m >= M - last_full_blocks)
    best = scores.amax(-1, keepdim=True)  # scores are >= 0 and 0 past the diagonal
    return (n <= m) & (forced | (scores >= alpha * best))


def select_blocks(q: torch.Tensor, k_means: torch.Tensor, *, block_size: int, sink_blocks: int = 2,
                  window_blocks: int = 4, last_full_blocks: int = 2, alpha: float = 0.12,
                  scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept key blocks of every (query head, query block).

    q [S, Hq, D]; k_means [M, Hkv, D] (from block_mean_keys). Returns (indices int32 [Hq, M, M],
    counts int32 [Hq, M]): row (h, m) of indices lists its kept blocks n in ascending order in its
    first counts[h, m] entries (the diagonal block m is always kept, so it is the last of them),
    then -1 padding.
    """
    check_selection("select_blocks", sink_blocks, window_blocks, last_full_blocks, alpha, scale)
    scores = block_scores(q, k_means, block_size, scale)
    if scores.shape[-1] == 0:
        return scores.to(torch.int32), scores.new_empty(scores.shape[:2], dtype=torch.int32)
    keep = keep_mask(scores, sink_blocks=sink_blocks, window_blocks=window_blocks,
                     last_full_blocks=last_full_blocks, alpha=alpha)
    M = keep.shape[-1]
    n = torch.arange(M, dtype=torch.int32, device=keep.device)
    # Dropped blocks sort after the kept ones (key M); a segmented sort of 1024-entry rows is cheap.
    indices = torch.sort(torch.where(keep, n, M), dim=-1).values
    indices.masked_fill_(indices == M, -1)
    return indices, keep.sum(-1, dtype=torch.int32)
