"""The float32 chunked Gated DeltaNet that replaces vLLM's bf16-only C++ prefill kernel on CPUs without bf16
dot products: equal to a token-by-token float64 recurrence, equal to vLLM's kernel to bf16 rounding (varlen
prompts across chunk boundaries, shared key heads, state slots in any order), untouched slots unchanged, and
calls it does not serve left to vLLM's kernel."""

import pytest
import torch

ops = pytest.importorskip("vllm._custom_ops")

from luce_cpu_speedups import gdn_chunk as P  # noqa: E402

EPS = 1e-5


def case(lens, hk, hv, d, seed=0, slots=9):
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q, k = (torch.randn(1, t, hk, d, generator=g).bfloat16() for _ in range(2))
    v = torch.randn(1, t, hv, d, generator=g).bfloat16()
    log_decay = -torch.rand(1, t, hv, generator=g) * 0.7
    beta = torch.rand(1, t, hv, generator=g).bfloat16()
    state = (torch.randn(slots, hv, d, d, generator=g) * 0.3).bfloat16()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.randperm(slots, generator=g)[: len(lens)].int()
    return q, k, v, log_decay, beta, state, cu, indices


def recurrence(q, k, v, log_decay, beta, state, cu, indices):
    """The gated delta rule token by token, in float64."""
    groups = v.shape[2] // k.shape[2]
    q, k = (x[0].double().repeat_interleave(groups, 1) for x in (q, k))
    q = P.l2norm(q, EPS) * q.shape[-1] ** -0.5
    k = P.l2norm(k, EPS)
    v, log_decay, beta = v[0].double(), log_decay[0].double(), beta[0].double()
    out, state = torch.zeros_like(v), state.double().clone()
    bounds = cu.tolist()
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        s = state[int(indices[i])]
        for t in range(start, end):
            s = s * log_decay[t].exp()[:, None, None]
            delta = (v[t] - torch.einsum("hk,hkv->hv", k[t], s)) * beta[t][:, None]
            s = s + k[t][:, :, None] * delta[:, None, :]
            out[t] = torch.einsum("hk,hkv->hv", q[t], s)
        state[int(indices[i])] = s
    return out, state


@pytest.mark.parametrize("lens,hk,hv,d", [([5, 130, 1, 64], 2, 4, 64), ([200, 0, 67], 1, 1, 32)])
def test_float32_chunks_equal_the_token_by_token_recurrence(lens, hk, hv, d):
    q, k, v, log_decay, beta, state, cu, indices = case(lens, hk, hv, d)
    ours_state = state.float()  # float32 slots: no bf16 rounding of the state in this comparison
    out, _ = P.chunk_gated_delta_rule(q, k, v.float(), log_decay, beta, ours_state, True, cu, False, True, indices)
    ref_out, ref_state = recurrence(q, k, v, log_decay, beta, state, cu, indices)
    assert torch.isfinite(out).all() and torch.isfinite(ours_state).all()
    torch.testing.assert_close(out[0].double(), ref_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ours_state.double(), ref_state, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("lens,hk,hv,d", [([5, 130, 1, 64], 2, 4, 64), ([220, 97, 3], 2, 2, 128)])
def test_matches_vllms_kernel_to_bf16_rounding(lens, hk, hv, d):
    q, k, v, log_decay, beta, state, cu, indices = case(lens, hk, hv, d, seed=1)
    theirs_state, ours_state = state.clone(), state.clone()
    theirs, _ = ops.chunk_gated_delta_rule_cpu(q, k, v, log_decay, beta, theirs_state, True, cu, False, True, indices)
    ours, _ = P.chunk_gated_delta_rule(q, k, v, log_decay, beta, ours_state, True, cu, False, True, indices)
    assert ours.dtype == theirs.dtype == torch.bfloat16 and torch.isfinite(ours.float()).all()
    torch.testing.assert_close(ours.float(), theirs.float(), atol=2e-3, rtol=2e-2)
    torch.testing.assert_close(ours_state.float(), theirs_state.float(), atol=1.6e-2, rtol=2e-2)
    untouched = [s for s in range(state.shape[0]) if s not in indices.tolist()]
    assert torch.equal(ours_state[untouched], state[untouched])


def test_calls_it_does_not_serve_go_to_vllms_kernel():
    calls = []
    wrapper = P._make_wrapper(lambda *a: calls.append(a) or "vllm")
    q, k, v, log_decay, beta, state, cu, indices = case([3, 4], 1, 1, 32)
    assert wrapper(q, k, v, log_decay, beta, state, True, cu, True, True, indices) == "vllm"  # head_first
    assert wrapper(q.float(), k.float(), v.float(), log_decay, beta, state, True, cu, False, True, indices) == "vllm"
    padded = torch.tensor([2, -1], dtype=torch.int32)
    assert wrapper(q, k, v, log_decay, beta, state, True, cu, False, True, padded) == "vllm"
    out, _ = wrapper(q, k, v, log_decay, beta, state, True, cu, False, True, indices)
    assert len(calls) == 3 and out.shape == v.shape
