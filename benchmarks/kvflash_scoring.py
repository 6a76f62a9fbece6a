"""GPU: KVFlash's QK residency scoring, Triton kernels vs the torch reference, one run.

    python3 benchmarks/kvflash_scoring.py --json kvflash_scoring.json

A Qwen3-8B-shaped model (36 full-attention layers, 32 query / 8 KV heads, head dim 128, bf16 KV)
at 32K, 128K and 256K tokens of context: 512, 2,048 and 4,096 chunks of 64 tokens. Measured:
* ``score``: per-layer chunk scores from fp32 summaries ``[chunks, layers, 8, 128]`` and the latest
  queries, ``kernels.chunk_score.chunk_scores`` against its torch reference on the same GPU
  (``torch_gpu``) and on the host (``torch_host``: the same scores on the host's cores, queries
  and summaries copied to host memory);
* ``policy``: ``QK.scores`` as a reselection runs it, from the pager's per-chunk summaries to host
  scores (stack, kernel, layer mean, one device-to-host copy);
* ``summary``: one chunk's key summary over all 36 layers, ``kernels.chunk_score.key_means``
  (one launch, keys only) against the per-layer torch path (gather K and V, then mean per layer);
plus the bandwidth the scoring kernel reaches on the summary bytes against a device copy.

``bounds``, the key-bounds policy at the same contexts (fp8 e5m2 bounds ``[chunks, layers, 4 pages, 8, 2,
128]``, 2x QK's bytes: 151, 604 and 1,208 MB):
* ``score``: ``kernels.chunk_bounds.bound_scores`` (reads the fp8 in place) against its torch reference on
  the same GPU (``torch_gpu``, the path before the kernel: the whole stack converted to fp32), and
  ``Bounds.scores`` as a reselection runs it (``policy``: stack, kernel, layer max, one device-to-host copy);
* ``summary_one_chunk``: one chunk's fp8 bounds over all 36 layers, ``kernels.chunk_bounds.key_bounds``
  (one launch, keys only, fp8 written in the kernel) against the per-layer torch path (gather, min/max
  per page, ``outward_fp8``); both must give the same bytes.

``salient``, the salient-key policy (two int4 keys per chunk, layer and KV head with their fp16 scales, of every dim
but the two fastest-rotating pairs, since Qwen3-8B rotates the whole head: ``[chunks, layers, 8, 2, 64]`` uint8, 128 B
per layer and KV head, 0.25x QK's bytes: 18.9, 75.5 and 151 MB), scored with a query
window of ``--window`` tokens (rows ``[36, 32 x window, 128]``):
* ``ms``: ``kernels.chunk_salient.salient_scores`` against its torch reference on the same GPU, and ``Salient.scores``
  as a reselection runs it (``policy``: stack, kernel, layer max, one device-to-host copy, the neighbour rule);
* ``summary_one_chunk``: one chunk's salient keys over all 36 layers (``salient_keys``, one launch) against the
  per-layer torch path (equal bytes), and that cost spread over the chunk's 64 decoded tokens;
* ``paging_ms``: paging in k chunks from pinned host memory and paging out as many (``read_host``), k = 0, 8 and
  every selectable chunk of a ``--pool`` pool;
* ``reselection_ms`` = ``policy`` + ``paging_ms`` per k, and ``share_of_decode``: that over the decode time between
  two reselections, ``max(16, context / 45)`` tokens of ``--decode-step-ms`` (by default the issue's decode step at
  128K).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script path
from benchmarks import report  # noqa: E402
from benchmarks.gpu_timing import copy_bandwidth, device_info, timed  # noqa: E402
from vllm_luce.kernels.chunk_bounds import bound_scores, bound_scores_naive  # noqa: E402
from vllm_luce.kernels.chunk_bounds.naive import outward_fp8  # noqa: E402
from vllm_luce.kernels.chunk_salient import salient_scores, salient_scores_naive  # noqa: E402
from vllm_luce.kernels.chunk_salient.naive import pack_int4  # noqa: E402
from vllm_luce.kernels.chunk_score import chunk_scores, chunk_scores_naive  # noqa: E402
from vllm_luce.kvflash.host_pool import PinnedChunkPool  # noqa: E402
from vllm_luce.kvflash.kv_store import PACKED_LAYOUT, PagedPoolStore  # noqa: E402
from vllm_luce.kvflash.policies import QK, Bounds, Salient  # noqa: E402
from vllm_luce.kernels.scored_dims import FAST_PAIRS, ScoredDims  # noqa: E402

LAYERS, HQ, HKV, D, BLOCK, CHUNK = 36, 32, 8, 128, 16, 64
SCORED = ScoredDims(FAST_PAIRS, D // 2)  # RoPE rotates the whole head: all but its two fastest pairs


class _Pager:
    """What ``QK.scores`` reads of a pager."""

    def __init__(self, queries, summaries):
        self.queries, self.summaries = queries, summaries


def _host_ms(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def scoring(contexts: list[int], reps: int) -> dict:
    dev, out = torch.device("cuda"), {}
    g = torch.Generator(device=dev).manual_seed(0)
    for context in contexts:
        chunks = context // CHUNK
        queries = torch.randn(LAYERS, HQ, D, device=dev, generator=g)
        summaries = torch.randn(chunks, LAYERS, HKV, D, device=dev, generator=g)
        got = chunk_scores(queries, summaries)
        torch.testing.assert_close(got, chunk_scores_naive(queries, summaries), atol=2e-5, rtol=1e-4)
        pager = _Pager(queries, {c: summaries[c].clone() for c in range(chunks)})
        ids = list(range(chunks))
        torch.testing.assert_close(QK().scores(pager, ids), got.mean(-1).cpu(), atol=2e-5, rtol=1e-4)
        host_q, host_s = queries.cpu(), summaries.cpu()
        ms = {"triton": timed(lambda: chunk_scores(queries, summaries), reps),
              "torch_gpu": timed(lambda: chunk_scores_naive(queries, summaries), reps),
              "torch_host": _host_ms(lambda: chunk_scores_naive(host_q, host_s), max(1, reps // 10)),
              "policy": _host_ms(lambda: QK().scores(pager, ids), reps)}
        nbytes = summaries.numel() * 4
        out[f"{context // 1024}K"] = {
            "chunks": chunks, "summary_mb": round(nbytes / 1e6, 1), "ms": {k: round(v, 4) for k, v in ms.items()},
            "triton_GB_per_s": round(nbytes / (ms["triton"] * 1e-3) / 1e9, 1),
            "speedup_vs_torch_gpu": round(ms["torch_gpu"] / ms["triton"], 2),
            "speedup_vs_torch_host": round(ms["torch_host"] / ms["triton"], 1)}
        del pager, summaries, host_s
        torch.cuda.empty_cache()
    return out


def bound_scoring(contexts: list[int], reps: int) -> dict:
    dev, out, pages = torch.device("cuda"), {}, CHUNK // Bounds.page_tokens
    g = torch.Generator(device=dev).manual_seed(1)
    for context in contexts:
        chunks = context // CHUNK
        queries = torch.randn(LAYERS, HQ, D, device=dev, generator=g, dtype=torch.bfloat16)
        a, b = torch.randn(2, chunks, LAYERS, pages, HKV, D, device=dev, generator=g, dtype=torch.bfloat16)
        bounds = outward_fp8(torch.stack([torch.minimum(a, b), torch.maximum(a, b)], dim=-2))  # as the pager keeps them
        del a, b
        got = bound_scores(queries, bounds)
        torch.testing.assert_close(got, bound_scores_naive(queries, bounds), atol=1e-4, rtol=1e-5)
        pager = _Pager(queries, {c: bounds[c].clone() for c in range(chunks)})
        ids = list(range(chunks))
        torch.testing.assert_close(Bounds().scores(pager, ids), got.amax(-1).cpu(), atol=1e-4, rtol=1e-5)
        ms = {"triton": timed(lambda: bound_scores(queries, bounds), reps),
              "torch_gpu": timed(lambda: bound_scores_naive(queries, bounds), max(1, reps // 4)),
              "policy": _host_ms(lambda: Bounds().scores(pager, ids), reps)}
        nbytes = bounds.numel()
        out[f"{context // 1024}K"] = {
            "chunks": chunks, "bounds_mb": round(nbytes / 1e6, 1), "ms": {k: round(v, 4) for k, v in ms.items()},
            "triton_GB_per_s": round(nbytes / (ms["triton"] * 1e-3) / 1e9, 1),
            "speedup_vs_torch_gpu": round(ms["torch_gpu"] / ms["triton"], 2)}
        del pager, bounds
        torch.cuda.empty_cache()
    return out


def _stores(blocks: int) -> tuple[PagedPoolStore, PagedPoolStore]:
    """One pool over 36 bf16 caches in vLLM's GPU layout (NHD stride order): with the one-launch mover, and
    with the per-layer torch path."""
    caches = [torch.randn(blocks, BLOCK, HKV, 2 * D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
              for _ in range(LAYERS)]
    store = PagedPoolStore(caches, PACKED_LAYOUT, D, BLOCK, CHUNK)
    store.row = np.random.default_rng(0).permutation(blocks)[:256]
    torch_path = PagedPoolStore(caches, PACKED_LAYOUT, D, BLOCK, CHUNK)
    torch_path.row, torch_path.mover = store.row, None
    assert store.mover is not None, "the one-launch mover did not engage on these caches"
    return store, torch_path


def summary(blocks: int, reps: int) -> dict:
    store, torch_path = _stores(blocks)
    torch.testing.assert_close(store.summarize(5), torch_path.summarize(5), atol=1e-5, rtol=1e-5)
    ms = {"key_means": timed(lambda: store.summarize(5), reps),
          "torch_per_layer": timed(lambda: torch_path.summarize(5), reps)}
    return {"ms": {k: round(v, 4) for k, v in ms.items()},
            "speedup": round(ms["torch_per_layer"] / ms["key_means"], 2)}


def bound_summary(blocks: int, reps: int) -> dict:
    store, torch_path = _stores(blocks)
    page = Bounds.page_tokens
    fused, plain = store.outward_key_bounds(5, page), torch_path.outward_key_bounds(5, page)
    assert torch.equal(fused.view(torch.uint8), plain.view(torch.uint8)), "fp8 bounds differ from the torch path"
    ms = {"key_bounds": timed(lambda: store.outward_key_bounds(5, page), reps),
          "torch_per_layer": timed(lambda: torch_path.outward_key_bounds(5, page), reps)}
    return {"ms": {k: round(v, 4) for k, v in ms.items()},
            "speedup": round(ms["torch_per_layer"] / ms["key_bounds"], 2)}


def salient(contexts: list[int], reps: int, window: int, pool_tokens: int, blocks: int, step_ms: float) -> dict:
    """The salient policy at Qwen3-8B's shape: scores, one chunk's summary, and a whole reselection's cost against
    the decode time between two reselections (every max(16, context / 45) tokens of ``step_ms``)."""
    dev, out = torch.device("cuda"), {"window": window, "pool_tokens": pool_tokens, "decode_step_ms": step_ms}
    g = torch.Generator(device=dev).manual_seed(2)
    store, torch_path = _stores(blocks)
    fused, plain = store.salient_keys(5, SCORED), torch_path.salient_keys(5, SCORED)
    assert torch.equal(fused, plain), "salient keys differ from the torch path"
    ms = {"salient_keys": timed(lambda: store.salient_keys(5, SCORED), reps),
          "torch_per_layer": timed(lambda: torch_path.salient_keys(5, SCORED), reps)}
    out["summary_one_chunk"] = {"ms": {k: round(v, 4) for k, v in ms.items()},
                                "per_decoded_token_ms": round(ms["salient_keys"] / CHUNK, 5)}
    # Paging: a reselection pages in the chunks it chose and pages out as many (pinned host copies).
    selectable = pool_tokens // CHUNK - 5  # less the sink and the 4 recent chunks
    chunk = store.read(0)  # host memory pinned up front, as the runtime's (host_pool.py)
    pinned = PinnedChunkPool(tuple(chunk.shape), chunk.dtype, store.copy_stream)
    pinned.reserve(2 * (selectable + 1) * chunk.numel() * chunk.element_size())
    store.host_pool = lambda shape, dtype: pinned
    host = store.read_host(0)
    store.synchronize()

    def page(k: int) -> None:
        store.rearrange([], [(i % selectable, host) for i in range(k)])
        [store.read_host(i % selectable) for i in range(k)]
        store.synchronize()
        torch.cuda.synchronize()

    swaps = sorted({0, 8, selectable})
    paging = {k: _host_ms(lambda: page(k), max(1, reps // 4)) for k in swaps}
    out["paging_ms"] = {str(k): round(v, 3) for k, v in paging.items()}
    for context in contexts:
        chunks = context // CHUNK
        queries = torch.randn(LAYERS, HQ * window, D, device=dev, generator=g)  # the window's rows
        keys = pack_int4(torch.randn(chunks, LAYERS, HKV, 2, SCORED.count(D), device=dev, generator=g))  # packed
        got = salient_scores(queries, keys, SCORED)
        torch.testing.assert_close(got, salient_scores_naive(queries, keys, SCORED), atol=1e-4, rtol=1e-5)
        pager = _Pager(queries, {c: keys[c].clone() for c in range(chunks)})
        ids = list(range(chunks))
        own = got.amax(-1).cpu()
        expected = torch.cat([own[:1], torch.maximum(own[1:], own[:-1])])  # each chunk at least its predecessor
        torch.testing.assert_close(Salient(scored=SCORED).scores(pager, ids), expected, atol=1e-4, rtol=1e-5)
        ms = {"triton": timed(lambda: salient_scores(queries, keys, SCORED), reps),
              "torch_gpu": timed(lambda: salient_scores_naive(queries, keys, SCORED), max(1, reps // 4)),
              "policy": _host_ms(lambda: Salient(scored=SCORED).scores(pager, ids), reps)}
        tau = max(16, context // 45)
        between_ms = tau * step_ms
        out[f"{context // 1024}K"] = {
            "chunks": chunks, "summary_mb": round(keys.numel() / 1e6, 1),
            "qk_summary_mb": round(chunks * LAYERS * HKV * D * 4 / 1e6, 1), "ms": {k: round(v, 4) for k, v in ms.items()},
            "reselect_every_tokens": tau,
            "reselection_ms": {str(k): round(ms["policy"] + paging[k], 3) for k in swaps},
            "share_of_decode": {str(k): round((ms["policy"] + paging[k]) / between_ms, 5) for k in swaps}}
        del pager, keys
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072, 262144])
    ap.add_argument("--blocks", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--window", type=int, default=8, help="salient: query rows per head (luce.kvflash.query_window)")
    ap.add_argument("--pool", type=int, default=4096, help="salient: pool tokens (paging cost of a reselection)")
    ap.add_argument("--decode-step-ms", type=float, default=10.0,
                    help="decode step of the 8B shape for the share (the issue's H200 figure at 128K)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    copy = copy_bandwidth()
    scores = scoring(args.contexts, args.reps)
    for row in scores.values():
        row["triton_vs_copy_bandwidth"] = round(row["triton_GB_per_s"] * 1e9 / copy, 3)
    bounds = bound_scoring(args.contexts, args.reps)
    for row in bounds.values():
        row["triton_vs_copy_bandwidth"] = round(row["triton_GB_per_s"] * 1e9 / copy, 3)
    result = {**device_info(), "copy_GB_per_s": round(copy / 1e9, 1), "score": scores,
              "summary_one_chunk": summary(args.blocks, args.reps),
              "bounds": {"score": bounds, "summary_one_chunk": bound_summary(args.blocks, args.reps)},
              "salient": salient(args.contexts, args.reps, args.window, args.pool, args.blocks, args.decode_step_ms)}
    for context, row in result["salient"].items():
        if isinstance(row, dict) and "share_of_decode" in row:
            print(f"salient {context}: reselection {row['reselection_ms']} ms (by chunks paged in), every "
                  f"{row['reselect_every_tokens']} tokens = {row['share_of_decode']} of decode time at "
                  f"{args.decode_step_ms} ms a step", flush=True)
    return report(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
