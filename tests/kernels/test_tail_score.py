"""tail_score: the Triton kernels against the plain PyTorch reference.

Outputs go into NaN-poisoned tensors, so an element the kernel fails to write shows up as
non-finite. Sizes are small and odd on purpose: each interpreter launch runs its programs one by
one in Python. The split-merge path (long prompts) is reached by shrinking the split size.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from vllm_luce.kernels._triton import is_interpreter
from vllm_luce.kernels.tail_score import tail_score, tail_score_naive

_kernel_module = importlib.import_module("vllm_luce.kernels.tail_score.tail_score")  # the package shadows it

from tests.kernels.layouts import strided_randn

pytestmark = pytest.mark.kernel

# fp32 accumulation (and exp2 vs exp) in a different order than the reference: a few ulps.
FP32_TOL = dict(rtol=1e-5, atol=1e-5)
# Half inputs: products are exact in fp32 on both sides, so only the summation order differs; the
# margin covers the GPU's approximate exp2 and tensor-core accumulation.
HALF_TOL = dict(rtol=1e-4, atol=1e-5)




def _inputs(L, S, Hq, Hkv, D, dtype, device, q_layout="contiguous", k_layout="contiguous", seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return strided_randn(L, Hq, D, dtype, q_layout, device, gen), strided_randn(S, Hkv, D, dtype, k_layout, device, gen)


def _masked(L, S, device):
    """[L, S] True where key j comes after lookahead row i (j > S - L + i)."""
    return torch.arange(S, device=device)[None, :] > (S - L + torch.arange(L, device=device))[:, None]


# L, S, Hq, Hkv, D, dtype, q layout, k layout.
CASES = [
    (1, 1, 1, 1, 16, torch.float32, "contiguous", "contiguous"),
    (8, 8, 2, 1, 24, torch.bfloat16, "padded_rows", "token_strided"),  # L = S: the whole prompt
    (8, 37, 4, 2, 40, torch.float16, "dim_strided", "head_major"),
    (3, 200, 6, 3, 64, torch.float32, "head_major", "padded_rows"),
    (8, 129, 2, 2, 128, torch.bfloat16, "contiguous", "dim_strided"),
    (5, 70, 16, 8, 128, torch.float16, "token_strided", "contiguous"),  # drafter-like heads
    (70, 90, 4, 1, 32, torch.float32, "padded_rows", "head_major"),  # several row blocks per pass
]


@pytest.mark.parametrize("L,S,Hq,Hkv,D,dtype,q_layout,k_layout", CASES,
                         ids=[f"L{c[0]}-S{c[1]}-h{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}" for c in CASES])
def test_matches_naive(poisoned, device, L, S, Hq, Hkv, D, dtype, q_layout, k_layout):
    q, k = _inputs(L, S, Hq, Hkv, D, dtype, device, q_layout, k_layout)
    expected = tail_score_naive(q, k)
    # Poisoned margin rows turn a stray write into a failure (under the interpreter, into a crash).
    buffer = poisoned((L + 2, S))
    out = buffer[1:-1]

    result = tail_score(q, k, out=out)

    assert result is out
    assert torch.isfinite(result).all(), "the kernel left elements of out unwritten"
    assert torch.isnan(buffer[[0, -1]]).all(), "the kernel wrote outside out"
    assert (result[_masked(L, S, device)] == 0).all(), "keys after a row's position must score 0"
    torch.testing.assert_close(result, expected, **(FP32_TOL if dtype == torch.float32 else HALF_TOL))


@pytest.mark.parametrize("split_keys", [1, 48, 64], ids=lambda n: f"split{n}")
def test_split_merge(monkeypatch, poisoned, device, split_keys):
    # S = 130, L = 8 with 64-key splits: the last split [128, 130) holds no key rows 0..5 may see.
    L, S, Hq, Hkv, D = (8, 37, 2, 1, 24) if split_keys == 1 else (8, 130, 4, 2, 40)
    monkeypatch.setattr(_kernel_module, "_SPLIT_KEYS", split_keys)
    q, k = _inputs(L, S, Hq, Hkv, D, torch.float32, device, seed=1)

    result = tail_score(q, k, out=poisoned((L, S)))

    assert torch.isfinite(result).all()
    assert (result[_masked(L, S, device)] == 0).all()
    torch.testing.assert_close(result, tail_score_naive(q, k), **FP32_TOL)


def test_accumulate_running_max(device):
    L, S, Hq, Hkv, D = 4, 45, 4, 2, 32
    gen = torch.Generator(device="cpu").manual_seed(2)
    init = torch.rand(L, 2 * S, generator=gen).to(device)[:, 1::2]  # finite, strided
    out, expected = init.clone(), init.clone()
    for layer in range(2):  # a running max across two layers
        q, k = _inputs(L, S, Hq, Hkv, D, torch.bfloat16, device, k_layout="head_major", seed=10 + layer)
        assert tail_score(q, k, out=out, accumulate=True) is out
        tail_score_naive(q, k, out=expected, accumulate=True)

    assert torch.isfinite(out).all()
    masked = _masked(L, S, device)
    assert torch.equal(out[masked], init[masked]), "masked keys score 0 and must keep the running max"
    assert (out >= init).all()
    torch.testing.assert_close(out, expected, **HALF_TOL)


def test_single_head_rows_are_softmax(device):
    L, S, D = 6, 50, 40
    q, k = _inputs(L, S, 1, 1, D, torch.float32, device, seed=3)
    result = tail_score(q, k)
    assert result.shape == (L, S) and result.dtype == torch.float32 and result.is_contiguous()
    torch.testing.assert_close(result.sum(dim=1), torch.ones(L, device=device), **FP32_TOL)
    # With several heads the max over heads sums to at least 1 per row.
    q, k = _inputs(L, S, 4, 2, D, torch.float32, device, seed=4)
    assert (tail_score(q, k).sum(dim=1) >= 1 - 1e-5).all()


def test_large_logits_stay_finite(device):
    # Logits of a few hundred: exp without the running max would overflow fp32.
    L, S, Hq, Hkv, D = 3, 90, 2, 1, 64
    q, k = _inputs(L, S, Hq, Hkv, D, torch.float32, device, seed=5)
    result = tail_score(q, k, scale=8.0)
    assert torch.isfinite(result).all()
    torch.testing.assert_close(result, tail_score_naive(q, k, scale=8.0), **FP32_TOL)


def test_naive_reference_by_hand():
    # One head, D = 1, q = 0: every visible key gets the same logit, so row i is uniform over
    # its S - L + i + 1 keys.
    q, k = torch.zeros(2, 1, 1), torch.ones(4, 1, 1)
    result = tail_score_naive(q, k)
    torch.testing.assert_close(result, torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0.0], [0.25] * 4]))
    assert result[0, 3] == 0


def _bad_call(device, **changes):
    args = dict(q_tail=torch.zeros(2, 4, 8, device=device), k=torch.zeros(5, 2, 8, device=device))
    args.update(changes)
    return args


# name: (argument changes, message regex)
BAD_INPUTS = {
    "q-2d": (dict(q_tail=torch.zeros(2, 8)), r"q_tail \[L, Hq, D\] must be a 3-D tensor"),
    "k-4d": (dict(k=torch.zeros(5, 2, 8, 1)), r"k \[S, Hkv, D\] must be a 3-D tensor"),
    "head-dim": (dict(k=torch.zeros(5, 2, 16)), "same head_dim"),
    "head-dim-too-big": (dict(q_tail=torch.zeros(2, 4, 300), k=torch.zeros(5, 2, 300)), "same head_dim"),
    "L-gt-S": (dict(q_tail=torch.zeros(6, 4, 8)), "1 <= L <= S"),
    "L-0": (dict(q_tail=torch.zeros(0, 4, 8)), "1 <= L <= S"),
    "groups": (dict(k=torch.zeros(5, 3, 8)), "4 query heads do not group over 3 KV heads"),
    "dtype-mismatch": (dict(k=torch.zeros(5, 2, 8, dtype=torch.bfloat16)), "must share one dtype"),
    "dtype-int": (dict(q_tail=torch.zeros(2, 4, 8, dtype=torch.int32), k=torch.zeros(5, 2, 8, dtype=torch.int32)),
                  "must share one dtype"),
    "out-shape": (dict(out=torch.zeros(2, 4)), r"out must be \[2, 5\] torch.float32"),
    "out-dtype": (dict(out=torch.zeros(2, 5, dtype=torch.bfloat16)), r"out must be \[2, 5\] torch.float32"),
    "accumulate-no-out": (dict(accumulate=True), "accumulate=True needs out"),
    "k-on-meta": (dict(k=torch.zeros(5, 2, 8, device="meta")), "q_tail is on .* but k on meta"),
    "out-on-meta": (dict(out=torch.zeros(2, 5, device="meta")), r"out must be \[2, 5\] torch.float32 on"),
}


@pytest.mark.parametrize("impl", [tail_score, tail_score_naive], ids=["triton", "naive"])
@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_inputs(device, impl, name):
    changes, message = BAD_INPUTS[name]
    changes = {key: v.to(device) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v
               for key, v in changes.items()}
    with pytest.raises(ValueError, match=message):
        impl(**_bad_call(device, **changes))


@pytest.mark.skipif(not is_interpreter(), reason="checks the interpreter path of the autotune helper")
def test_interpreter_runs_first_config_only():
    for kernel in (_kernel_module._tail_stats_kernel, _kernel_module._tail_scores_kernel):
        assert len(kernel.configs) == 1
        assert kernel.configs[0].kwargs == {"BLOCK_N": 64} and kernel.configs[0].num_warps == 4
