"""Plain PyTorch references of chunk_bounds, written for clarity rather than speed. The storage format is
``outward_fp8``'s; ``bound_scores_naive`` is the torch path of ``policies.bound_layer_scores``."""

from __future__ import annotations

import torch

from vllm_luce.kernels.chunk_copy.naive import gather_tokens_naive


def outward_fp8(bounds: torch.Tensor) -> torch.Tensor:
    """[..., 2 (min, max), D] bounds as fp8 e5m2, rounded outward (the minimum down, the maximum up), so they
    still bound every key. e5m2 spans +-57344, so no key is out of range; its relative spacing is 1/4, hence
    the 5/4 and 3/4 factors, and 2^-15 carries values below its subnormals outward too."""
    lo, hi = bounds[..., 0, :].float(), bounds[..., 1, :].float()
    lo = torch.where(lo > 0, lo * 0.75, lo * 1.25) - 2.0 ** -15
    hi = torch.where(hi > 0, hi * 1.25, hi * 0.75) + 2.0 ** -15
    return torch.stack([lo, hi], dim=-2).to(torch.float8_e5m2)


def key_bounds_naive(caches: list[torch.Tensor], slots: torch.Tensor, head_dim: int, page_tokens: int) -> torch.Tensor:
    """[layers, pages, kv_heads, 2 (min, max), head_dim] fp8 e5m2: per page of ``page_tokens`` consecutive cache
    ``slots``, the element-wise min and max of every layer's keys (the first ``head_dim`` elements of each head's
    row in a ``[blocks, kv_heads, block_size, width]`` cache), rounded outward (``outward_fp8``)."""
    keys = gather_tokens_naive(caches, slots)[..., :head_dim]  # [L, T, H, D]
    pages = keys.unflatten(1, (-1, page_tokens))  # [L, pages, page, H, D]
    return outward_fp8(torch.stack([pages.amin(dim=2), pages.amax(dim=2)], dim=3))


def bound_scores_naive(queries: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """queries [L, Hq, D], bounds [C, L, pages, Hkv, 2, D] -> [C, L] fp32: per layer, the max over pages and
    query heads of the upper bound ``sum_d max(q_d * min_d, q_d * max_d) / sqrt(D)`` on the logit of any key
    of the page, each query head against its group's KV head."""
    layers, hq, d = queries.shape
    hkv = bounds.shape[3]
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not group over {hkv} KV heads")
    q = queries.float().reshape(layers, hkv, hq // hkv, d)
    lo, hi = bounds[..., 0, :].float(), bounds[..., 1, :].float()  # [C, L, pages, Hkv, D]
    # max(q_d min_d, q_d max_d) is q_d max_d where q_d > 0, else q_d min_d: two contractions, nothing of size
    # groups x (min, max) x D per page materialized.
    bound = (torch.einsum("lhgd,clphd->clphg", q.clamp(min=0), hi)
             + torch.einsum("lhgd,clphd->clphg", q.clamp(max=0), lo)) / d ** 0.5
    # A key beyond fp8's range is stored as an infinite bound; times a zero query element (one of the two clamps
    # is zero wherever a bound is infinite) that is NaN: unbounded, +inf. An infinite sum stays infinite
    # (``nan_to_num`` would also have turned it into the largest finite float, below a NaN page's +inf).
    return torch.where(bound.isnan(), float("inf"), bound).flatten(2).amax(dim=-1)
