"""GPU: latency of one DFlash drafting step against one target decode step's weight-read floor.

    python3 benchmarks/dflash_drafter_latency.py --json dflash_drafter_latency.json

The drafter is Qwen3-8B-DFlash shaped: 5 layers, hidden 4096, 32/8 heads of 128, MLP 12288,
block 16, 5 target taps. One drafting step, as vLLM runs it with the context K/V cached:
* the context pass of the newly committed tokens: ``fc``, ``hidden_norm`` and each layer's K/V
  projection, for ``--new-tokens`` tokens;
* the 16-slot block through 5 layers, attending to the cached context of length L plus the block
  (RoPE left out: elementwise, a few microseconds);
* the final norm and the target's lm_head (vocabulary 151,936) on the 15 drafted slots.

The floor of a target decode step is reading the target's weights once: Qwen3-8B in bf16,
8.19 B parameters (16.4 GB), over the device's measured copy bandwidth. Speculation pays when
drafting plus verifying 16 tokens costs less than the decode steps the accepted tokens replace,
so ``drafter / floor`` is the share of one decode step a draft costs.

Measured three ways in one run: eager with flash/efficient SDPA (``drafter_ms``), the same step
replayed as a CUDA graph (``graphed_ms``, launch overhead removed as vLLM does), and the baseline
eager step with PyTorch's math attention (``sdpa_math_ms``).
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

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB, BLOCK, TAPS = 4096, 5, 32, 8, 128, 12288, 151_936, 16, 5
TARGET_PARAMS = 8.19e9  # Qwen3-8B


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, 1e-6)


class Drafter:
    def __init__(self, device, dtype):
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, device=device, generator=g, dtype=torch.float32) * 0.02).to(dtype)

        self.fc = w(HIDDEN, TAPS * HIDDEN)
        self.norm_w = torch.ones(HIDDEN, device=device, dtype=dtype)
        self.layers = [dict(q=w(HEADS * HEAD_DIM, HIDDEN), kv=w(2 * KV_HEADS * HEAD_DIM, HIDDEN),
                            o=w(HIDDEN, HEADS * HEAD_DIM), gate_up=w(2 * MLP, HIDDEN), down=w(HIDDEN, MLP),
                            n1=self.norm_w, n2=self.norm_w, qn=torch.ones(HEAD_DIM, device=device, dtype=dtype),
                            kn=torch.ones(HEAD_DIM, device=device, dtype=dtype)) for _ in range(LAYERS)]
        self.lm_head = w(VOCAB, HIDDEN)

    def context_pass(self, features: torch.Tensor) -> list[torch.Tensor]:
        ctx = rms(features @ self.fc.T, self.norm_w)
        return [ctx @ layer["kv"].T for layer in self.layers]  # cache writes are copies of these

    def block_pass(self, block: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]], math: bool):
        h = block
        for layer, (k_cache, v_cache) in zip(self.layers, caches):
            x = rms(h, layer["n1"])
            q = rms((x @ layer["q"].T).view(BLOCK, HEADS, HEAD_DIM), layer["qn"]).transpose(0, 1)
            kv = (x @ layer["kv"].T).view(BLOCK, 2, KV_HEADS, HEAD_DIM)
            k_cache[:, -BLOCK:] = rms(kv[:, 0], layer["kn"]).transpose(0, 1)  # the block's slots in the cache
            v_cache[:, -BLOCK:] = kv[:, 1].transpose(0, 1)
            k, v = k_cache, v_cache
            backend = [torch.nn.attention.SDPBackend.MATH] if math else [
                torch.nn.attention.SDPBackend.FLASH_ATTENTION, torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION]
            with torch.nn.attention.sdpa_kernel(backend):
                a = F.scaled_dot_product_attention(q[None], k[None], v[None], enable_gqa=True)[0]
            h = h + a.transpose(0, 1).reshape(BLOCK, HEADS * HEAD_DIM) @ layer["o"].T
            gu = rms(h, layer["n2"]) @ layer["gate_up"].T
            h = h + (F.silu(gu[:, :MLP]) * gu[:, MLP:]) @ layer["down"].T
        return (rms(h[1:], self.norm_w) @ self.lm_head.T).argmax(-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192, 16384, 32768])
    ap.add_argument("--new-tokens", type=int, default=4, help="committed tokens per step entering the context")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    drafter = Drafter(device, dtype)
    bw = copy_bandwidth()
    floor_ms = TARGET_PARAMS * 2 / bw * 1e3
    rows = []
    features = torch.randn(args.new_tokens, TAPS * HIDDEN, device=device, dtype=dtype)
    block = torch.randn(BLOCK, HIDDEN, device=device, dtype=dtype)
    for L in args.contexts:
        caches = [(torch.randn(KV_HEADS, L + BLOCK, HEAD_DIM, device=device, dtype=dtype),
                   torch.randn(KV_HEADS, L + BLOCK, HEAD_DIM, device=device, dtype=dtype)) for _ in range(LAYERS)]

        def step(math=False):
            drafter.context_pass(features)
            return drafter.block_pass(block, caches, math)

        fast = timed(step, args.reps)
        math = timed(lambda: step(True), max(5, args.reps // 5))
        graph = torch.cuda.CUDAGraph()  # launch overhead removed, as vLLM's CUDA graphs do
        step()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            step()
        graphed = timed(graph.replay, args.reps)
        rows.append({"context": L, "drafter_ms": round(fast, 4), "graphed_ms": round(graphed, 4),
                     "sdpa_math_ms": round(math, 4), "speedup_vs_math": round(math / fast, 2),
                     "floor_ms": round(floor_ms, 4), "drafter_over_floor": round(fast / floor_ms, 3),
                     "graphed_over_floor": round(graphed / floor_ms, 3)})
        print(json.dumps(rows[-1]), flush=True)
    result = {**device_info(), "copy_bandwidth_GBps": round(bw / 1e9),
              "target_decode_floor_ms": round(floor_ms, 4), "new_tokens": args.new_tokens, "rows": rows,
              "shape": {"hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS, "mlp": MLP,
                        "vocab": VOCAB, "block": BLOCK, "taps": TAPS}}
    return report(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
