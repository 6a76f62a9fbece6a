"""GPU: PFlash time to first token, one run: the drafter's scoring pass (block-sparse vs dense SDPA)
and a Qwen3-8B-shaped target's prefill of the kept tokens vs of the whole prompt.

    python3 benchmarks/pflash_scoring.py --tokens 16384 65536 131072 --json pflash_scoring.json

* Drafter: Qwen3-0.6B shape (28 layers, hidden 1024, 16 q / 8 kv heads, head dim 128, MLP 3072),
  random bf16 weights, run by vllm_luce's DrafterScorer (Triton tail_score on every layer):
  ``dense`` = PyTorch SDPA causal attention (flash), ``sparse_a<alpha>`` = the block-sparse Triton
  kernel at threshold alpha (0.12 is Lucebox's default), ``*_ee7`` = early exit after 7 layers.
  The kept block density (layer 0) is reported: random weights give diffuse attention, so alpha 0.12
  keeps every block; the higher thresholds show the kernel's time at lower densities.
* Target: one Qwen3-8B-shaped layer (hidden 4096, 32 q / 8 kv heads, head dim 128, MLP 12288)
  prefilled at S and at keep * S tokens (QKV, flash causal SDPA, O, MLP in 8K-token chunks),
  times 36 layers. Time to first token = scoring + selection (measured here on the host) +
  compressed prefill; the baseline is the full prefill. Goal: >= 5x at 64K with keep 0.05.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script path
from benchmarks import report  # noqa: E402
from benchmarks.gpu_timing import device_info, timed  # noqa: E402
from vllm_luce.pflash.drafter_spec import DrafterSpec  # noqa: E402
from vllm_luce.pflash.scorer import DrafterScorer, ScoringConfig  # noqa: E402
from vllm_luce.pflash.selection import SelectionConfig, select  # noqa: E402

QWEN3_06B = dict(architecture="Qwen3ForCausalLM", vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16,
                 num_kv_heads=8, head_dim=128, intermediate_size=3072, rope_theta=1e6, rms_eps=1e-6, qk_norm=True,
                 qkv_bias=False)
TARGET = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=12288, layers=36)


class RandomDrafter(DrafterScorer):
    """DrafterScorer with random weights of the checkpoint's shapes instead of a file."""

    def _load(self, names):
        g = torch.Generator(device=self.device).manual_seed(0)
        out = {}
        for name, shape in names.items():
            if name.endswith("norm.weight"):
                out[name] = torch.ones(shape, device=self.device, dtype=self.dtype)
            else:
                out[name] = (torch.randn(shape, device=self.device, generator=g) * 0.02).to(self.dtype)
        return out


def drafter(cfg: ScoringConfig) -> RandomDrafter:
    spec = DrafterSpec(path=Path("random"), tensors={}, **QWEN3_06B)
    return RandomDrafter(spec, "cuda", torch.bfloat16, cfg)


def sparse_density(scorer: RandomDrafter, ids: torch.Tensor) -> float:
    """Kept block fraction of layer 0's block-sparse attention on this prompt."""
    from vllm_luce.kernels.block_sparse_attention import block_sparse_attention

    captured = {}
    original = scorer._attention

    def capture(q, k, v):
        out, captured["density"] = block_sparse_attention(q, k, v, block_size=scorer.cfg.sparse_block,
                                                          alpha=scorer.cfg.sparse_alpha, return_density=True)
        return out

    scorer._attention = capture
    scorer.num_layers, layers = 2, scorer.num_layers
    try:
        scorer.token_scores(ids)
    finally:
        scorer._attention, scorer.num_layers = original, layers
    return float(captured["density"])


def target_layer_ms(tokens: int) -> float:
    t = TARGET
    g = torch.Generator(device="cuda").manual_seed(1)

    def w(*shape):
        return (torch.randn(*shape, device="cuda", generator=g) * 0.02).to(torch.bfloat16)

    wqkv, wo = w((t["heads"] + 2 * t["kv_heads"]) * t["head_dim"], t["hidden"]), w(t["hidden"], t["heads"] * t["head_dim"])
    wgu, wd = w(2 * t["mlp"], t["hidden"]), w(t["hidden"], t["mlp"])
    h = torch.randn(tokens, t["hidden"], device="cuda", dtype=torch.bfloat16, generator=g)
    D, Hq, Hkv = t["head_dim"], t["heads"], t["kv_heads"]

    def layer():
        qkv = F.linear(h, wqkv)
        q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
        q = q.view(tokens, Hq, D).transpose(0, 1)[None]
        k = k.view(tokens, Hkv, D).transpose(0, 1)[None]
        v = v.view(tokens, Hkv, D).transpose(0, 1)[None]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = h + F.linear(a[0].transpose(0, 1).reshape(tokens, Hq * D), wo)
        for s in range(0, tokens, 8192):
            gu = F.linear(x[s:s + 8192], wgu)
            gate, up = gu.chunk(2, dim=-1)
            x[s:s + 8192] += F.linear(F.silu(gate) * up, wd)
        return x

    return timed(layer, reps=3, warmup=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536, 131072])
    ap.add_argument("--keep", type=float, default=0.05)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.12, 0.9, 0.97, 1.0],
                    help="block-sparse thresholds: random weights keep every block at Lucebox's 0.12, so "
                         "higher ones show the kernel's time at lower kept densities")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = [device_info()]
    variants = {"dense": ScoringConfig(attention="dense"), "dense_ee7": ScoringConfig(attention="dense", early_exit_layers=7)}
    for alpha in args.alphas:
        variants[f"sparse_a{alpha}"] = ScoringConfig(attention="sparse", sparse_alpha=alpha)
    variants[f"sparse_a{args.alphas[-1]}_ee7"] = ScoringConfig(attention="sparse", sparse_alpha=args.alphas[-1],
                                                              early_exit_layers=7)
    scorers = {name: drafter(cfg) for name, cfg in variants.items()}
    for S in args.tokens:
        ids = torch.randint(0, QWEN3_06B["vocab_size"], (S,), generator=torch.Generator().manual_seed(S))
        row = {"tokens": S, "keep": args.keep}
        for name, scorer in scorers.items():
            row[f"score_{name}_ms"] = round(timed(lambda: scorer.token_scores(ids), reps=2, warmup=1), 1)
        for name, scorer in scorers.items():
            if name.startswith("sparse") and not name.endswith("ee7"):
                row[f"density_{name}"] = round(sparse_density(scorer, ids), 3)
        scores = scorers["dense"].token_scores(ids)
        t0 = time.perf_counter()
        kept = select(scores, ids, SelectionConfig(keep_ratio=args.keep)).kept_tokens
        row["select_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        row["kept_tokens"] = kept
        row["target_full_ms"] = round(target_layer_ms(S) * TARGET["layers"], 1)
        row["target_kept_ms"] = round(target_layer_ms(kept) * TARGET["layers"], 1)
        for name in variants:
            ttft = row[f"score_{name}_ms"] + row["select_ms"] + row["target_kept_ms"]
            row[f"ttft_{name}_ms"] = round(ttft, 1)
            row[f"speedup_{name}"] = round(row["target_full_ms"] / ttft, 2)
        print(row, flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    return report(rows, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
