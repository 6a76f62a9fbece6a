"""Benchmark of the chunk_mean Triton kernel on a CUDA GPU.

Times, for KVFlash/PFlash-like shapes (8 KV heads, head_dim 128 and 256, bf16 keys, 64-token
chunks, 4K to 1M tokens in a few uneven sequences):
  naive   the plain PyTorch reference (vllm_luce.kernels.chunk_mean.naive, a loop over sequences)
  torch   a vectorised PyTorch baseline: index_add_ segment sum over all tokens, divided by counts
  triton  the full chunk_mean call (host-side chunk table, one sync, kernel launch)
  kernel  the Triton kernel alone, with its chunk table built beforehand
Speedups are against `torch`, measured in the same run; bandwidth is key bytes read / time.

Run from the repository root:  python benchmarks/kernels/chunk_mean_bench.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from vllm_luce.kernels._triton import is_interpreter  # noqa: E402
from vllm_luce.kernels.chunk_mean import chunk_mean, chunk_mean_naive  # noqa: E402
from vllm_luce.kernels.chunk_mean.chunk_mean import (  # noqa: E402
    _MAX_BLOCK_D, _chunk_mean_kernel, _chunk_table)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Uneven split of the tokens over sequences, none a multiple of the chunk size.
SEQ_FRACTIONS = (0.55, 0.3, 0.15)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 32768, 262144, 1048576])
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--rep-ms", type=int, default=200, help="do_bench repetition time per case")
    return parser.parse_args()


def seq_lengths(total_tokens: int) -> list[int]:
    lengths = [max(1, int(total_tokens * f)) - 3 for f in SEQ_FRACTIONS[:-1]]
    return lengths + [total_tokens - sum(lengths)]


def chunk_mean_index_add(keys: torch.Tensor, cu_seqlens: torch.Tensor, chunk_size: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised PyTorch baseline: every token's chunk id, then one index_add_ and a division."""
    total_tokens, num_heads, head_dim = keys.shape
    seq_lens = cu_seqlens[1:] - cu_seqlens[:-1]
    chunks_per_seq = (seq_lens + chunk_size - 1) // chunk_size
    cu_chunks = torch.nn.functional.pad(chunks_per_seq.cumsum(0), (1, 0))
    total_chunks = int(cu_chunks[-1])
    seq_of_token = torch.repeat_interleave(seq_lens, output_size=total_tokens)
    token_in_seq = torch.arange(total_tokens, device=keys.device) - cu_seqlens[seq_of_token]
    chunk_of_token = cu_chunks[seq_of_token] + token_in_seq // chunk_size
    sums = keys.new_zeros(total_chunks, num_heads, head_dim, dtype=torch.float32)
    sums.index_add_(0, chunk_of_token, keys.float())
    counts = torch.bincount(chunk_of_token, minlength=total_chunks).to(torch.float32)
    return sums / counts[:, None, None], cu_chunks


def kernel_only(keys: torch.Tensor, cu_seqlens: torch.Tensor, chunk_size: int):
    """The Triton launch alone: the chunk table and the output are built once, outside the timing."""
    num_heads, head_dim = keys.shape[1:]
    _, chunk_table, total_chunks = _chunk_table(cu_seqlens, chunk_size, keys.shape[0])
    out = torch.empty(total_chunks, num_heads, head_dim, dtype=torch.float32, device=keys.device)
    block_d = min(triton.next_power_of_2(head_dim), _MAX_BLOCK_D)
    grid = (total_chunks, num_heads, triton.cdiv(head_dim, block_d))

    def launch():
        _chunk_mean_kernel[grid](keys, out, chunk_table, *keys.stride(), *out.stride(),
                                 head_dim, chunk_size, BLOCK_D=block_d)

    return launch


def bench_ms(fn, rep_ms: int) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def run_case(num_heads: int, head_dim: int, total_tokens: int, chunk_size: int,
             dtype: torch.dtype, rep_ms: int) -> dict:
    lengths = seq_lengths(total_tokens)
    cu_seqlens = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    keys = torch.randn(total_tokens, num_heads, head_dim, device="cuda", dtype=dtype)
    cu64 = cu_seqlens.long()

    # Correctness first: all three implementations must agree before their timings mean anything.
    means, cu_chunks = chunk_mean(keys, cu_seqlens, chunk_size)
    baseline, baseline_cu = chunk_mean_index_add(keys, cu64, chunk_size)
    torch.testing.assert_close(means, baseline, rtol=1e-4, atol=1e-4)
    assert torch.equal(cu_chunks.long(), baseline_cu)
    del baseline

    times = {
        "naive": bench_ms(lambda: chunk_mean_naive(keys, cu_seqlens, chunk_size), rep_ms),
        "torch": bench_ms(lambda: chunk_mean_index_add(keys, cu64, chunk_size), rep_ms),
        "triton": bench_ms(lambda: chunk_mean(keys, cu_seqlens, chunk_size, out=means), rep_ms),
        "kernel": bench_ms(kernel_only(keys, cu64, chunk_size), rep_ms),
    }
    bytes_read = keys.numel() * keys.element_size()
    return {
        "num_heads": num_heads, "head_dim": head_dim, "total_tokens": total_tokens,
        "seq_lens": lengths, "chunk_size": chunk_size, "dtype": str(dtype).removeprefix("torch."),
        "total_chunks": int(cu_chunks[-1]), "bytes_read": bytes_read,
        "ms": times,
        "speedup_vs_torch": {name: times["torch"] / t for name, t in times.items()},
        "read_gb_per_s": {name: bytes_read / (t * 1e-3) / 1e9 for name, t in times.items()},
        "best_config": str(_chunk_mean_kernel.best_config),
    }


def print_table(rows: list[dict]) -> None:
    names = ("naive", "torch", "triton", "kernel")
    header = (f"{'head_dim':>8} {'tokens':>8} {'chunks':>7} | "
              + " ".join(f"{n + ' ms':>10}" for n in names) + " | "
              + " ".join(f"{n + ' x':>9}" for n in names) + " | "
              + " ".join(f"{n + ' GB/s':>12}" for n in ("triton", "kernel")))
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['head_dim']:>8} {r['total_tokens']:>8} {r['total_chunks']:>7} | "
              + " ".join(f"{r['ms'][n]:>10.4f}" for n in names) + " | "
              + " ".join(f"{r['speedup_vs_torch'][n]:>9.2f}" for n in names) + " | "
              + " ".join(f"{r['read_gb_per_s'][n]:>12.1f}" for n in ("triton", "kernel")))
    print("x = speedup against the torch (index_add_) baseline of the same run; "
          "GB/s = key bytes read / time")


def main() -> None:
    args = parse_args()
    if is_interpreter():
        sys.exit("chunk_mean_bench: TRITON_INTERPRET is set; unset it, interpreter timings mean nothing")
    if not torch.cuda.is_available():
        sys.exit("chunk_mean_bench: no CUDA GPU available; this benchmark times GPU kernels only "
                 "(the CPU tests are: TRITON_INTERPRET=1 python -m pytest tests/kernels)")
    dtype = DTYPES[args.dtype]
    rows = []
    for head_dim in args.head_dims:
        for total_tokens in args.tokens:
            rows.append(run_case(args.num_heads, head_dim, total_tokens, args.chunk_size, dtype,
                                 args.rep_ms))
            torch.cuda.empty_cache()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print_table(rows)
    if args.out:
        report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "triton": triton.__version__,
                  "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "results": rows}
        args.out.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
