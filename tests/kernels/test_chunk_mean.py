"""chunk_mean: the Triton kernel against the plain PyTorch reference.

Every kernel output goes into a NaN-poisoned tensor, so an element the kernel fails to write shows
up as non-finite. Sizes are small and odd on purpose: each interpreter launch runs its programs
one by one in Python.
"""

from __future__ import annotations

import pytest
import torch

from vllm_luce.kernels._triton import is_interpreter
from vllm_luce.kernels.chunk_mean import chunk_mean, chunk_mean_naive
from vllm_luce.kernels.chunk_mean.chunk_mean import _chunk_mean_kernel

from tests.kernels.layouts import strided_randn

pytestmark = pytest.mark.kernel

# fp32 accumulation in a different order than the reference: a few ulps of the chunk sums.
FP32_TOL = dict(rtol=1e-5, atol=1e-5)


def _cu_seqlens(seq_lens, dtype, device):
    return torch.tensor([0] + list(seq_lens), dtype=torch.int64, device=device).cumsum(0).to(dtype)


def _make_keys(total_tokens, num_heads, head_dim, dtype, layout, device, seed=0):
    """Random keys of the given shape, as a view with the strides that `layout` names."""
    return strided_randn(total_tokens, num_heads, head_dim, dtype, layout, device, torch.Generator(device="cpu").manual_seed(seed))


# head_dim, num_heads, chunk_size, keys dtype, cu_seqlens dtype, sequence lengths, keys layout.
# The lengths cover 0, 1, chunk_size - 1, chunk_size, chunk_size + 1 and a few hundred.
CASES = [
    (1, 1, 1, torch.float32, torch.int32, [0, 1, 3, 0], "contiguous"),
    (33, 3, 7, torch.float32, torch.int64, [0, 1, 6, 7, 8, 150], "token_strided"),
    (64, 1, 64, torch.bfloat16, torch.int32, [63, 64, 65, 0, 300], "padded_rows"),
    (80, 3, 64, torch.bfloat16, torch.int64, [1, 129, 64], "head_major"),
    (200, 1, 64, torch.float16, torch.int32, [70, 0, 5], "dim_strided"),  # two head_dim blocks
    (128, 8, 64, torch.bfloat16, torch.int64, [300, 1, 511, 64], "token_strided"),  # KVFlash-like
]


@pytest.mark.parametrize("head_dim,num_heads,chunk_size,dtype,index_dtype,seq_lens,layout", CASES,
                         ids=[f"d{c[0]}-h{c[1]}-c{c[2]}-{str(c[3])[6:]}-{c[6]}" for c in CASES])
