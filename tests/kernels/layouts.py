"""Random [tokens, heads, head_dim] test inputs as views with the strides a named layout gives,
shared by the kernel tests (every kernel must accept any strides)."""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "token_strided", "padded_rows", "head_major", "dim_strided")


def strided_randn(n, heads, head_dim, dtype, layout, device, gen: torch.Generator) -> torch.Tensor:
    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    if layout == "contiguous":
        return randn(n, heads, head_dim)
    if layout == "token_strided":  # every other token of a larger buffer
        return randn(2 * n, heads, head_dim)[::2]
    if layout == "padded_rows":  # heads and dims sliced out of wider rows, as in a fused QKV buffer
        return randn(n, heads + 2, head_dim + 3)[:, 1:heads + 1, :head_dim]
    if layout == "head_major":  # [heads, n, dims] storage seen as [n, heads, dims]
        return randn(heads, n, head_dim).transpose(0, 1)
    if layout == "dim_strided":  # every other element along head_dim
        return randn(n, heads, 2 * head_dim)[:, :, ::2]
    raise AssertionError(layout)
