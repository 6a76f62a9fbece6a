"""block_sparse_attention: the Triton kernels against the plain PyTorch reference (naive.py).

Sizes are small and odd (S not a multiple of the block, so the last block is partial); inputs are
strided views; every kernel output goes into a NaN-poisoned tensor. The kept-block set is compared
with the reference everywhere except where a block score lies within rounding of the threshold, and
the attention output is compared with the reference run on the blocks the kernel kept.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton

from vllm_luce.kernels._triton import is_interpreter
from vllm_luce.kernels.block_sparse_attention import (
    block_mean_keys, block_mean_keys_naive, block_scores, block_scores_naive, block_sparse_attention,
    block_sparse_attention_naive, keep_mask_naive, kept_fraction, select_blocks, sparse_attention_forward)
from vllm_luce.kernels.block_sparse_attention.block_sparse_attention import _sparse_attention_kernel

pytestmark = pytest.mark.kernel

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
TOL = {F32: dict(rtol=1e-4, atol=1e-4), BF16: dict(rtol=0, atol=2e-2), F16: dict(rtol=0, atol=2e-2)}
SCORE_TOL = dict(rtol=1e-4, atol=1e-5)  # sums of exp <= 1 per row: fp32 summation order and dot rounding


def _randn(gen, shape, dtype, layout, device):
    """Random [S, H, D] values as a view with the strides `layout` names."""
    S, H, D = shape
    if layout == "contiguous":
        t = torch.randn(S, H, D, generator=gen)
    elif layout == "token_strided":  # every other token of a larger buffer
        t = torch.randn(2 * S, H, D, generator=gen)[::2]
    elif layout == "padded_rows":  # heads and dims sliced out of wider rows, as in a fused QKV buffer
        t = torch.randn(S, H + 2, D + 3, generator=gen)[:, 1:H + 1, :D]
    elif layout == "head_major":  # [heads, tokens, dims] storage seen as [tokens, heads, dims]
        t = torch.randn(H, S, D, generator=gen).transpose(0, 1)
    else:
        raise AssertionError(layout)
    return t.to(device=device, dtype=dtype)


def make_qkv(S, Hq, Hkv, D, dtype, layout, device, seed=0, peak=0.0, block_size=16):
    """q, k, v; with peak > 0 every query block leans toward the mean key of one random earlier
    block, so block scores are peaked and the selection sparse."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (_randn(gen, (S, H, D), F32, layout, "cpu") for H in (Hq, Hkv, Hkv))
    if peak and S:
        M = -(-S // block_size)
        topic = torch.randn(M, Hkv, D, generator=gen) * peak  # one direction per key block
        block = torch.arange(S) // block_size
        target = (torch.rand(M, generator=gen) * (torch.arange(M) + 1)).long()  # a block n <= m
        k += topic[block]
        q += topic[target[block]].repeat_interleave(Hq // Hkv, dim=1)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def mask_from_table(indices, counts):
    """Checks the index table format and returns it as bool [Hq, M, M]."""
    indices, counts = indices.cpu(), counts.cpu()
    Hq, M, _ = indices.shape
    keep = torch.zeros(Hq, M, M, dtype=torch.bool)
    for h in range(Hq):
        for m in range(M):
            count = int(counts[h, m])
            kept = indices[h, m, :count]
            assert 1 <= count <= m + 1 and kept[-1] == m, (h, m, kept)
            assert (kept[1:] > kept[:-1]).all() and kept[0] >= 0, (h, m, kept)
            assert (indices[h, m, count:] == -1).all()
            keep[h, m, kept.long()] = True
    return keep


def check_keep(keep, scores, alpha, **rule):
    """keep equals the reference mask except where a score is within 1e-4 (relative) of the threshold."""
    expected = keep_mask_naive(scores, alpha=alpha, **rule)
    M = scores.shape[-1]
    best = scores.masked_fill(torch.ones(M, M, dtype=torch.bool).triu(1), float("-inf")).amax(-1, keepdim=True)
    ambiguous = (scores - alpha * best).abs() <= 1e-4 * best
    assert torch.equal(keep & ~ambiguous, expected & ~ambiguous)


RULES = {  # sink_blocks, window_blocks, last_full_blocks, alpha
    "default": dict(sink_blocks=2, window_blocks=4, last_full_blocks=2, alpha=0.12),
    "tight": dict(sink_blocks=1, window_blocks=1, last_full_blocks=0, alpha=0.3),
    "no-sink": dict(sink_blocks=0, window_blocks=2, last_full_blocks=1, alpha=0.05),
}
# S, block_size, Hq, Hkv, D, dtype, layout, rule, peak
CASES = [
    (1, 16, 1, 1, 16, F32, "contiguous", "default", 0.0),
    (17, 16, 4, 2, 24, F32, "padded_rows", "tight", 1.0),
    (100, 16, 6, 3, 40, F32, "head_major", "no-sink", 1.0),
    (257, 16, 4, 2, 64, F32, "token_strided", "tight", 1.0),
    (257, 32, 6, 3, 24, BF16, "padded_rows", "tight", 1.0),
    (150, 16, 4, 2, 64, F16, "head_major", "default", 1.0),
    (100, 32, 1, 1, 40, BF16, "token_strided", "no-sink", 0.0),
    (300, 128, 2, 1, 16, BF16, "contiguous", "tight", 1.0),  # production block: 2 key tiles, 2 score row tiles
]


@pytest.mark.parametrize("S, block_size, Hq, Hkv, D, dtype, layout, rule, peak", CASES,
                         ids=[f"s{c[0]}-b{c[1]}-h{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{c[6]}-{c[7]}" for c in CASES])
def test_matches_naive(device, poisoned, S, block_size, Hq, Hkv, D, dtype, layout, rule, peak):
    q, k, v = make_qkv(S, Hq, Hkv, D, dtype, layout, device, peak=peak, block_size=block_size)
    knobs = RULES[rule]
    alpha = knobs["alpha"]
    rule_only = {name: value for name, value in knobs.items() if name != "alpha"}
    qc, kc, vc = (t.cpu().float() for t in (q, k, v))  # the reference runs on the upcast inputs

    means = block_mean_keys(k, block_size)
    torch.testing.assert_close(means.cpu(), block_mean_keys_naive(kc, block_size), rtol=1e-5, atol=1e-6)
    scores = block_scores(q, means, block_size)
    expected_scores = block_scores_naive(qc, means.cpu(), block_size)
    torch.testing.assert_close(scores.cpu(), expected_scores, **SCORE_TOL)
    indices, counts = select_blocks(q, means, block_size=block_size, **knobs)
    keep = mask_from_table(indices, counts)
    check_keep(keep, expected_scores, alpha, **rule_only)

    buffer = poisoned((S + 2, Hq + 1, 2 * D), dtype)
    out = buffer[1:S + 1, 1:, ::2]  # strided, inside a poisoned margin
    result, density = block_sparse_attention(q, k, v, block_size=block_size, out=out, return_density=True,
                                             **knobs)
    assert result is out
    assert torch.isfinite(out).all(), "the kernel left elements of out unwritten"
    inside = torch.zeros(buffer.shape, dtype=torch.bool, device=device)
    inside[1:S + 1, 1:, ::2] = True
    assert torch.isnan(buffer[~inside]).all(), "the kernel wrote outside out"
    expected = block_sparse_attention_naive(qc, kc, vc, block_size=block_size, keep=keep)
    torch.testing.assert_close(out.cpu().float(), expected, **TOL[dtype])
    M = keep.shape[-1]
    assert density == pytest.approx(float(keep.sum()) / (Hq * M * (M + 1) / 2))


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
def test_alpha_zero_is_dense_causal_attention(device, poisoned, dtype):
    S, Hq, Hkv, D = 75, 6, 2, 40
    q, k, v = make_qkv(S, Hq, Hkv, D, dtype, "contiguous", device, seed=1)
    out, density = block_sparse_attention(q, k, v, block_size=16, sink_blocks=0, window_blocks=1,
                                          last_full_blocks=0, alpha=0.0, out=poisoned((S, Hq, D), dtype),
                                          return_density=True)
    qc, kc, vc = (t.cpu().float().transpose(0, 1) for t in (q, k, v))
    group = Hq // Hkv
    dense = F.scaled_dot_product_attention(qc, kc.repeat_interleave(group, 0), vc.repeat_interleave(group, 0),
                                           is_causal=True).transpose(0, 1)
    assert density == 1.0
    torch.testing.assert_close(out.cpu().float(), dense, **TOL[dtype])


def test_alpha_one_keeps_the_diagonal_and_the_best_block(device):
    S, Hq, Hkv, D, block_size = 200, 4, 2, 64, 16
    q, k, _ = make_qkv(S, Hq, Hkv, D, F32, "token_strided", device, seed=2, peak=1.0)
    means = block_mean_keys(k, block_size)
    indices, counts = select_blocks(q, means, block_size=block_size, sink_blocks=0, window_blocks=1,
                                    last_full_blocks=0, alpha=1.0)
    keep = mask_from_table(indices, counts)
    scores = block_scores_naive(q.cpu(), means.cpu(), block_size)
    M = scores.shape[-1]
    best = scores.argmax(-1)  # 0 past the diagonal, so the best block is causal
    expected = torch.eye(M, dtype=torch.bool).expand(Hq, M, M).clone()
    expected.scatter_(-1, best[..., None], True)
    assert torch.equal(keep, expected)
    assert counts.max() <= 2


def test_sparse_selection_matches_naive(device, poisoned):
    """Peaked scores keep well under half the causal blocks; the output still matches the reference."""
    S, Hq, Hkv, D, block_size = 290, 4, 2, 64, 16
    q, k, v = make_qkv(S, Hq, Hkv, D, BF16, "contiguous", device, seed=3, peak=1.5)
    knobs = dict(sink_blocks=1, window_blocks=2, last_full_blocks=1, alpha=0.2)
    out, density = block_sparse_attention(q, k, v, block_size=block_size, out=poisoned((S, Hq, D), BF16),
                                          return_density=True, **knobs)
    qc, kc, vc = (t.cpu().float() for t in (q, k, v))
    scores = block_scores_naive(qc, block_mean_keys_naive(kc, block_size), block_size)
    keep = mask_from_table(*select_blocks(q, block_mean_keys(k, block_size), block_size=block_size, **knobs))
    check_keep(keep, scores, knobs["alpha"], **{n: x for n, x in knobs.items() if n != "alpha"})
    assert density < 0.5
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().float(), block_sparse_attention_naive(qc, kc, vc, block_size=block_size,
                                                                               keep=keep), **TOL[BF16])
    dense = block_sparse_attention_naive(qc, kc, vc, block_size=block_size, alpha=0.0)
    assert (out.cpu().float() - dense).abs().max() > 0.05, "the dropped blocks should matter"


def test_forward_with_a_given_table(device, poisoned):
    """sparse_attention_forward reads only the first counts[h, m] entries of each row of the table."""
    S, Hq, Hkv, D, block_size = 90, 2, 1, 24, 16
    q, k, v = make_qkv(S, Hq, Hkv, D, F32, "contiguous", device, seed=4)
    M = -(-S // block_size)
    keep = torch.rand(Hq, M, M, generator=torch.Generator().manual_seed(0)) < 0.4
    keep = (keep | torch.eye(M, dtype=torch.bool)) & torch.ones(M, M, dtype=torch.bool).tril()
    n = torch.arange(M, dtype=torch.int32)
    indices = torch.sort(torch.where(keep, n, M), dim=-1).values
    indices = torch.where(indices == M, 12345, indices)  # junk padding past the counts
    table = torch.full((Hq, M, 2 * M), 999, dtype=torch.int32)
    table[..., ::2] = indices  # a strided view of a larger table
    counts = keep.sum(-1, dtype=torch.int32)
    out = sparse_attention_forward(q, k, v, table.to(device)[..., ::2], counts.to(device), block_size=block_size,
                                   scale=0.3, out=poisoned((S, Hq, D)))
    expected = block_sparse_attention_naive(q.cpu(), k.cpu(), v.cpu(), block_size=block_size, scale=0.3, keep=keep)
    torch.testing.assert_close(out.cpu(), expected, **TOL[F32])


@pytest.mark.parametrize("block_m, block_n", [(32, 16), (64, 16), (16, 32)])
def test_tiles_smaller_than_the_block(device, poisoned, monkeypatch, block_m, block_n):
    """Query tiles sharing a block's table row, and several key tiles per kept block (the GPU configs
    do this at block_size 128; the interpreter's first config covers whole blocks only)."""
    monkeypatch.setattr(_sparse_attention_kernel, "configs", [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n})])
    S, Hq, Hkv, D, block_size = 250, 4, 2, 40, 64
    q, k, v = make_qkv(S, Hq, Hkv, D, F32, "padded_rows", device, seed=5, peak=1.0, block_size=block_size)
    indices, counts = select_blocks(q, block_mean_keys(k, block_size), block_size=block_size, sink_blocks=0,
                                    window_blocks=1, last_full_blocks=0, alpha=0.5)
    keep = mask_from_table(indices, counts)
    assert not keep.all()
    out = sparse_attention_forward(q, k, v, indices, counts, block_size=block_size, out=poisoned((S, Hq, D)))
    expected = block_sparse_attention_naive(q.cpu(), k.cpu(), v.cpu(), block_size=block_size, keep=keep)
    torch.testing.assert_close(out.cpu(), expected, **TOL[F32])


