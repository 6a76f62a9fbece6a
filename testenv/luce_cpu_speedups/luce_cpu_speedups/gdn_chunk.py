"""vLLM's CPU chunked Gated DeltaNet prefill computes in float32 on CPUs without bf16 dot products (a
test-environment speed-up).

vLLM's C++ ``chunk_gated_delta_rule_cpu`` takes bf16 only, and on an x86 CPU without AVX512-BF16 its bf16
arithmetic is emulated, the larger part of a prefill-and-decode run once the linear layers compute in float32.
``chunk_gated_delta_rule``
below is the same chunked delta rule in float32 PyTorch matmuls. Per sequence, in chunks of ``CHUNK`` tokens:

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,   o_t = S_t^T (q_t / sqrt(d_k))

with q and k L2-normalised. Within a chunk the rank-one updates are solved at once with one triangular
solve; across chunks the state is carried sequentially. State layout ``[slot, value head, d_k, d_v]``,
key heads shared by consecutive value heads, as vLLM's kernel (checked against it in the tests).
"""

from __future__ import annotations

import functools

import torch

from luce_cpu_speedups import applied, isa, signature
from vllm_luce.patches import wrap_function

TARGET = "vllm._custom_ops:chunk_gated_delta_rule_cpu"
CHUNK = 64


def l2norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _chunks(x: torch.Tensor, n: int) -> torch.Tensor:
    """[T, ...] -> [n, CHUNK, ...], zero-padded at the end (zero rows change neither state nor outputs)."""
    pad = n * CHUNK - x.shape[0]
    if pad:
        x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
    return x.view(n, CHUNK, *x.shape[1:])


def _sequence(q, k, v, g, beta, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, float32: q, k [T, H, K]; v [T, H, V]; g, beta [T, H]; state [H, K, V].
    Returns the output [T, H, V] and the final state."""
    T = q.shape[0]
    n = (T + CHUNK - 1) // CHUNK
    # [n, H, C, .] so that every matmul is batched over chunks and heads
    q, k, v = (_chunks(x, n).transpose(1, 2) for x in (q, k, v))
    g, beta = (_chunks(x, n).transpose(1, 2) for x in (g, beta))
    g = g.cumsum(-1)  # log decay from the chunk's start, inclusive
    decay = (g.unsqueeze(-1) - g.unsqueeze(-2)).tril().exp().tril()  # [n, H, C, C]: exp(g_i - g_j), i >= j
    k_beta = k * beta.unsqueeze(-1)
    strict = torch.ones(CHUNK, CHUNK, dtype=torch.bool).tril(-1)
    lower = (k_beta @ k.transpose(-1, -2) * decay).masked_fill(~strict, 0)
    eye = torch.eye(CHUNK, dtype=q.dtype)
    solve = torch.linalg.solve_triangular(eye + lower, eye.expand_as(lower), upper=False, unitriangular=True)
    values = solve @ (v * beta.unsqueeze(-1))  # the chunk's corrected values before the carried state
    k_carried = solve @ (k_beta * g.exp().unsqueeze(-1))  # how the carried state enters them
    inner = (q @ k.transpose(-1, -2) * decay).masked_fill(~strict.logical_or(eye.bool()), 0)
    q_decayed = q * g.exp().unsqueeze(-1)
    k_to_end = k * (g[..., -1:] - g).exp().unsqueeze(-1)
    end_decay = g[..., -1].exp()[..., None, None]
    out = torch.empty_like(values)
    for c in range(n):
        v_new = values[c] - k_carried[c] @ state
        out[c] = q_decayed[c] @ state + inner[c] @ v_new
        state = state * end_decay[c] + k_to_end[c].transpose(-1, -2) @ v_new
    return out.transpose(1, 2).reshape(n * CHUNK, *out.shape[1:2], out.shape[-1])[:T], state


def chunk_gated_delta_rule(query, key, value, g, beta, initial_state, output_final_state, cu_seqlens, head_first,
                           use_qk_l2norm_in_kernel, initial_state_indices, eps=1e-5):
    """vLLM's ``chunk_gated_delta_rule_cpu`` contract: q, k [1, T, Hk, K], v [1, T, Hv, V], g and beta
    [1, T, Hv]; each sequence starts from ``initial_state[initial_state_indices[i]]`` and, with
    ``output_final_state``, leaves its final state there. Returns (output [1, T, Hv, V] in v's dtype, None)."""
    if head_first:
        raise ValueError("chunk_gated_delta_rule: head_first=True is not supported (vLLM passes False)")
    groups = value.shape[2] // key.shape[2]
    q, k = (x[0].float().repeat_interleave(groups, dim=1) for x in (query, key))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q, eps), l2norm(k, eps)
    q = q * q.shape[-1] ** -0.5
    v, g32, beta32 = value[0].float(), g[0].float(), beta[0].float()
    out = torch.empty(v.shape, dtype=value.dtype)
    bounds = cu_seqlens.tolist()
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if start == end:
            continue
        slot = int(initial_state_indices[i])
        o, final = _sequence(q[start:end], k[start:end], v[start:end], g32[start:end], beta32[start:end],
                             initial_state[slot].float())
        out[start:end] = o.to(value.dtype)
        if output_final_state:
            initial_state[slot] = final.to(initial_state.dtype)
    return out.unsqueeze(0), None


def _make_wrapper(original):
    @functools.wraps(original)
    def chunk_gated_delta_rule_cpu(query, key, value, g, beta, initial_state, output_final_state, cu_seqlens,
                                   head_first, use_qk_l2norm_in_kernel, initial_state_indices, eps=1e-5):
        if head_first or query.dtype != torch.bfloat16 or bool((initial_state_indices < 0).any()):
            return original(query, key, value, g, beta, initial_state, output_final_state, cu_seqlens,
                            head_first, use_qk_l2norm_in_kernel, initial_state_indices, eps)
        return chunk_gated_delta_rule(query, key, value, g, beta, initial_state, output_final_state, cu_seqlens,
                                      head_first, use_qk_l2norm_in_kernel, initial_state_indices, eps)

    return chunk_gated_delta_rule_cpu


def apply() -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or isa.native_bf16():
        return False
    from vllm import _custom_ops

    done = wrap_function(_custom_ops, "chunk_gated_delta_rule_cpu", signature(TARGET), _make_wrapper)
    if done:
        applied(TARGET)
    return done
