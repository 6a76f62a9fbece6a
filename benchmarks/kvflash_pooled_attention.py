"""GPU: KVFlash pooled decode attention vs PyTorch SDPA over the full context, one run.

    python3 benchmarks/kvflash_pooled_attention.py --json kvflash_pooled_attention.json

Layer: Qwen3-8B shaped (32 query heads, 8 KV heads, head dim 128), bf16, one decode token per
request. For each context L and batch B:
* ``sdpa_full``: ``scaled_dot_product_attention`` (flash) of the token over all L keys, contiguous;
* ``pooled``: ``pooled_attention`` over a 4K-token pool (64 chunks of 64) in shuffled slots;
* ``pooled_full``: the same kernel with the pool covering the whole context (the 1.25x goal at 32K).
Bandwidth is the bytes the kernel must read (K and V of the visible slots) over its time, compared
with the device's measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script path
from benchmarks import report  # noqa: E402
from benchmarks.gpu_timing import copy_bandwidth, device_info, timed  # noqa: E402
from vllm_luce.kernels.pooled_attention import pooled_attention  # noqa: E402

HQ, HKV, D, CHUNK = 32, 8, 128, 64


def pooled_case(B: int, tokens: int, context: int, g: torch.Generator):
    """B requests each owning tokens/CHUNK shuffled slots of one pool; chunks hold the last
    ``tokens`` positions of a ``context``-long sequence (sinks and selection do not change the cost)."""
    per = tokens // CHUNK
    k = torch.randn(B * per, CHUNK, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    slots = torch.randperm(B * per, device="cuda", generator=g).view(B, per).to(torch.int32)
    pos = (context - tokens + torch.arange(per, device="cuda") * CHUNK).repeat(B, 1).to(torch.int32)
    lens = torch.full((B,), context, device="cuda", dtype=torch.int32)
    return k, v, slots, pos, lens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072, 262144])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--pool", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    bw = copy_bandwidth()
    rows = []
    for L in args.contexts:
        for B in args.batches:
            q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
            kf = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
            vf = torch.randn_like(kf)
            sdpa = timed(lambda: F.scaled_dot_product_attention(q[:, :, None], kf, vf, enable_gqa=True), args.reps)
            del kf, vf
            k, v, slots, pos, lens = pooled_case(B, args.pool, L, g)
            out = torch.empty(B, HQ, D, device="cuda", dtype=torch.float32)
            pooled = timed(lambda: pooled_attention(q, k, v, slots, pos, lens, D ** -0.5, out=out), args.reps)
            row = {"context": L, "batch": B, "sdpa_full_ms": round(sdpa, 4), "pooled_ms": round(pooled, 4),
                   "pooled_vs_sdpa": round(pooled / sdpa, 3),
                   "pooled_GBps": round(2 * B * args.pool * HKV * D * 2 / (pooled / 1e3) / 1e9),
                   "pooled_bw_fraction": round(2 * B * args.pool * HKV * D * 2 / (pooled / 1e3) / bw, 3)}
            del k, v
            if L <= 32768:
                k, v, slots, pos, lens = pooled_case(B, L, L, g)
                full = timed(lambda: pooled_attention(q, k, v, slots, pos, lens, D ** -0.5, out=out), args.reps)
                row.update(pooled_full_ms=round(full, 4), pooled_full_vs_sdpa=round(full / sdpa, 3),
                           pooled_full_bw_fraction=round(2 * B * L * HKV * D * 2 / (full / 1e3) / bw, 3))
                del k, v
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    result = {**device_info(), "copy_bandwidth_GBps": round(bw / 1e9), "pool_tokens": args.pool, "rows": rows}
    return report(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