@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
def test_many_key_blocks(device, dtype):
    """More than one 64-wide tile of key blocks in the score kernels (M = 69)."""
    S, Hq, Hkv, D, block_size = 1100, 2, 1, 16, 16
    q, k, _ = make_qkv(S, Hq, Hkv, D, dtype, "token_strided", device, seed=6, peak=1.0)
    means = block_mean_keys(k, block_size)
    scores = block_scores(q, means, block_size)
    expected = block_scores_naive(q.cpu().float(), means.cpu(), block_size)
    torch.testing.assert_close(scores.cpu(), expected, **SCORE_TOL)
    knobs = dict(sink_blocks=1, window_blocks=2, last_full_blocks=1)
    keep = mask_from_table(*select_blocks(q, means, block_size=block_size, alpha=0.1, **knobs))
    check_keep(keep, expected, 0.1, **knobs)


def test_empty_sequence(device):
    q, k, v = (torch.zeros(0, 2, 16, device=device) for _ in range(3))
    out, density = block_sparse_attention(q, k, v, block_size=16, return_density=True)
    assert out.shape == (0, 2, 16) and density == 1.0
    assert block_mean_keys(k, 16).shape == (0, 2, 16)


def _call(device, **changes):
    args = dict(q=torch.zeros(20, 4, 16, device=device), k=torch.zeros(20, 2, 16, device=device),
                v=torch.zeros(20, 2, 16, device=device), block_size=16)
    args.update({name: value.to(device) if isinstance(value, torch.Tensor) else value
                 for name, value in changes.items()})
    return args


