"""vLLM's bf16 CPU paths against the float32 replacements of the test environment's plugin (testenv/luce_cpu_speedups:
bf16_linear, gdn_prefill_conv, gdn_chunk, dflash_context_kv; not part of vllm-luce) on a CPU without bf16 dot
products, the two of each pair timed one after the other in the same run.

    python -m benchmarks.cpu_bf16_fallbacks [--repeats 5]

Shapes are the trained Qwen3.6 test model's (hidden 256, MLP 512, vocabulary 4096, GDN 2 heads of 128, conv
width 4 over 768 channels; its DFlash drafter's 2 layers of 2 K/V heads of 64) and one 4096-wide layer.
Prints median ms and vLLM / ours (above 1: ours is faster).
Then end to end: 16 prompts of about 220 tokens and 40 greedy tokens through an in-process ``LLM`` on the
trained target, in two child processes one after the other: vllm-luce alone (``VLLM_PLUGINS=luce``), then with
the test environment's plugin too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

import torch


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def pairs(repeats: int) -> list[tuple[str, float, float]]:
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_fn_cpu

    from luce_cpu_speedups import bf16_linear, gdn_chunk

    g = torch.Generator().manual_seed(0)
    rows = []
    for m, k, n in ((1, 256, 512), (16, 256, 512), (16, 256, 4096), (320, 256, 1024), (16, 4096, 4096)):
        x, w = torch.randn(m, k, generator=g).bfloat16(), torch.randn(n, k, generator=g).bfloat16()
        ours = bf16_linear.float32_linear(w, None)
        rows.append((f"linear {m} x {k} x {n}", median_ms(lambda: torch.nn.functional.linear(x, w), repeats),
                     median_ms(lambda: ours(x, w, None), repeats)))

    lens, dim = [220] * 16, 768
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    x = torch.randn(sum(lens), dim, generator=g).bfloat16().transpose(0, 1)
    weight, bias = torch.randn(dim, 4, generator=g).bfloat16(), torch.randn(dim, generator=g).bfloat16()
    states = torch.zeros(16, dim, 3, dtype=torch.bfloat16)
    slots, initial = torch.arange(16, dtype=torch.int32), torch.zeros(16, dtype=torch.bool)

    def conv(w, b):
        return lambda: causal_conv1d_fn_cpu(x, w, b, states, qsl, slots, initial, "silu", -1)

    rows.append(("GDN prefill conv, 16 x 220 tokens", median_ms(conv(weight, bias), repeats),
                 median_ms(conv(weight.float(), bias.float()), repeats)))

    t, h, d = sum(lens), 2, 128
    q, kk, v = (torch.randn(1, t, h, d, generator=g).bfloat16() for _ in range(3))
    decay, beta = -torch.rand(1, t, h, generator=g) * 0.5, torch.rand(1, t, h, generator=g).bfloat16()
    state = torch.zeros(16, h, d, d, dtype=torch.bfloat16)
    args = (q, kk, v, decay, beta, state, True, qsl, False, True, slots)
    original = getattr(ops.chunk_gated_delta_rule_cpu, "__wrapped__", ops.chunk_gated_delta_rule_cpu)
    rows.append(("chunked GDN prefill, 16 x 220 tokens", median_ms(lambda: original(*args), repeats),
                 median_ms(lambda: gdn_chunk.chunk_gated_delta_rule(*args), repeats)))
    rows.append(("DFlash context K/V, 320 tokens, 2 layers", *context_kv(repeats, g)))
    return rows


def context_kv(repeats: int, g: torch.Generator, tokens: int = 320, layers: int = 2, kv_heads: int = 2,
               head_dim: int = 64, hidden: int = 256) -> tuple[float, float]:
    """vLLM's ``_project_context_kv`` over its fused bf16 weight, then over the patch's per-layer float32 copies."""
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    from luce_cpu_speedups.dflash_context_kv import float32_projections

    weight = torch.randn(layers * 2 * kv_heads * head_dim, hidden, generator=g).bfloat16()
    common = {"_hidden_norm_weight": torch.ones(hidden).bfloat16(), "_rms_norm_eps": 1e-6, "_fused_kv_bias": None}
    fused = SimpleNamespace(_fused_kv_weight=weight, **common)
    ours = SimpleNamespace(_fused_kv_weight=None, _context_qkv_projs=float32_projections(weight, None, layers),
                           _context_q_sizes=[0] * layers, **common)
    x = torch.randn(tokens, hidden, generator=g).bfloat16()

    def project(model):
        return lambda: DFlashQwen3Model._project_context_kv(model, x, tokens, layers, kv_heads, head_dim)

    return median_ms(project(fused), repeats), median_ms(project(ours), repeats)


END_TO_END = """
import os, sys, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
from fixtures.trained import trained_model
llm = LLM(str(trained_model("qwen36-target")), tokenizer=str(trained_model("tokenizer")), dtype="bfloat16",
          max_model_len=4096, enforce_eager=True)
prompts = ["def foo(x):\\n    return" * 20] * 16
llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0))
start = time.perf_counter()
llm.generate(prompts, SamplingParams(max_tokens=40, temperature=0))
print("SECONDS", time.perf_counter() - start)
"""


def end_to_end(which: str) -> float:
    path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("VLLM_PLUGINS", None)
    if which == "vllm":  # vllm-luce alone, without the test environment's speed-ups
        env["VLLM_PLUGINS"] = "luce"
    run = subprocess.run([sys.executable, "-c", END_TO_END], capture_output=True, text=True, env=env)
    if run.returncode:
        raise RuntimeError(f"the {which} engine failed:\n{run.stderr[-3000:]}")
    return float(next(line for line in run.stdout.splitlines() if line.startswith("SECONDS")).split()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from luce_cpu_speedups.isa import native_bf16

    print(f"CPU with native bf16: {native_bf16()} (the float32 patches apply only where this is False)")
    print(f"{'op':40} {'vLLM ms':>10} {'ours ms':>10} {'vLLM/ours':>10}")
    for name, theirs, ours in pairs(args.repeats):
        print(f"{name:40} {theirs:10.3f} {ours:10.3f} {theirs / ours:10.2f}")
    theirs, ours = end_to_end("vllm"), end_to_end("ours")
    print(f"{'end to end: 16 x 220 prompt, 40 tokens (s)':40} {theirs:10.2f} {ours:10.2f} {theirs / ours:10.2f}")


if __name__ == "__main__":
    main()