def test_matches_naive(poisoned, device, head_dim, num_heads, chunk_size, dtype, index_dtype,
                       seq_lens, layout):
    keys = _make_keys(sum(seq_lens), num_heads, head_dim, dtype, layout, device)
    cu_seqlens = _cu_seqlens(seq_lens, index_dtype, device)
    expected, expected_cu_chunks = chunk_mean_naive(keys, cu_seqlens, chunk_size)

    # A poisoned margin chunk on each side turns a stray write into a failure rather than a crash:
    # under the interpreter an out-of-bounds store corrupts the host heap.
    buffer = poisoned((expected.shape[0] + 2, num_heads, head_dim), torch.float32)
    out = buffer[1:-1]
    means, cu_chunks = chunk_mean(keys, cu_seqlens, chunk_size, out=out)

    assert means is out
    assert torch.isfinite(means).all(), "the kernel left elements of out unwritten"
    assert torch.isnan(buffer[[0, -1]]).all(), "the kernel wrote outside out"
    torch.testing.assert_close(means, expected, **FP32_TOL)
    assert cu_chunks.dtype == index_dtype
    assert torch.equal(cu_chunks, expected_cu_chunks)
    chunks_per_seq = [-(-n // chunk_size) for n in seq_lens]
    assert cu_chunks.tolist() == torch.tensor([0] + chunks_per_seq).cumsum(0).tolist()


def test_naive_reference_by_hand():
    keys = torch.arange(5, dtype=torch.float32).view(5, 1, 1)  # tokens 0..4
    means, cu_chunks = chunk_mean_naive(keys, torch.tensor([0, 3, 3, 5]), chunk_size=2)
    # Sequence 0 = tokens 0,1,2 -> chunks {0,1} {2}; sequence 1 is empty; sequence 2 = {3,4}.
    assert means.flatten().tolist() == [0.5, 2.0, 3.5]
    assert cu_chunks.tolist() == [0, 2, 2, 3]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_output(poisoned, device, out_dtype):
    seq_lens, chunk_size = [9, 20], 8
    keys = _make_keys(sum(seq_lens), 2, 48, torch.bfloat16, "contiguous", device, seed=1)
    cu_seqlens = _cu_seqlens(seq_lens, torch.int32, device)
    expected, _ = chunk_mean_naive(keys, cu_seqlens, chunk_size, out_dtype=out_dtype)

    means, _ = chunk_mean(keys, cu_seqlens, chunk_size, out_dtype=out_dtype,
                          out=poisoned(expected.shape, out_dtype))

    assert means.dtype == out_dtype
    assert torch.isfinite(means).all()
    # Both round the same fp32 mean once; a different summation order may flip the last bit.
    torch.testing.assert_close(means, expected)


def test_allocates_fp32_output(device):
    keys = _make_keys(10, 2, 16, torch.bfloat16, "contiguous", device, seed=2)
    means, cu_chunks = chunk_mean(keys, _cu_seqlens([10], torch.int64, device), 4)
    assert means.dtype == torch.float32 and means.shape == (3, 2, 16) and means.is_contiguous()
    torch.testing.assert_close(means, chunk_mean_naive(keys, _cu_seqlens([10], torch.int64, device), 4)[0],
                               **FP32_TOL)
    assert cu_chunks.tolist() == [0, 3]


def test_writes_only_inside_out(poisoned, device):
    seq_lens, num_heads, head_dim, chunk_size = [5, 0, 12], 3, 20, 4
    keys = _make_keys(sum(seq_lens), num_heads, head_dim, torch.float32, "contiguous", device, seed=3)
    cu_seqlens = _cu_seqlens(seq_lens, torch.int32, device)
    total_chunks = 2 + 0 + 3
    # out is a strided window of a larger poisoned buffer: chunks 2..6, heads 1..3, every other dim.
    buffer = poisoned((total_chunks + 4, num_heads + 2, 2 * head_dim + 3), torch.float32)
    window = (slice(2, 2 + total_chunks), slice(1, 1 + num_heads), slice(1, 1 + 2 * head_dim, 2))
    out = buffer[window]

    chunk_mean(keys, cu_seqlens, chunk_size, out=out)

    inside = torch.zeros(buffer.shape, dtype=torch.bool, device=device)
    inside[window] = True
    assert torch.isfinite(buffer[inside]).all()
    assert torch.isnan(buffer[~inside]).all(), "the kernel wrote outside out"
    torch.testing.assert_close(out, chunk_mean_naive(keys, cu_seqlens, chunk_size)[0], **FP32_TOL)


@pytest.mark.parametrize("seq_lens", [[], [0, 0]], ids=["no-sequences", "empty-sequences"])
def test_no_chunks(device, seq_lens):
    keys = torch.empty(0, 2, 8, device=device)
    means, cu_chunks = chunk_mean(keys, _cu_seqlens(seq_lens, torch.int32, device), 64)
    assert means.shape == (0, 2, 8) and means.dtype == torch.float32
    assert cu_chunks.tolist() == [0] * (len(seq_lens) + 1)


def _bad_call(device, **changes):
    args = dict(keys=torch.zeros(5, 2, 4, device=device),
                cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32, device=device),
                chunk_size=2)
    args.update(changes)
    return args


# name: (argument changes, exception type, message regex)
BAD_INPUTS = {
    "keys-2d": (dict(keys=torch.zeros(5, 8)), ValueError,
                r"keys must be \[total_tokens, num_heads, head_dim\]"),
    "keys-int": (dict(keys=torch.zeros(5, 2, 4, dtype=torch.int32)), TypeError, "keys dtype must be"),
    "cu-2d": (dict(cu_seqlens=torch.tensor([[0, 5]])), ValueError, "cu_seqlens must be a 1-D tensor"),
    "cu-float": (dict(cu_seqlens=torch.tensor([0.0, 5.0])), TypeError,
                 "cu_seqlens dtype must be int32 or int64"),
    "chunk-0": (dict(chunk_size=0), ValueError, "chunk_size must be a positive int, got 0"),
    "chunk-negative": (dict(chunk_size=-3), ValueError, "chunk_size must be a positive int"),
    "chunk-float": (dict(chunk_size=2.0), ValueError, "chunk_size must be a positive int"),
    "cu-start": (dict(cu_seqlens=torch.tensor([1, 3, 5])), ValueError, "cu_seqlens must start at 0, got 1"),
    "cu-decreasing": (dict(cu_seqlens=torch.tensor([0, 4, 3, 5])), ValueError,
                      "cu_seqlens must be non-decreasing"),
    "cu-end": (dict(cu_seqlens=torch.tensor([0, 3])), ValueError,
               "cu_seqlens must end at total_tokens=5, got 3"),
    "out-dtype-int": (dict(out_dtype=torch.int32), TypeError,
                      "out_dtype must be float32, float16 or bfloat16"),
    "out-shape": (dict(out=torch.zeros(2, 2, 4)), ValueError, r"out must be \[3, 2, 4\] torch.float32"),
    "out-dtype-mismatch": (dict(out=torch.zeros(3, 2, 4, dtype=torch.bfloat16)), ValueError,
                           r"out must be \[3, 2, 4\] torch.float32"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_inputs(device, name):
    changes, error, message = BAD_INPUTS[name]
    changes = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in changes.items()}
    with pytest.raises(error, match=message):
        chunk_mean(**_bad_call(device, **changes))


@pytest.mark.skipif(not is_interpreter(), reason="checks the interpreter path of the autotune helper")
def test_interpreter_runs_first_config_only():
    assert len(_chunk_mean_kernel.configs) == 1
    assert _chunk_mean_kernel.configs[0].kwargs == {"BLOCK_T": 32}
