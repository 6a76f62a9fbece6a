"""KVFlash residency policies: one small interface, ``scores(pager, chunks) -> tensor`` (higher =
keep). Query-based policies read ``pager.queries`` ``[layers, query rows, head]``: the query heads of the
last ``query_window`` tokens (``query_window.py``), grouped over KV heads as heads are. The pager evicts the
lowest-scored evictable chunk and, on reselection, swaps in host chunks that outscore resident ones.

* ``LRU``: recency of use (the token count when the chunk was last attended to). Full attention
  reads every resident chunk at every step, so recency reduces to age: LRU keeps the sinks and the
  most recent chunks (StreamingLLM's window) and never pages anything back in. It is the baseline.
* ``QK``: per chunk, the mean-pooled post-RoPE keys per KV head (``pager.summaries``, filled by
  the pager from its store when a chunk is full), scored by cosine with the current queries. Each
  query head is compared with its group's KV head; the score is the maximum over query heads,
  averaged over the full-attention layers. On a GPU the summaries and scores come from Triton
  kernels (``kernels.chunk_score``) on device-resident summaries and queries; one device-to-host
  copy per scoring brings the [chunks] scores back. Elsewhere the same math runs in torch.
* ``Bounds`` (``"bounds"``): per 16-token page of a chunk, the element-wise minimum and maximum of its
  post-RoPE keys per KV head (Quest, arXiv 2406.10774), kept in fp8 rounded outward. ``sum_d max(q_d * min_d,
  q_d * max_d)`` bounds from above the logit of any of the page's keys with query ``q``, so one key a
  question points at lifts its chunk, where a mean key washes it out. A chunk scores its best page's bound
  (max over each group's query heads), and its best full-attention layer. On needle prompts through vLLM
  (trained Qwen3.6 fixture) 16-token pages kept more needles than 64-token bounds, the max over layers more than
  the mean, and fp8 (e4m3 or e5m2) lost nothing measurable against bf16 (docs/benchmarks.md, "Measurements
  behind design choices in the code"). Summaries are 2x the bytes of QK's fp32 mean key. On a GPU,
  as for QK, Triton kernels (``kernels.chunk_bounds``) write a chunk's fp8 bounds straight from the KV caches
  (one launch for all layers, bit-identical to the torch path) and score the stacked fp8 bounds in place;
  elsewhere the same math runs in torch.
* ``Salient`` (``"salient"``, the default): per chunk, layer and KV head two post-RoPE keys: the key farthest from
  the chunk's mean key, then the key farthest from both (farthest-point selection). Only the dims scored are kept,
  in int4 with an fp16 scale per key (``kernels/chunk_salient/naive.py``): ``2 * (ceil(Dn / 2) + 2)`` bytes per
  layer and KV head for ``Dn`` scored dims. A chunk scores its largest logit ``q . k / sqrt(D)`` over both keys,
  the query rows (each group's heads times the query window's tokens, ``query_window.py``) and the full-attention
  layers, and then at least its predecessor's score (computed from the predecessor's summary whether or not it is
  a candidate): a needle line that straddles a chunk boundary is found through its first chunk, whose score then
  keeps the line's second chunk too. A mean washes out the one line a question points
  at; the keys that stand out from their chunk keep it, and a second key keeps a line the first one missed. Where
  the model rotates only part of each head (Qwen3.5/3.6 and Gemma 4: a quarter, Laguna: half), the logit and the
  stored keys leave the rotated dims out: they carry position, which favours nearby chunks over a far needle. Where
  it rotates all of it, they leave out the two fastest-rotating pairs, so the summary takes D bytes, a quarter of
  QK's (``worker.scored_dims``). On the trained fixture
  through vLLM with the default window of 8 tokens it kept 90-100% of the needles at 12.5-25% residency
  (``docs/fidelity.md``). On a GPU, Triton kernels (``kernels.chunk_salient``) write a chunk's packed keys straight
  from the KV caches (one launch for all layers) and score the stacked summaries in place.
* ``Scorer``: an external per-chunk score (PFlash's drafter scorer plugs in here).
* ``MaxLogit`` (``"attention"``, SFI only): per chunk, the largest attention logit ``q . k / sqrt(d)``
  of the current queries over the chunk's own keys (max over tokens and each group's query heads),
  averaged over the full-attention layers. It reads every scored chunk's keys, which only SFI keeps
  resident; a mean-pooled key washes out the few tokens a question points at.
"""

from __future__ import annotations

from typing import Callable

import torch

from vllm_luce.kernels.chunk_bounds.naive import outward_fp8
from vllm_luce.kernels.scored_dims import ScoredDims


class LRU:
    name = "lru"

    def scores(self, pager, chunks: list[int]) -> torch.Tensor:
        return torch.tensor([float(pager.last_used.get(c, -1)) for c in chunks])


