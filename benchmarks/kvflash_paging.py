"""GPU: KVFlash paging throughput in vLLM's KV cache layout vs pinned-copy bandwidth, one run.

    python3 benchmarks/kvflash_paging.py --json kvflash_paging.json

A Qwen3-8B-shaped model pools 36 full-attention layers (8 KV heads, head dim 128, bf16) in the
FlashAttention layout ``[2, blocks, 16, heads, dim]``. One 64-token chunk is 9.4 MB over all
layers. Measured through ``PagedPoolStore`` (what the worker runs):
* ``page_out``: gather the chunk from every layer, copy to pinned host memory, until the copy is done;
* ``page_out_compute_stream``: what the compute stream spends on a page-out, the gather into a staging
  tensor (the host copy runs on the side stream);
* ``page_in``: copy host bytes back and scatter them into another pool position;
* ``move``: relocate a chunk inside the pool (compaction), all layers;
* ``write_through_64_tokens``: the alternative to page-out on eviction, copying each decoded token's K
  and V to the host as it is written: 64 one-token copies (one per decode step), the bytes of one chunk;
against ``torch`` copies of the same byte count between pinned host and device memory, and against
the same store moving rows with one torch copy per layer (``*_per_layer``, the path before the
one-launch ``kernels.chunk_copy`` mover), in the same run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script path
from benchmarks import report  # noqa: E402
from benchmarks.gpu_timing import device_info, timed  # noqa: E402
from vllm_luce.kvflash.kv_store import PACKED_LAYOUT, PagedPoolStore  # noqa: E402

LAYERS, HKV, D, BLOCK, CHUNK = 36, 8, 128, 16, 64


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    caches = [torch.randn(args.blocks, BLOCK, HKV, 2 * D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
              for _ in range(LAYERS)]  # vLLM's GPU layout (NHD stride order)
    store = PagedPoolStore(caches, PACKED_LAYOUT, D, BLOCK, CHUNK)
    store.row = np.random.default_rng(0).permutation(args.blocks)[:256]  # a 4K-token pool, scattered blocks
    chunk_bytes = LAYERS * 2 * CHUNK * HKV * D * 2
    per_layer = PagedPoolStore(caches, PACKED_LAYOUT, D, BLOCK, CHUNK)
    per_layer.row, per_layer.mover = store.row, None
    assert store.mover is not None, "the one-launch mover did not engage on these caches"
    one_token = PagedPoolStore(caches, PACKED_LAYOUT, D, BLOCK, 1)  # write-through moves one token per step
    one_token.row = store.row
    host = store.read_host(3)
    assert torch.equal(host.to(dev), per_layer.read(3))
    store.synchronize()
    assert torch.equal(host.to(dev), store.read(3))
    pinned = torch.empty(chunk_bytes // 2, dtype=torch.bfloat16, pin_memory=True)
    flat = torch.empty_like(pinned, device=dev)
    t = {
        "page_out": timed(lambda: (store.read_host(5), store.synchronize()), args.reps),
        "page_out_compute_stream": timed(lambda: store.read(5), args.reps),
        "page_in": timed(lambda: store.write(7, host), args.reps),
        "move": timed(lambda: store.rearrange([(9, 11)], []), args.reps),
        "page_out_per_layer": timed(lambda: (per_layer.read_host(5), per_layer.synchronize()), args.reps),
        "page_out_compute_stream_per_layer": timed(lambda: per_layer.read(5), args.reps),
        "page_in_per_layer": timed(lambda: per_layer.write(7, host), args.reps),
        "move_per_layer": timed(lambda: per_layer.rearrange([(9, 11)], []), args.reps),
        "write_through_64_tokens": timed(
            lambda: ([one_token.read_host(p) for p in range(320, 384)], one_token.synchronize()), args.reps),
        "write_through_64_tokens_compute_stream": timed(
            lambda: [one_token.read(p) for p in range(320, 384)], args.reps),
        "pinned_d2h": timed(lambda: pinned.copy_(flat), args.reps),
        "pinned_h2d": timed(lambda: flat.copy_(pinned, non_blocking=True), args.reps),
    }
    store.synchronize()
    store.write(7, host)
    assert torch.equal(store.read(7), store.read(3))  # page-in lands bit-exact
    gbps = {k: round(chunk_bytes / (v * 1e-3) / 1e9, 2) for k, v in t.items()}
    result = {**device_info(),
              "chunk_mb": round(chunk_bytes / 1e6, 2), "ms": {k: round(v, 4) for k, v in t.items()}, "GB_per_s": gbps,
              "page_out_vs_pinned_d2h": round(gbps["page_out"] / gbps["pinned_d2h"], 3),
              "page_in_vs_pinned_h2d": round(gbps["page_in"] / gbps["pinned_h2d"], 3),
              "write_through_vs_page_out": round(t["write_through_64_tokens"] / t["page_out"], 2),
              "one_launch_speedup": {k: round(t[f"{k}_per_layer"] / t[k], 2)
                                     for k in ("page_out", "page_out_compute_stream", "page_in", "move")}}
    return report(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