# name: (argument changes, message regex); validation runs before any launch
BAD_INPUTS = {
    "q-2d": (dict(q=torch.zeros(20, 16)), r"q must be \[tokens, heads, head_dim\]"),
    "k-int": (dict(k=torch.zeros(20, 2, 16, dtype=torch.int32)), "k dtype must be"),
    "v-shape": (dict(v=torch.zeros(20, 1, 16)), "v .* must have the shape of k"),
    "tokens": (dict(k=torch.zeros(19, 2, 16), v=torch.zeros(19, 2, 16)), "must have the tokens and head_dim of q"),
    "head-dim": (dict(k=torch.zeros(20, 2, 8), v=torch.zeros(20, 2, 8)), "must have the tokens and head_dim"),
    "head-dim-large": (dict(q=torch.zeros(20, 4, 300), k=torch.zeros(20, 2, 300), v=torch.zeros(20, 2, 300)),
                       "1..256 head dims"),
    "groups": (dict(k=torch.zeros(20, 3, 16), v=torch.zeros(20, 3, 16)), "4 query heads do not group over 3"),
    "dtypes": (dict(k=torch.zeros(20, 2, 16, dtype=BF16), v=torch.zeros(20, 2, 16, dtype=BF16)),
               "must share one dtype"),
    "block-24": (dict(block_size=24), "power of two >= 16"),
    "block-8": (dict(block_size=8), "power of two >= 16"),
    "block-float": (dict(block_size=16.0), "power of two >= 16"),
    "window-0": (dict(window_blocks=0), "window_blocks must be an int >= 1"),
    "sink-negative": (dict(sink_blocks=-1), "sink_blocks and last_full_blocks must be ints >= 0"),
    "last-float": (dict(last_full_blocks=1.0), "sink_blocks and last_full_blocks must be ints >= 0"),
    "alpha-high": (dict(alpha=1.5), r"alpha must be a number in \[0, 1\]"),
    "alpha-nan": (dict(alpha=float("nan")), r"alpha must be a number in \[0, 1\]"),
    "scale-inf": (dict(scale=float("inf")), "scale must be a finite number"),
    "out-shape": (dict(out=torch.zeros(20, 4, 8)), r"out must be \[20, 4, 16\] torch.float32"),
    "out-dtype": (dict(out=torch.zeros(20, 4, 16, dtype=F16)), r"out must be \[20, 4, 16\] torch.float32"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_inputs(device, name):
    changes, message = BAD_INPUTS[name]
    with pytest.raises(ValueError, match=message):
        block_sparse_attention(**_call(device, **changes))


def test_bad_tables_and_means(device):
    q, k = torch.zeros(20, 4, 16, device=device), torch.zeros(20, 2, 16, device=device)
    with pytest.raises(ValueError, match=r"k_means must be a float \[M=2, Hkv, 16\]"):
        select_blocks(q, torch.zeros(3, 2, 16, device=device), block_size=16)
    with pytest.raises(ValueError, match="power of two"):
        block_mean_keys(k, 48)
    counts = torch.ones(4, 2, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"indices must be int32 \[4, 2, 2\]"):
        sparse_attention_forward(q, k, k, torch.zeros(4, 2, 2, dtype=torch.int64, device=device), counts,
                                 block_size=16)


def test_kept_fraction():
    assert kept_fraction(torch.tensor([[1, 2, 3], [1, 1, 1]], dtype=torch.int32)) == pytest.approx(9 / 12)


@pytest.mark.skipif(not is_interpreter(), reason="checks the interpreter path of the autotune helper")
def test_interpreter_runs_first_config_only():
    assert len(_sparse_attention_kernel.configs) == 1
    assert _sparse_attention_kernel.configs[0].kwargs == {"BLOCK_M": 128, "BLOCK_N": 64}