class QK:
    """Reads ``pager.queries`` ([layers, q_heads, head_dim] of the request's latest token, set by
    the worker) and ``pager.summaries``. ``reduce_max`` makes scores rank-invariant under tensor
    parallelism: each rank holds some heads, so the per-layer head maximum is all-reduced (MAX)."""

    name = "qk"
    needs_summaries = needs_queries = True

    def __init__(self, reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.reduce_max = reduce_max

    def scores(self, pager, chunks: list[int]) -> torch.Tensor:
        queries = getattr(pager, "queries", None)
        if queries is None:
            return LRU().scores(pager, chunks)  # no query seen yet: recency
        missing = [c for c in chunks if c not in pager.summaries]
        if missing:
            raise KeyError(f"QK policy: no key summary for chunks {missing[:8]}")
        keys = torch.stack([pager.summaries[c] for c in chunks])  # [C, L, Hkv, D], where the summaries live
        per_layer = qk_layer_scores(queries.to(keys.device), keys)
        if self.reduce_max is not None:
            per_layer = self.reduce_max(per_layer)
        return per_layer.mean(dim=-1).cpu()


def qk_scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """queries [L, Hq, D], keys [C, L, Hkv, D] -> [C]: mean over layers of max over query heads of
    cos(query head, its group's key summary)."""
    return qk_layer_scores(queries, keys).mean(dim=-1)


def qk_layer_scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[C, L] fp32: per layer, the max over query heads of cos(query head, its group's key summary).
    The Triton kernel on a GPU, its torch reference elsewhere (the same semantics, tested together)."""
    if keys.is_cuda and len(keys):
        from vllm_luce.kernels.chunk_score import chunk_scores  # imports Triton: GPU only

        return chunk_scores(queries, keys)
    from vllm_luce.kernels.chunk_score.naive import chunk_scores_naive

    return chunk_scores_naive(queries, keys)


class Bounds(QK):
    """QK's inputs with key bounds for summaries (``summarize``) and the bound for a score."""

    name = "bounds"
    page_tokens = 16

    @classmethod
    def summarize(cls, store, position: int) -> torch.Tensor:
        """[layers, pages, kv_heads, 2, head] fp8: from the store's ``outward_key_bounds`` where it has one
        (``PagedPoolStore``: one Triton launch on a GPU), else ``outward_fp8`` of its ``key_bounds``."""
        own = getattr(store, "outward_key_bounds", None)
        if own is not None:
            return own(position, cls.page_tokens)
        return outward_fp8(store.key_bounds(position, cls.page_tokens))

    def scores(self, pager, chunks: list[int]) -> torch.Tensor:
        queries = getattr(pager, "queries", None)
        if queries is None:
            return LRU().scores(pager, chunks)
        bounds = torch.stack([pager.summaries[c] for c in chunks])  # [C, L, pages, Hkv, 2, D]
        per_layer = bound_layer_scores(queries.to(bounds.device), bounds)
        if self.reduce_max is not None:
            per_layer = self.reduce_max(per_layer)
        return per_layer.amax(dim=-1).cpu()


def bound_layer_scores(queries: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """queries [L, Hq, D], bounds [C, L, pages, Hkv, 2, D] -> [C, L] fp32: per layer, the max over pages and
    query heads of the upper bound ``sum_d max(q_d * min_d, q_d * max_d) / sqrt(D)`` on the logit of any key
    of the page, each query head against its group's KV head; a NaN bound (an infinite bound times a zero
    query element) is +inf. The Triton kernel on a GPU (it reads the fp8 bounds in place; the torch path
    converts them all to fp32), its torch reference elsewhere (the same semantics, tested together)."""
    if bounds.is_cuda and len(bounds):
        from vllm_luce.kernels.chunk_bounds import bound_scores  # imports Triton: GPU only

        return bound_scores(queries, bounds)
    from vllm_luce.kernels.chunk_bounds.naive import bound_scores_naive

    return bound_scores_naive(queries, bounds)


class Salient(QK):
    """QK's inputs with two keys per chunk, layer and KV head for a summary (``summarize``), their scored dims in
    int4: 52 bytes per layer and KV head on the trained fixture (64 dims, 16 rotated) where QK's fp32 mean takes 256;
    D bytes where RoPE rotates the whole head (``ScoredDims``).
    A chunk scores the largest logit ``q . k / sqrt(D)`` of the current query rows (the query window's tokens, each
    group's heads) with its keys at its best full-attention layer, and at least its predecessor's score."""

    name = "salient"

    def __init__(self, reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 scored: ScoredDims = ScoredDims()):
        super().__init__(reduce_max)
        self.scored = scored

    def summarize(self, store, position: int) -> torch.Tensor:
        """[layers, kv_heads, 2, row_bytes] uint8: the store's ``salient_keys`` (``PagedPoolStore``: one Triton launch
        on a GPU), else ``salient_from_keys`` of its chunk's keys ``[layers, tokens, kv_heads, head]``."""
        own = getattr(store, "salient_keys", None)
        if own is not None:
            return own(position, self.scored)
        from vllm_luce.kernels.chunk_salient.naive import salient_from_keys

        return salient_from_keys(store.chunk_keys(position), self.scored)

    def scores(self, pager, chunks: list[int]) -> torch.Tensor:
        queries = getattr(pager, "queries", None)
        if queries is None:
            return LRU().scores(pager, chunks)
        wanted = set(chunks)  # predecessors scored for the neighbour rule, candidates or not
        scored = list(chunks) + [c - 1 for c in chunks if c - 1 not in wanted and c - 1 in pager.summaries]
        summaries = torch.stack([pager.summaries[c] for c in scored])  # [C, L, Hkv, 2, bytes] uint8
        per_layer = salient_layer_scores(queries.to(summaries.device), summaries, self.scored)
        if self.reduce_max is not None:
            per_layer = self.reduce_max(per_layer)
        own = per_layer.amax(dim=-1).cpu()
        at = {c: i for i, c in enumerate(scored)}
        before = torch.tensor([at.get(c - 1, i) for i, c in enumerate(chunks)], dtype=torch.long)
        return torch.maximum(own[: len(chunks)], own[before])


def salient_layer_scores(queries: torch.Tensor, summaries: torch.Tensor,
                         scored: ScoredDims = ScoredDims()) -> torch.Tensor:
    """queries [L, Hq, D], packed summaries [C, L, Hkv, 2, row_bytes] uint8 -> [C, L] fp32 (``salient_scores_naive``):
    the Triton kernel on a GPU (it decodes the packed keys in place), its torch reference elsewhere (tested
    together)."""
    if summaries.is_cuda and len(summaries):
        from vllm_luce.kernels.chunk_salient import salient_scores  # imports Triton: GPU only

        return salient_scores(queries, summaries, scored)
    from vllm_luce.kernels.chunk_salient.naive import salient_scores_naive

    return salient_scores_naive(queries, summaries, scored)


class Scorer:
    """An external per-chunk score, attached once the runtime exists: PFlash's drafter, by the seam's binding
    (``vllm_luce/scorer_policy.py``), which runs after both features are bound."""

    name = "scorer"

    def __init__(self, score_chunks: Callable[[object, list[int]], torch.Tensor] | None = None):
        self.score_chunks = score_chunks

    def attach(self, score_chunks: Callable[[object, list[int]], torch.Tensor]) -> None:
        self.score_chunks = score_chunks

    def scores(self, pager, chunks: list[int]) -> torch.Tensor:
        if self.score_chunks is None:
            raise RuntimeError("luce.kvflash.policy 'scorer': no chunk scorer attached (PFlash's drafter is attached "
                               "after KVFlash's and PFlash's bindings, by vllm_luce/scorer_policy.py)")
        return torch.as_tensor(self.score_chunks(pager, chunks), dtype=torch.float32)


class MaxLogit:
    """Reads ``state.queries`` and ``state.chunk_keys(chunks)`` ([C, layers, tokens, kv_heads, head])."""

    name = "attention"
    needs_queries = True

    def __init__(self, reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.reduce_max = reduce_max

    def scores(self, state, chunks: list[int]) -> torch.Tensor:
        queries = getattr(state, "queries", None)
        if queries is None:
            return LRU().scores(state, chunks)
        per_layer = max_logit_layer_scores(queries.float(), state.chunk_keys(chunks).float())
        if self.reduce_max is not None:
            per_layer = self.reduce_max(per_layer)
        return per_layer.mean(dim=-1)


def max_logit_layer_scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """queries [L, Hq, D], keys [C, L, T, Hkv, D] -> [C, L]: max over tokens and query heads of q.k/sqrt(D),
    each query head against its group's KV head."""
    layers, hq, d = queries.shape
    hkv = keys.shape[3]
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not group over {hkv} KV heads")
    q = queries.view(layers, hkv, hq // hkv, d)
    logits = torch.einsum("lgqd,cltgd->cltgq", q, keys.to(q.dtype)) / d ** 0.5
    return logits.flatten(2).amax(dim=-1)


def make_policy(name: str, scorer: Callable | None = None, reduce_max=None, scored: ScoredDims = ScoredDims()):
    """``scored``: the head dims ``Salient`` stores and scores (``worker.scored_dims``)."""
    if name == "lru":
        return LRU()
    if name == "qk":
        return QK(reduce_max)
    if name == "bounds":
        return Bounds(reduce_max)
    if name == "salient":
        return Salient(reduce_max, scored)
    if name == "attention":
        return MaxLogit(reduce_max)
    if name == "scorer":  # ``scorer`` may be attached later (Scorer.attach)
        return Scorer(scorer)
    raise ValueError(f"luce.kvflash.policy: got {name!r}; expected one of 'lru', 'qk', 'bounds', 'salient', 'scorer', "
                     "'attention'")
